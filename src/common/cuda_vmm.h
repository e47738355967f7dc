// The one table of the CUDA driver's entry points refitd calls, looked up once through the runtime
// (cudaGetDriverEntryPointByVersion, so that nothing links libcuda: absent on machines without a
// driver, where refitd must still start for the host path). No other file looks up a driver entry
// point. Its users: the virtual-memory calls (cuMem*) of refitd's imports of an engine's or a
// trainer's memory (storage::VmmImport), the CUDA IPC data plane's exports, the engine agent's
// in-place registration, and the examples, tests and benchmarks that allocate it; and the pointer
// and allocation queries of the CUDA DeviceEnv (common/device_env.h, cuda_device_env.cc), which
// everything else asks. A member is null when the driver lacks the call.
//
// Built only with CUDA (it needs <cuda.h>). Thread-safe.
#ifndef REFIT_COMMON_CUDA_VMM_H_
#define REFIT_COMMON_CUDA_VMM_H_

#include <cuda.h>

namespace refit {

struct CudaVmmDriver {
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*address_free)(CUdeviceptr, size_t) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*granularity)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*export_handle)(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long) = nullptr;
  CUresult (*import)(CUmemGenericAllocationHandle*, void*, CUmemAllocationHandleType) = nullptr;
  CUresult (*retain)(CUmemGenericAllocationHandle*, void*) = nullptr;
  CUresult (*properties)(CUmemAllocationProp*, CUmemGenericAllocationHandle) = nullptr;
  CUresult (*address_range)(CUdeviceptr*, size_t*, CUdeviceptr) = nullptr;
  CUresult (*error_string)(CUresult, const char**) = nullptr;
  CUresult (*pointer_attributes)(unsigned int, CUpointer_attribute*, void**, CUdeviceptr) = nullptr;

  // What making and mapping memory needs (create, reserve, map, set access; and their undoing).
  bool can_allocate() const {
    return create && release && reserve && address_free && map && unmap && set_access && granularity;
  }
  // What finding and exporting the memory mapped at an address needs.
  bool can_export() const { return retain && release && properties && export_handle && address_range; }
  // What importing and mapping an exported allocation needs.
  bool can_import() const { return import && release && reserve && address_free && map && unmap && set_access && granularity; }
};

const CudaVmmDriver& VmmDriver();

// A CUmemAllocationProp for pinned device memory on `device` with `handle_type` requested.
inline CUmemAllocationProp DeviceVmmProp(int device, CUmemAllocationHandleType handle_type) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = handle_type;
  return prop;
}

}  // namespace refit

#endif  // REFIT_COMMON_CUDA_VMM_H_
