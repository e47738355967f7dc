#include "storage/memory.h"

#include <cstring>
#include <new>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/device_env.h"
#include "storage/memory_device.h"

namespace refit::storage {
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

absl::Status CheckDeviceMemory(const void* p) {
  DeviceEnv& env = DefaultDeviceEnv();
  if (!env.has_cuda()) return absl::UnimplementedError("this client was built without CUDA and sends host memory only");
  absl::StatusOr<PointerInfo> info = env.QueryPointer(p);
  if (!info.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("not CUDA device memory (", info.status().message(), ")"));
  }
  if (info->memory != PointerMemory::kDevice) return absl::InvalidArgumentError("not CUDA device memory");
  return absl::OkStatus();
}

absl::StatusOr<int> CurrentDevice() { return DefaultDeviceEnv().CurrentDevice(); }

}  // namespace refit::storage
