// The engine's in-place registration (client/cuda_export.h) when the DeviceEnv's queries fail or
// refuse, for CUDA allocations and virtual-memory mappings alike: each parameter is refused with an
// error that names it and what failed, without a GPU (the queries are a FakeDeviceEnv's). The registration of real GPU
// memory: tests/unit/storage/ vmm_storage_test.cc and the GPU integration tests.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/cuda_export.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/fake_device_env.h"

namespace refit::client {
namespace {

using ::testing::HasSubstr;

class InPlaceExportTest : public ::testing::Test {
 protected:
  // One BF16 parameter of 8 elements (16 bytes) at a made-up device address.
  std::vector<DevicePtrParam> Params() const {
    return {{"layers.0.w", DType::kBF16, Shape{8}, reinterpret_cast<const void*>(kAddress)}};
  }
  // Builds without CUDA refuse every device pointer before asking anything.
  bool ExpectBuiltWithoutCuda(const absl::StatusOr<InPlaceExport>& exported) {
    if (DefaultDeviceEnv().has_cuda()) return false;
    EXPECT_EQ(exported.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(exported.status().message(),
                HasSubstr("'layers.0.w' is CUDA memory, but this library was built without CUDA"));
    return true;
  }

  static constexpr uint64_t kAddress = 0x7f0000100000;
  testing::FakeDeviceEnv env_;
};

TEST_F(InPlaceExportTest, AFailedPointerQueryRefusesTheParameterNamingTheQuery) {
  env_.pointer = absl::InternalError("cudaPointerGetAttributes: injected failure");
  absl::StatusOr<InPlaceExport> exported = ExportInPlace(Params(), env_);
  if (ExpectBuiltWithoutCuda(exported)) return;
  EXPECT_EQ(exported.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(exported.status().message(), HasSubstr("parameter 'layers.0.w' cannot be registered in place"));
  EXPECT_THAT(exported.status().message(), HasSubstr("cudaPointerGetAttributes: injected failure"));
  EXPECT_EQ(env_.pointer_queries, 1);
  EXPECT_EQ(env_.range_queries, 0) << "nothing more is asked of a pointer that is not known to be device memory";
}

TEST_F(InPlaceExportTest, HostAndManagedMemoryAreRefusedSayingWhich) {
  env_.pointer = PointerInfo{PointerMemory::kHost, -1};
  absl::StatusOr<InPlaceExport> exported = ExportInPlace(Params(), env_);
  if (ExpectBuiltWithoutCuda(exported)) return;
  EXPECT_EQ(exported.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(exported.status().message(), HasSubstr("'layers.0.w' cannot be registered in place: it is host memory"));

  env_.pointer = PointerInfo{PointerMemory::kManaged, 0};
  exported = ExportInPlace(Params(), env_);
  EXPECT_EQ(exported.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(exported.status().message(), HasSubstr("managed (unified) memory"));
}

TEST_F(InPlaceExportTest, AFailedAllocationQueryRefusesTheParameterNamingTheQuery) {
  env_.pointer = PointerInfo{PointerMemory::kDevice, 0};
  env_.range = absl::InvalidArgumentError("cuMemGetAddressRange: injected failure");
  absl::StatusOr<InPlaceExport> exported = ExportInPlace(Params(), env_);
  if (ExpectBuiltWithoutCuda(exported)) return;
  EXPECT_EQ(exported.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      exported.status().message(),
      HasSubstr("parameter 'layers.0.w': cannot query its CUDA allocation (cuMemGetAddressRange: injected failure)"));
  EXPECT_EQ(env_.range_queries, 1);
}

TEST_F(InPlaceExportTest, ADriverWithoutTheAllocationQueryIsUnavailable) {
  env_.pointer = PointerInfo{PointerMemory::kDevice, 0};
  env_.range = absl::UnavailableError("the CUDA driver has no cuMemGetAddressRange");
  absl::StatusOr<InPlaceExport> exported = ExportInPlace(Params(), env_);
  if (ExpectBuiltWithoutCuda(exported)) return;
  EXPECT_EQ(exported.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(exported.status().message(), HasSubstr("cuMemGetAddressRange"));
}

TEST_F(InPlaceExportTest, AParameterRunningPastItsAllocationIsRefused) {
  // The allocation ends 8 bytes after the parameter's start; the parameter is 16 bytes.
  env_.pointer = PointerInfo{PointerMemory::kDevice, 0};
  env_.range = AddressRange{kAddress - 64, 72};
  absl::StatusOr<InPlaceExport> exported = ExportInPlace(Params(), env_);
  if (ExpectBuiltWithoutCuda(exported)) return;
  EXPECT_EQ(exported.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(exported.status().message(),
              HasSubstr("parameter 'layers.0.w': 16 bytes at offset 64 run past its CUDA allocation of 72 bytes"));
}

// Virtual memory (a handle mapped at the pointer): its mapping's range is the env's answer too.
TEST_F(InPlaceExportTest, AFailedMappingQueryRefusesAVirtualMemoryParameterNamingTheQuery) {
  env_.pointer = PointerInfo{PointerMemory::kDevice, 0};
  env_.vmm_handle = 0x1234;
  env_.range = absl::InvalidArgumentError("cuMemGetAddressRange: injected failure");
  absl::StatusOr<InPlaceExport> exported = ExportInPlace(Params(), env_);
  if (ExpectBuiltWithoutCuda(exported)) return;
  EXPECT_EQ(exported.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(exported.status().message(),
              HasSubstr("parameter 'layers.0.w': cannot query its CUDA virtual-memory mapping "
                        "(cuMemGetAddressRange: injected failure)"));
  EXPECT_EQ(env_.range_queries, 1);

  env_.range = absl::UnavailableError("the CUDA driver has no cuMemGetAddressRange");
  exported = ExportInPlace(Params(), env_);
  EXPECT_EQ(exported.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(exported.status().message(), HasSubstr("cuMemGetAddressRange"));
}

TEST_F(InPlaceExportTest, AVirtualMemoryParameterRunningPastItsMappingIsRefused) {
  // The mapping holds the parameter's first 8 bytes; the range at its end is that same mapping,
  // not a further one.
  env_.pointer = PointerInfo{PointerMemory::kDevice, 0};
  env_.vmm_handle = 0x1234;
  env_.range = AddressRange{kAddress, 8};
  absl::StatusOr<InPlaceExport> exported = ExportInPlace(Params(), env_);
  if (ExpectBuiltWithoutCuda(exported)) return;
  EXPECT_EQ(exported.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(exported.status().message(),
              HasSubstr("parameter 'layers.0.w' cannot be registered in place: its 16 bytes run past its CUDA "
                        "virtual-memory mapping at 0x7f0000100000 (8 bytes)"));
  EXPECT_EQ(env_.range_queries, 2);
}

}  // namespace
}  // namespace refit::client
