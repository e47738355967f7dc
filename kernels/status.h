// Turns a CUDA runtime error code (an int, so callers need no CUDA headers) into absl::Status:
// common/cuda_status.h, the one helper for the whole project. Thread-safe: pure function.
#ifndef REFIT_KERNELS_STATUS_H_
#define REFIT_KERNELS_STATUS_H_

#include <string_view>

#include "absl/status/status.h"
#include "common/cuda_status.h"
#include "formats/message.h"
#include "kernels/launch.h"

namespace refit::kernels {

using formats::Msg;

// The project's one CUDA-error helper (common/cuda_status.h), under the name kernels/ uses.
using ::refit::CudaStatus;

}  // namespace refit::kernels

#endif  // REFIT_KERNELS_STATUS_H_
