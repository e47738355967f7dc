// The DeviceEnv seam (common/device_env.h): the no-CUDA env's answers, in every build, and the
// build's default env on host memory (with or without a GPU: its answers may only differ in
// whether the query itself could run).
#include "common/device_env.h"

#include <memory>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace refit {
namespace {

using ::testing::HasSubstr;

TEST(NoCudaDeviceEnvTest, SaysThereIsNoCudaToEveryQuery) {
  std::unique_ptr<DeviceEnv> env = NewNoCudaDeviceEnv();
  int host = 0;
  EXPECT_FALSE(env->has_cuda());

  absl::StatusOr<PointerInfo> pointer = env->QueryPointer(&host);
  EXPECT_EQ(pointer.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(pointer.status().message(), HasSubstr("no CUDA"));

  absl::StatusOr<AllocationInfo> allocation = env->QueryAllocation(&host);
  EXPECT_EQ(allocation.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(allocation.status().message(), HasSubstr("no CUDA"));

  absl::StatusOr<AddressRange> range = env->QueryAddressRange(&host);
  EXPECT_EQ(range.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(range.status().message(), HasSubstr("no CUDA"));

  EXPECT_EQ(env->VmmMappedBytes(&host, 1 << 20, 64), 0u);
  EXPECT_EQ(env->MappedVmmHandle(&host), 0u);

  absl::StatusOr<int> device = env->CurrentDevice();
  EXPECT_EQ(device.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(device.status().message(), HasSubstr("no CUDA device"));
}

TEST(DefaultDeviceEnvTest, IsTheBuildsAndOneInstance) {
#if REFIT_HAVE_CUDA
  EXPECT_TRUE(DefaultDeviceEnv().has_cuda());
#else
  EXPECT_FALSE(DefaultDeviceEnv().has_cuda());
#endif
  EXPECT_EQ(&DefaultDeviceEnv(), &DefaultDeviceEnv());
}

TEST(DefaultDeviceEnvTest, HostMemoryIsNeverDeviceMemory) {
  DeviceEnv& env = DefaultDeviceEnv();
  int host = 0;
  // A host pointer is unregistered memory, or (no CUDA, no driver, no device) the query says why it
  // could not run, naming itself.
  absl::StatusOr<PointerInfo> pointer = env.QueryPointer(&host);
  if (pointer.ok()) {
    EXPECT_EQ(pointer->memory, PointerMemory::kUnregistered);
  } else if (env.has_cuda()) {
    EXPECT_EQ(pointer.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(pointer.status().message(), HasSubstr("cudaPointerGetAttributes"));
  }
  absl::StatusOr<AllocationInfo> allocation = env.QueryAllocation(&host);
  if (allocation.ok()) {
    EXPECT_FALSE(allocation->device);
    EXPECT_FALSE(allocation->ipc_capable);
  } else {
    EXPECT_EQ(allocation.status().code(), absl::StatusCode::kUnavailable) << allocation.status();
  }
  EXPECT_EQ(env.VmmMappedBytes(&host, 1 << 20, 64), 0u);
  EXPECT_EQ(env.MappedVmmHandle(&host), 0u);
}

}  // namespace
}  // namespace refit
