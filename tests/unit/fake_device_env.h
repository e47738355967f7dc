// A DeviceEnv (common/device_env.h) whose answers a test sets: each query returns what its field
// holds, so a test makes one query fail (or answer oddly) and checks what the code under test does
// with it, without a GPU. Counts the queries it answers.
//
// Threading: set the answers before handing the env out; the queries may then come from any thread.
#ifndef REFIT_TESTS_UNIT_FAKE_DEVICE_ENV_H_
#define REFIT_TESTS_UNIT_FAKE_DEVICE_ENV_H_

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "common/device_env.h"

namespace refit::testing {

class FakeDeviceEnv final : public DeviceEnv {
 public:
  bool has_cuda() const override { return has_cuda_answer; }
  absl::StatusOr<PointerInfo> QueryPointer(const void*) override {
    ++pointer_queries;
    return pointer;
  }
  absl::StatusOr<AllocationInfo> QueryAllocation(const void*) override {
    ++allocation_queries;
    return allocation;
  }
  absl::StatusOr<AddressRange> QueryAddressRange(const void*) override {
    ++range_queries;
    return range;
  }
  uint64_t VmmMappedBytes(const void*, uint64_t, uint32_t) override { return vmm_mapped_bytes; }
  uint64_t MappedVmmHandle(const void*) override { return vmm_handle; }
  absl::StatusOr<int> CurrentDevice() override { return current_device; }

  bool has_cuda_answer = true;
  absl::StatusOr<PointerInfo> pointer = absl::UnimplementedError("FakeDeviceEnv: no pointer answer set");
  absl::StatusOr<AllocationInfo> allocation = absl::UnavailableError("FakeDeviceEnv: no allocation answer set");
  absl::StatusOr<AddressRange> range = absl::UnavailableError("FakeDeviceEnv: no address range answer set");
  uint64_t vmm_mapped_bytes = 0;
  uint64_t vmm_handle = 0;  // nonzero: every address is in this virtual-memory allocation
  absl::StatusOr<int> current_device = absl::UnavailableError("FakeDeviceEnv: no device");

  std::atomic<int> pointer_queries{0};
  std::atomic<int> allocation_queries{0};
  std::atomic<int> range_queries{0};
};

}  // namespace refit::testing

#endif  // REFIT_TESTS_UNIT_FAKE_DEVICE_ENV_H_
