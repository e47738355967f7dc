// In-place registration in a build without CUDA (cuda_export.h): device pointers are refused.
#include "absl/strings/str_cat.h"
#include "client/cuda_export.h"

namespace refit::client {

absl::StatusOr<InPlaceExport> ExportInPlace(const std::vector<DevicePtrParam>& params, DeviceEnv&) {
  return absl::UnimplementedError(absl::StrCat("parameter '", params.empty() ? "" : params[0].name,
                                               "' is CUDA memory, but this library was built without CUDA"));
}

absl::StatusOr<VmmExport> ExportVmmAllocation(const std::string& name, const void*, DeviceEnv&) {
  return absl::UnimplementedError(
      absl::StrCat("parameter '", name, "' is CUDA memory, but this library was built without CUDA"));
}

std::vector<std::string> AuditInPlace(const std::vector<InPlaceRecord>&, DeviceEnv&) { return {}; }

}  // namespace refit::client
