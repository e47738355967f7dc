// CUDA virtual memory as PyTorch's expandable segments and sleep-mode allocators make it, for GPU
// tests: one reserved address range with `pieces` allocations (cuMemCreate, each a multiple of the
// granularity) mapped one after another and made readable and writable from device 0. Include
// only from sources compiled with the CUDA runtime; construct after REFIT_SKIP_WITHOUT_GPU, then
// check ok() (false: why()).
#ifndef REFIT_TESTS_UNIT_CUDA_VMM_H_
#define REFIT_TESTS_UNIT_CUDA_VMM_H_

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/cuda_vmm.h"

namespace refit::testing {

class CudaVmm {
 public:
  CudaVmm(uint64_t piece_bytes, int pieces, CUmemAllocationHandleType handle_type) {
    cudaSetDevice(0);
    cudaFree(nullptr);
    if (!d_.can_allocate()) {
      why_ = "the CUDA driver lacks the cuMem* entry points";
      return;
    }
    const CUmemAllocationProp prop = DeviceVmmProp(0, handle_type);
    size_t g = 0;
    if (d_.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS) {
      why_ = "device 0 has no virtual memory management with this handle type";
      return;
    }
    piece_ = (piece_bytes + g - 1) / g * g;
    size_ = piece_ * static_cast<uint64_t>(pieces);
    if (d_.reserve(&va_, size_, g, 0, 0) != CUDA_SUCCESS) {
      why_ = "cuMemAddressReserve failed";
      return;
    }
    for (int i = 0; i < pieces; ++i) {
      CUmemGenericAllocationHandle h = 0;
      if (d_.create(&h, piece_, &prop, 0) != CUDA_SUCCESS) {
        why_ = "cuMemCreate failed";
        return;
      }
      handles_.push_back(h);
      if (d_.map(va_ + i * piece_, piece_, 0, h, 0) != CUDA_SUCCESS) {
        why_ = "cuMemMap failed";
        return;
      }
      ++mapped_;
    }
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (d_.set_access(va_, size_, &access, 1) != CUDA_SUCCESS) why_ = "cuMemSetAccess failed";
  }
  ~CudaVmm() {
    cudaDeviceSynchronize();
    for (int i = 0; i < mapped_; ++i) d_.unmap(va_ + i * piece_, piece_);
    for (CUmemGenericAllocationHandle h : handles_) d_.release(h);
    if (va_ != 0) d_.address_free(va_, size_);
  }
  CudaVmm(const CudaVmm&) = delete;
  CudaVmm& operator=(const CudaVmm&) = delete;

  bool ok() const { return why_.empty(); }
  const std::string& why() const { return why_; }
  uint8_t* data() const { return reinterpret_cast<uint8_t*>(va_); }
  uint64_t size() const { return size_; }
  uint64_t piece() const { return piece_; }

 private:
  const CudaVmmDriver& d_ = VmmDriver();
  std::string why_;
  CUdeviceptr va_ = 0;
  uint64_t piece_ = 0, size_ = 0;
  std::vector<CUmemGenericAllocationHandle> handles_;
  int mapped_ = 0;
};

}  // namespace refit::testing

#endif  // REFIT_TESTS_UNIT_CUDA_VMM_H_
