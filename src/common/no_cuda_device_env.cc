// The DeviceEnv of a build without CUDA (device_env.h): every query says there is no CUDA.
#include <memory>

#include "absl/status/status.h"
#include "common/device_env.h"

namespace refit {
namespace {

class NoCudaDeviceEnv final : public DeviceEnv {
 public:
  bool has_cuda() const override { return false; }
  absl::StatusOr<PointerInfo> QueryPointer(const void*) override {
    return absl::UnimplementedError("this build has no CUDA: cannot query a pointer's memory");
  }
  absl::StatusOr<AllocationInfo> QueryAllocation(const void*) override {
    return absl::UnavailableError("this build has no CUDA: cannot query a pointer's allocation");
  }
  absl::StatusOr<AddressRange> QueryAddressRange(const void*) override {
    return absl::UnavailableError("this build has no CUDA: cannot query an allocation's address range");
  }
  uint64_t VmmMappedBytes(const void*, uint64_t, uint32_t) override { return 0; }
  uint64_t MappedVmmHandle(const void*) override { return 0; }
  absl::StatusOr<int> CurrentDevice() override {
    return absl::UnavailableError("this build has no CUDA: no CUDA device");
  }
};

}  // namespace

std::unique_ptr<DeviceEnv> NewNoCudaDeviceEnv() { return std::make_unique<NoCudaDeviceEnv>(); }

}  // namespace refit
