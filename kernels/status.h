// Turns a CUDA runtime error code (an int, so callers need no CUDA headers) into absl::Status.
// Thread-safe: pure function.
#ifndef REFIT_KERNELS_STATUS_H_
#define REFIT_KERNELS_STATUS_H_

#include <string_view>

#include "absl/status/status.h"
#include "formats/message.h"
#include "kernels/launch.h"

namespace refit::kernels {

using formats::Msg;

inline absl::Status CudaStatus(int code, std::string_view what) {
  if (code == 0) return absl::OkStatus();
  return absl::InternalError(Msg("CUDA error ", code, " (", launch::ErrorString(code), ") ", what));
}

}  // namespace refit::kernels

#endif  // REFIT_KERNELS_STATUS_H_
