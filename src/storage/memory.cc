#include "storage/memory.h"

#include <cstring>
#include <new>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace refit::storage {

#if REFIT_HAVE_CUDA
// cuda_memory.cc: a device source is copied by the CUDA runtime, a host one with memcpy.
absl::Status CopyAnyToHost(void* dst, const void* src, uint64_t bytes);
#else
absl::Status CopyAnyToHost(void* dst, const void* src, uint64_t bytes) {
  std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}
#endif

namespace {

class HostMemory final : public Memory {
 public:
  MemoryKind kind() const override { return MemoryKind::kHost; }
  absl::StatusOr<std::shared_ptr<uint8_t>> Allocate(uint64_t bytes) override {
    uint8_t* p = new (std::nothrow) uint8_t[bytes == 0 ? 1 : bytes];
    if (p == nullptr) return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " host bytes"));
    return std::shared_ptr<uint8_t>(p, std::default_delete<uint8_t[]>());
  }
  absl::Status CopyWithin(void* dst, const void* src, uint64_t bytes) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyToHost(void* dst, const void* src, uint64_t bytes) override { return CopyWithin(dst, src, bytes); }
  absl::Status CopyFromHost(void* dst, const void* src, uint64_t bytes) override { return CopyWithin(dst, src, bytes); }
  absl::Status CopyInAsync(void* dst, const void* src, uint64_t bytes) override { return CopyAnyToHost(dst, src, bytes); }
  absl::Status Synchronize() override { return absl::OkStatus(); }
};

}  // namespace

std::unique_ptr<Memory> NewHostMemory() { return std::make_unique<HostMemory>(); }

#if !REFIT_HAVE_CUDA
std::unique_ptr<Memory> NewPinnedHostMemory() { return NewHostMemory(); }
absl::StatusOr<std::unique_ptr<Memory>> NewDeviceMemory(int device) {
  return absl::UnavailableError("refitd was built without CUDA: no device staging");
}
absl::Status CheckDeviceMemory(const void*) {
  return absl::UnimplementedError("this client was built without CUDA and sends host memory only");
}
absl::StatusOr<int> CurrentDevice() { return absl::UnavailableError("this build has no CUDA: no CUDA device"); }
absl::StatusOr<uint64_t> DeviceChecksum64(int, const void*, uint64_t, void*, DeviceAllocation&) {
  return absl::UnimplementedError("this build has no CUDA: no device checksum");
}
#endif

}  // namespace refit::storage
