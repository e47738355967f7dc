// The engine setup's CUDA half in builds without CUDA (engine_setup_device.h): GPU parameters are
// refused.
#include "absl/strings/str_cat.h"
#include "server/engine_setup_device.h"

namespace refit::server {

absl::StatusOr<std::unique_ptr<storage::EngineStorage>> OpenDeviceStorage(std::vector<storage::CudaIpcParam> params) {
  return absl::InvalidArgumentError(absl::StrCat("engine parameter '", params[0].info.name,
                                                 "' is in GPU memory, but this refitd was built without CUDA"));
}

absl::Status MakeDeviceStaging(EngineSetup&) {
  return absl::UnavailableError("refitd was built without CUDA: no device staging");
}

}  // namespace refit::server
