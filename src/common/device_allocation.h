// RAII owner of one device allocation (cudaMalloc / cudaFree), move-only. Its interface has no
// CUDA types, so headers included by plain C++ (kernels/, storage/) can hold one by value; the
// implementation is in cuda_handles.cc (built with CUDA only).
//
// Threading: an owner is used by one thread at a time. Allocate makes `device` current; Reset and
// the destructor free on the allocation's device and restore the caller's.
#ifndef REFIT_COMMON_DEVICE_ALLOCATION_H_
#define REFIT_COMMON_DEVICE_ALLOCATION_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace refit {

// `bytes` of device memory on `device` (cudaMalloc), freed with cudaFree. Allocation failure is
// ResourceExhausted (the caller may retry with less), other CUDA errors Internal.
class DeviceAllocation {
 public:
  static absl::StatusOr<DeviceAllocation> Allocate(int device, uint64_t bytes);
  DeviceAllocation() = default;
  DeviceAllocation(DeviceAllocation&& o) noexcept : device_(o.device_), data_(o.data_), bytes_(o.bytes_) {
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceAllocation& operator=(DeviceAllocation&& o) noexcept;
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;
  ~DeviceAllocation() { Reset(); }

  void* get() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  uint64_t bytes() const { return bytes_; }
  int device() const { return device_; }
  explicit operator bool() const { return data_ != nullptr; }
  // Frees the memory now (the owner becomes empty).
  void Reset();

 private:
  DeviceAllocation(int device, void* p, uint64_t bytes) : device_(device), data_(p), bytes_(bytes) {}
  int device_ = 0;
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace refit

#endif  // REFIT_COMMON_DEVICE_ALLOCATION_H_
