// The CUDA half of memory.h in builds without CUDA: host memory only; no device memory, no pinned
// memory (plain host memory instead), no device checksum.
#include <cstring>
#include <memory>

#include "absl/status/status.h"
#include "common/parallel_copy.h"
#include "storage/memory.h"
#include "storage/memory_device.h"

namespace refit::storage {

absl::Status CopyAnyToHost(void* dst, const void* src, uint64_t bytes) {
  ParallelCopy(dst, src, bytes);  // a trainer packing host tensors into its bucket
  return absl::OkStatus();
}

std::unique_ptr<Memory> NewPinnedHostMemory() { return NewHostMemory(); }

absl::StatusOr<std::unique_ptr<Memory>> NewDeviceMemory(int) {
  return absl::UnavailableError("refitd was built without CUDA: no device staging");
}

absl::StatusOr<uint64_t> DeviceChecksum64(int, const void*, uint64_t, void*, DeviceAllocation&) {
  return absl::UnimplementedError("this build has no CUDA: no device checksum");
}

}  // namespace refit::storage
