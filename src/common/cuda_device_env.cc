// The DeviceEnv of a build with CUDA (device_env.h): the CUDA runtime's pointer queries and the
// driver's, from the one driver table (cuda_vmm.h). The queries are those the client, storage and
// the CUDA IPC data plane made themselves before, moved here unchanged.
#include <cuda.h>
#include <cuda_runtime.h>

#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/cuda_vmm.h"
#include "common/device_env.h"

namespace refit {
namespace {

class CudaDeviceEnv final : public DeviceEnv {
 public:
  bool has_cuda() const override { return true; }

  absl::StatusOr<PointerInfo> QueryPointer(const void* p) override {
    cudaPointerAttributes attr{};
    const cudaError_t e = cudaPointerGetAttributes(&attr, p);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // clear the query's error state
      return absl::InvalidArgumentError(absl::StrCat("cudaPointerGetAttributes: ", cudaGetErrorString(e)));
    }
    PointerInfo info;
    info.device = attr.device;
    switch (attr.type) {
      case cudaMemoryTypeHost: info.memory = PointerMemory::kHost; break;
      case cudaMemoryTypeDevice: info.memory = PointerMemory::kDevice; break;
      case cudaMemoryTypeManaged: info.memory = PointerMemory::kManaged; break;
      default: info.memory = PointerMemory::kUnregistered; break;
    }
    return info;
  }

  absl::StatusOr<AllocationInfo> QueryAllocation(const void* p) override;

  absl::StatusOr<AddressRange> QueryAddressRange(const void* p) override {
    const CudaVmmDriver& d = VmmDriver();
    if (d.address_range == nullptr) return absl::UnavailableError("the CUDA driver has no cuMemGetAddressRange");
    CUdeviceptr base = 0;
    size_t size = 0;
    if (CUresult r = d.address_range(&base, &size, reinterpret_cast<CUdeviceptr>(p)); r != CUDA_SUCCESS) {
      return absl::InvalidArgumentError(absl::StrCat("cuMemGetAddressRange: CUresult ", static_cast<int>(r)));
    }
    return AddressRange{static_cast<uint64_t>(base), static_cast<uint64_t>(size)};
  }

  uint64_t VmmMappedBytes(const void* p, uint64_t limit, uint32_t max_pieces) override;

  uint64_t MappedVmmHandle(const void* p) override {
    const CudaVmmDriver& d = VmmDriver();
    CUmemGenericAllocationHandle h;
    if (d.retain == nullptr || d.release == nullptr || d.retain(&h, const_cast<void*>(p)) != CUDA_SUCCESS) return 0;
    d.release(h);
    return static_cast<uint64_t>(h);
  }

  absl::StatusOr<int> CurrentDevice() override {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
      (void)cudaGetLastError();
      return absl::UnavailableError("no CUDA device");
    }
    return device;
  }
};

absl::StatusOr<AllocationInfo> CudaDeviceEnv::QueryAllocation(const void* p) {
  const CudaVmmDriver& d = VmmDriver();
  if (d.pointer_attributes == nullptr) return absl::UnavailableError("the CUDA driver has no cuPointerGetAttributes");
  unsigned int type = 0;
  int ordinal = -1;
  unsigned long long buffer_id = 0;
  CUdeviceptr base = 0;
  size_t size = 0;
  int managed = 0;
  int ipc = 0;  // a bool in the driver's API; zero-filled so that a one-byte write reads right
  CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                 CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                 CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                 CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                 CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                 CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                 CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE};
  void* data[] = {&type, &ordinal, &buffer_id, &base, &size, &managed, &ipc};
  AllocationInfo a;
  // Not a CUDA pointer: every attribute keeps its zero value and the call succeeds. A driver that
  // does not know the last attribute fails the call: ask again without it (then whether the
  // memory is exportable is learnt from cudaIpcGetMemHandle itself).
  constexpr unsigned int kAll = sizeof(attrs) / sizeof(attrs[0]);
  const CUdeviceptr ptr = reinterpret_cast<CUdeviceptr>(p);
  if (d.pointer_attributes(kAll, attrs, data, ptr) != CUDA_SUCCESS) {
    ipc = 1;
    if (d.pointer_attributes(kAll - 1, attrs, data, ptr) != CUDA_SUCCESS) return a;
  }
  a.device = type == CU_MEMORYTYPE_DEVICE && managed == 0;
  a.ipc_capable = a.device && (ipc & 0xff) != 0;
  a.buffer_id = buffer_id;
  a.base = base;
  a.size = size;
  a.ordinal = ordinal;
  return a;
}

uint64_t CudaDeviceEnv::VmmMappedBytes(const void* p, uint64_t limit, uint32_t max_pieces) {
  const CudaVmmDriver& d = VmmDriver();
  if (!d.can_export()) return 0;
  const uint64_t begin = reinterpret_cast<uint64_t>(p);
  uint64_t at = begin;
  for (uint32_t n = 0; n < max_pieces && at - begin < limit; ++n) {
    CUmemGenericAllocationHandle h;
    if (d.retain(&h, reinterpret_cast<void*>(at)) != CUDA_SUCCESS) break;
    d.release(h);
    CUdeviceptr base = 0;
    size_t size = 0;
    if (d.address_range(&base, &size, static_cast<CUdeviceptr>(at)) != CUDA_SUCCESS) break;
    if (n > 0 && static_cast<uint64_t>(base) != at) break;
    at = static_cast<uint64_t>(base) + size;
  }
  return at - begin;
}

}  // namespace

DeviceEnv& DefaultDeviceEnv() {
  static CudaDeviceEnv env;
  return env;
}

}  // namespace refit
