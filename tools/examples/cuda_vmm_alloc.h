// The examples' CUDA virtual memory (example_engine --vmm, example_trainer --vmm): one allocation
// made and mapped as vLLM's sleep-mode allocator and SGLang's memory saver make theirs, or pieces
// mapped one after another as PyTorch's expandable segments grow.
// Include only from sources built with CUDA.
#ifndef REFIT_TOOLS_EXAMPLES_CUDA_VMM_ALLOC_H_
#define REFIT_TOOLS_EXAMPLES_CUDA_VMM_ALLOC_H_

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/cuda_vmm.h"

namespace refit::examples {

// `bytes` (rounded up to the granularity) of CUDA virtual memory on `device`, exportable as a
// POSIX file descriptor, mapped read-write; null (with the reason in `why`) when unavailable.
// `piece_bytes` > 0: made of allocations of that size (rounded up to the granularity) mapped one
// after another, as PyTorch's expandable segments grow; 0: one allocation. Held until the process
// exits.
inline void* AllocateVmm(int device, uint64_t bytes, std::string& why, uint64_t piece_bytes = 0) {
  const CudaVmmDriver& d = VmmDriver();
  if (!d.can_allocate()) {
    why = "the CUDA driver has no virtual memory management";
    return nullptr;
  }
  const CUmemAllocationProp prop = DeviceVmmProp(device, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  size_t g = 0;
  if (d.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS) {
    why = "no virtual memory with POSIX descriptors on this device";
    return nullptr;
  }
  const size_t size = (std::max<uint64_t>(bytes, 1) + g - 1) / g * g;
  const size_t piece = piece_bytes == 0 ? size : std::min<size_t>(size, (piece_bytes + g - 1) / g * g);
  CUdeviceptr va = 0;
  if (d.reserve(&va, size, g, 0, 0) != CUDA_SUCCESS) {
    why = "cuMemAddressReserve failed";
    return nullptr;
  }
  for (size_t at = 0; at < size; at += piece) {
    const size_t n = std::min(piece, size - at);
    CUmemGenericAllocationHandle handle = 0;
    if (d.create(&handle, n, &prop, 0) != CUDA_SUCCESS || d.map(va + at, n, 0, handle, 0) != CUDA_SUCCESS) {
      why = "cuMemCreate/cuMemMap failed";
      return nullptr;
    }
  }
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (d.set_access(va, size, &access, 1) != CUDA_SUCCESS) {
    why = "cuMemSetAccess failed";
    return nullptr;
  }
  return reinterpret_cast<void*>(va);
}

}  // namespace refit::examples

#endif  // REFIT_TOOLS_EXAMPLES_CUDA_VMM_ALLOC_H_
