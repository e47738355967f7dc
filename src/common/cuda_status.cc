#include "common/cuda_status.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"

namespace refit {

absl::Status CudaStatus(int cuda_error, absl::string_view what) {
  if (cuda_error == 0) return absl::OkStatus();
  const auto e = static_cast<cudaError_t>(cuda_error);
  (void)cudaGetLastError();
  return absl::InternalError(
      absl::StrCat(what, ": CUDA error ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

}  // namespace refit
