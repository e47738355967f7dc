// CUDA virtual memory as PyTorch's expandable segments and sleep-mode allocators make it, for GPU
// tests: one reserved address range with `pieces` allocations (cuMemCreate, each a multiple of the
// granularity) mapped one after the other and made readable and writable from device 0. The
// driver is reached through the runtime's entry points. Include only from sources compiled with
// the CUDA runtime; construct after REFIT_SKIP_WITHOUT_GPU, then check ok() (false: why()).
#ifndef REFIT_TESTS_UNIT_CUDA_VMM_H_
#define REFIT_TESTS_UNIT_CUDA_VMM_H_

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/cuda_status.h"

namespace refit::testing {

class CudaVmm {
 public:
  CudaVmm(uint64_t piece_bytes, int pieces, CUmemAllocationHandleType handle_type) {
    cudaSetDevice(0);
    cudaFree(nullptr);
    auto load = [](const char* name, auto* fn) { return LoadDriverEntryPoint(name, 10020, fn); };
    if (!(load("cuMemCreate", &create_) && load("cuMemAddressReserve", &reserve_) && load("cuMemMap", &map_) &&
          load("cuMemSetAccess", &set_access_) && load("cuMemUnmap", &unmap_) &&
          load("cuMemAddressFree", &address_free_) && load("cuMemRelease", &release_) &&
          load("cuMemGetAllocationGranularity", &granularity_))) {
      why_ = "the CUDA driver lacks the cuMem* entry points";
      return;
    }
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = handle_type;
    size_t g = 0;
    if (granularity_(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS) {
      why_ = "device 0 has no virtual memory management with this handle type";
      return;
    }
    piece_ = (piece_bytes + g - 1) / g * g;
    size_ = piece_ * static_cast<uint64_t>(pieces);
    if (reserve_(&va_, size_, g, 0, 0) != CUDA_SUCCESS) {
      why_ = "cuMemAddressReserve failed";
      return;
    }
    for (int i = 0; i < pieces; ++i) {
      CUmemGenericAllocationHandle h = 0;
      if (create_(&h, piece_, &prop, 0) != CUDA_SUCCESS) {
        why_ = "cuMemCreate failed";
        return;
      }
      handles_.push_back(h);
      if (map_(va_ + i * piece_, piece_, 0, h, 0) != CUDA_SUCCESS) {
        why_ = "cuMemMap failed";
        return;
      }
      ++mapped_;
    }
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (set_access_(va_, size_, &access, 1) != CUDA_SUCCESS) why_ = "cuMemSetAccess failed";
  }
  ~CudaVmm() {
    cudaDeviceSynchronize();
    for (int i = 0; i < mapped_; ++i) unmap_(va_ + i * piece_, piece_);
    for (CUmemGenericAllocationHandle h : handles_) release_(h);
    if (va_ != 0) address_free_(va_, size_);
  }
  CudaVmm(const CudaVmm&) = delete;
  CudaVmm& operator=(const CudaVmm&) = delete;

  bool ok() const { return why_.empty(); }
  const std::string& why() const { return why_; }
  uint8_t* data() const { return reinterpret_cast<uint8_t*>(va_); }
  uint64_t size() const { return size_; }
  uint64_t piece() const { return piece_; }

 private:
  CUresult (*create_)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long) = nullptr;
  CUresult (*reserve_)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*map_)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*set_access_)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*unmap_)(CUdeviceptr, size_t) = nullptr;
  CUresult (*address_free_)(CUdeviceptr, size_t) = nullptr;
  CUresult (*release_)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*granularity_)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) = nullptr;
  std::string why_;
  CUdeviceptr va_ = 0;
  uint64_t piece_ = 0, size_ = 0;
  std::vector<CUmemGenericAllocationHandle> handles_;
  int mapped_ = 0;
};

}  // namespace refit::testing

#endif  // REFIT_TESTS_UNIT_CUDA_VMM_H_
