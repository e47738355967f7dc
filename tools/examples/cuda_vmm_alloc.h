// The examples' CUDA virtual memory (example_engine --vmm, example_trainer --vmm): one allocation
// made and mapped as vLLM's sleep-mode allocator and SGLang's memory saver make theirs.
// Include only from sources built with CUDA.
#ifndef REFIT_TOOLS_EXAMPLES_CUDA_VMM_ALLOC_H_
#define REFIT_TOOLS_EXAMPLES_CUDA_VMM_ALLOC_H_

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/cuda_status.h"

namespace refit::examples {

// `bytes` (rounded up to the granularity) of CUDA virtual memory on `device`, exportable as a
// POSIX file descriptor, mapped read-write; null (with the reason in `why`) when unavailable.
// `piece_bytes` > 0: made of allocations of that size (rounded up to the granularity) mapped one
// after another, as PyTorch's expandable segments grow; 0: one allocation.
inline void* AllocateVmm(int device, uint64_t bytes, std::string& why, uint64_t piece_bytes = 0) {
  using Create = CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long);
  using Granularity = CUresult (*)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags);
  using Reserve = CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  using Map = CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  using SetAccess = CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
  Create create = nullptr;
  Granularity granularity = nullptr;
  Reserve reserve = nullptr;
  Map map = nullptr;
  SetAccess set_access = nullptr;
  if (!refit::LoadDriverEntryPoint("cuMemCreate", 10020, &create) ||
      !refit::LoadDriverEntryPoint("cuMemGetAllocationGranularity", 10020, &granularity) ||
      !refit::LoadDriverEntryPoint("cuMemAddressReserve", 10020, &reserve) ||
      !refit::LoadDriverEntryPoint("cuMemMap", 10020, &map) || !refit::LoadDriverEntryPoint("cuMemSetAccess", 10020, &set_access)) {
    why = "the CUDA driver has no virtual memory management";
    return nullptr;
  }
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t g = 0;
  CUmemGenericAllocationHandle handle = 0;
  CUdeviceptr va = 0;
  if (granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS) {
    why = "no virtual memory with POSIX descriptors on this device";
    return nullptr;
  }
  const size_t size = (std::max<uint64_t>(bytes, 1) + g - 1) / g * g;
  const size_t piece = piece_bytes == 0 ? size : std::min<size_t>(size, (piece_bytes + g - 1) / g * g);
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (reserve(&va, size, g, 0, 0) != CUDA_SUCCESS) {
    why = "cuMemAddressReserve failed";
    return nullptr;
  }
  for (size_t at = 0; at < size; at += piece) {
    const size_t n = std::min(piece, size - at);
    if (create(&handle, n, &prop, 0) != CUDA_SUCCESS || map(va + at, n, 0, handle, 0) != CUDA_SUCCESS) {
      why = "cuMemCreate/cuMemMap failed";
      return nullptr;
    }
  }
  if (set_access(va, size, &access, 1) != CUDA_SUCCESS) {
    why = "cuMemSetAccess failed";
    return nullptr;
  }
  return reinterpret_cast<void*>(va);  // held until the process exits
}

}  // namespace refit::examples

#endif  // REFIT_TOOLS_EXAMPLES_CUDA_VMM_ALLOC_H_
