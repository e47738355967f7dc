// The examples' CUDA virtual memory (example_engine --vmm, example_trainer --vmm): one allocation
// made and mapped as vLLM's sleep-mode allocator and SGLang's memory saver make theirs (and
// unmapped and mapped again as they do across a sleep), or pieces mapped one after another as
// PyTorch's expandable segments grow.
// Include only from sources built with CUDA.
#ifndef REFIT_TOOLS_EXAMPLES_CUDA_VMM_ALLOC_H_
#define REFIT_TOOLS_EXAMPLES_CUDA_VMM_ALLOC_H_

#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/cuda_vmm.h"

namespace refit::examples {

// CUDA virtual memory on one device, exportable as POSIX file descriptors, mapped read-write:
// one allocation, or pieces mapped one after another as PyTorch's expandable segments grow.
// Unmap gives the physical memory back and keeps the address range (what vLLM's sleep mode and
// SGLang's memory saver do when the engine sleeps); Map maps new memory at the same addresses
// (its contents undefined until written). The range is held until the process exits.
class VmmMemory {
 public:
  // `bytes` rounded up to the granularity; `piece_bytes` > 0: pieces of that size (rounded up to
  // the granularity), 0: one allocation. False (with the reason in `why`) when unavailable.
  bool Allocate(int device, uint64_t bytes, std::string& why, uint64_t piece_bytes = 0) {
    const CudaVmmDriver& d = VmmDriver();
    if (!d.can_allocate()) {
      why = "the CUDA driver has no virtual memory management";
      return false;
    }
    prop_ = DeviceVmmProp(device, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    size_t g = 0;
    if (d.granularity(&g, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS) {
      why = "no virtual memory with POSIX descriptors on this device";
      return false;
    }
    size_ = (std::max<uint64_t>(bytes, 1) + g - 1) / g * g;
    piece_ = piece_bytes == 0 ? size_ : std::min<size_t>(size_, (piece_bytes + g - 1) / g * g);
    if (d.reserve(&va_, size_, g, 0, 0) != CUDA_SUCCESS) {
      why = "cuMemAddressReserve failed";
      return false;
    }
    return Map(why);
  }

  bool Map(std::string& why) {
    const CudaVmmDriver& d = VmmDriver();
    for (size_t at = 0; at < size_; at += piece_) {
      const size_t n = std::min(piece_, size_ - at);
      CUmemGenericAllocationHandle handle = 0;
      if (d.create(&handle, n, &prop_, 0) != CUDA_SUCCESS) {
        why = "cuMemCreate failed";
        return false;
      }
      const bool mapped = d.map(va_ + at, n, 0, handle, 0) == CUDA_SUCCESS;
      d.release(handle);  // the mapping holds the memory from here on: unmapping frees it
      if (!mapped) {
        why = "cuMemMap failed";
        return false;
      }
    }
    CUmemAccessDesc access{};
    access.location = prop_.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (d.set_access(va_, size_, &access, 1) != CUDA_SUCCESS) {
      why = "cuMemSetAccess failed";
      return false;
    }
    return true;
  }

  bool Unmap(std::string& why) {
    for (size_t at = 0; at < size_; at += piece_) {
      if (VmmDriver().unmap(va_ + at, std::min(piece_, size_ - at)) != CUDA_SUCCESS) {
        why = "cuMemUnmap failed";
        return false;
      }
    }
    return true;
  }

  void* data() const { return reinterpret_cast<void*>(va_); }
  uint64_t size() const { return size_; }

 private:
  CUmemAllocationProp prop_{};
  CUdeviceptr va_ = 0;
  size_t size_ = 0;
  size_t piece_ = 0;
};

// A VmmMemory of `bytes` held until the process exits; null (with the reason in `why`) when
// unavailable.
inline void* AllocateVmm(int device, uint64_t bytes, std::string& why, uint64_t piece_bytes = 0) {
  static std::vector<std::unique_ptr<VmmMemory>>* held = new std::vector<std::unique_ptr<VmmMemory>>();
  auto m = std::make_unique<VmmMemory>();
  if (!m->Allocate(device, bytes, why, piece_bytes)) return nullptr;
  held->push_back(std::move(m));
  return held->back()->data();
}

}  // namespace refit::examples

#endif  // REFIT_TOOLS_EXAMPLES_CUDA_VMM_ALLOC_H_
