// RAII owners of CUDA runtime handles: one type per handle, one cleanup action each, move-only
// (DeviceAllocation, which needs no CUDA types, is in device_allocation.h).
// Every stream, event and device allocation in refitd's C++ (storage, the GPU converter, kernels'
// host wrappers, the trainer client) is held by one of these, never as a hand-freed void*.
// (The NCCL transport's stream-ordered bounce buffers are its own DeviceBuffer: they are freed
// with cudaFreeAsync for the reason given in transport/nccl/nccl_handles.h.)
//
// Built with CUDA only (includes the CUDA runtime header). Create/Allocate make the handle's
// device current on the calling thread; the destructors release on the handle's device and then
// restore the caller's. Threading: an owner is used by one thread at a time.
#ifndef REFIT_COMMON_CUDA_HANDLES_H_
#define REFIT_COMMON_CUDA_HANDLES_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/device_allocation.h"

namespace refit {

// A non-blocking stream of `device`. The destructor waits for the stream's work, then destroys it.
class CudaStream {
 public:
  static absl::StatusOr<CudaStream> Create(int device);
  CudaStream() = default;
  CudaStream(CudaStream&& o) noexcept : device_(o.device_), stream_(o.stream_) { o.stream_ = nullptr; }
  CudaStream& operator=(CudaStream&& o) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  ~CudaStream() { Reset(); }

  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }
  explicit operator bool() const { return stream_ != nullptr; }
  absl::Status Synchronize() const;

 private:
  CudaStream(int device, cudaStream_t s) : device_(device), stream_(s) {}
  void Reset();
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
};

// An event of `device` (timing disabled unless asked for).
class CudaEvent {
 public:
  static absl::StatusOr<CudaEvent> Create(int device, bool timing = false);
  CudaEvent() = default;
  CudaEvent(CudaEvent&& o) noexcept : device_(o.device_), event_(o.event_) { o.event_ = nullptr; }
  CudaEvent& operator=(CudaEvent&& o) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent() { Reset(); }

  cudaEvent_t get() const { return event_; }
  explicit operator bool() const { return event_ != nullptr; }

 private:
  CudaEvent(int device, cudaEvent_t e) : device_(device), event_(e) {}
  void Reset();
  int device_ = 0;
  cudaEvent_t event_ = nullptr;
};

}  // namespace refit

#endif  // REFIT_COMMON_CUDA_HANDLES_H_
