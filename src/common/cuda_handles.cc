#include "common/cuda_handles.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"

namespace refit {
namespace {

// Runs `release` with `device` current, then makes the caller's device current again: a
// destructor must not move the calling thread (a trainer's, say) to another GPU.
template <typename F>
void OnDevice(int device, F release) {
  int previous = -1;
  const bool known = cudaGetDevice(&previous) == cudaSuccess;
  cudaSetDevice(device);
  release();
  if (known && previous != device) cudaSetDevice(previous);
}

}  // namespace

absl::StatusOr<CudaStream> CudaStream::Create(int device) {
  if (absl::Status st = CudaStatus(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")")); !st.ok()) {
    return st;
  }
  cudaStream_t s = nullptr;
  if (absl::Status st = CudaStatus(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"); !st.ok()) {
    return st;
  }
  return CudaStream(device, s);
}

CudaStream& CudaStream::operator=(CudaStream&& o) noexcept {
  if (this != &o) {
    Reset();
    device_ = o.device_;
    stream_ = std::exchange(o.stream_, nullptr);
  }
  return *this;
}

absl::Status CudaStream::Synchronize() const {
  if (stream_ == nullptr) return absl::OkStatus();
  return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

void CudaStream::Reset() {
  if (stream_ == nullptr) return;
  OnDevice(device_, [this] {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  });
  stream_ = nullptr;
}

absl::StatusOr<CudaEvent> CudaEvent::Create(int device, bool timing) {
  if (absl::Status st = CudaStatus(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")")); !st.ok()) {
    return st;
  }
  cudaEvent_t e = nullptr;
  if (absl::Status st = CudaStatus(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming),
                                   "cudaEventCreate");
      !st.ok()) {
    return st;
  }
  return CudaEvent(device, e);
}

CudaEvent& CudaEvent::operator=(CudaEvent&& o) noexcept {
  if (this != &o) {
    Reset();
    device_ = o.device_;
    event_ = std::exchange(o.event_, nullptr);
  }
  return *this;
}

void CudaEvent::Reset() {
  if (event_ == nullptr) return;
  OnDevice(device_, [this] { cudaEventDestroy(event_); });
  event_ = nullptr;
}

absl::StatusOr<DeviceAllocation> DeviceAllocation::Allocate(int device, uint64_t bytes) {
  if (absl::Status st = CudaStatus(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")")); !st.ok()) {
    return st;
  }
  void* p = nullptr;
  if (cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes); e != cudaSuccess) {
    absl::Status st = CudaStatus(e, absl::StrCat("cannot allocate ", bytes, " bytes on GPU ", device));
    return absl::ResourceExhaustedError(st.message());
  }
  return DeviceAllocation(device, p, bytes);
}

DeviceAllocation& DeviceAllocation::operator=(DeviceAllocation&& o) noexcept {
  if (this != &o) {
    Reset();
    device_ = o.device_;
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void DeviceAllocation::Reset() {
  if (data_ == nullptr) return;
  OnDevice(device_, [this] { cudaFree(data_); });
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace refit
