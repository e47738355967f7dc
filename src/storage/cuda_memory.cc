// Device and pinned-host implementations of refit::Memory, the device checksum and the copy from
// device memory (memory_device.h): memory.h's CUDA half (built with CUDA only; no_cuda_memory.cc
// without).
#include <cuda_runtime.h>

#include <cstring>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/cuda_handles.h"
#include "common/cuda_status.h"
#include "common/device_env.h"
#include "common/parallel_copy.h"
#include "kernels/checksum.h"
#include "storage/memory.h"
#include "storage/memory_device.h"

namespace refit::storage {

absl::Status CopyAnyToHost(void* dst, const void* src, uint64_t bytes) {
  absl::StatusOr<PointerInfo> info = DefaultDeviceEnv().QueryPointer(src);
  if (info.ok() && info->memory == PointerMemory::kDevice) {
    return CudaStatus(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "copy from device memory");
  }
  ParallelCopy(dst, src, bytes);  // a trainer packing host tensors into its bucket
  return absl::OkStatus();
}

namespace {

class PinnedHostMemory final : public Memory {
 public:
  MemoryKind kind() const override { return MemoryKind::kHost; }
  absl::StatusOr<std::shared_ptr<uint8_t>> Allocate(uint64_t bytes) override {
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocDefault) != cudaSuccess) {
      (void)cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " pinned host bytes"));
    }
    return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { cudaFreeHost(q); });
  }
  absl::Status CopyWithin(void* dst, const void* src, uint64_t bytes) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyToHost(void* dst, const void* src, uint64_t bytes) override { return CopyWithin(dst, src, bytes); }
  absl::Status CopyFromHost(void* dst, const void* src, uint64_t bytes) override { return CopyWithin(dst, src, bytes); }
  absl::Status CopyInAsync(void* dst, const void* src, uint64_t bytes) override { return CopyAnyToHost(dst, src, bytes); }
  absl::Status Synchronize() override { return absl::OkStatus(); }
};

class DeviceMemory final : public Memory {
 public:
  explicit DeviceMemory(int device) : device_(device) {}

  MemoryKind kind() const override { return MemoryKind::kDevice; }
  absl::StatusOr<std::shared_ptr<uint8_t>> Allocate(uint64_t bytes) override {
    absl::StatusOr<DeviceAllocation> a = DeviceAllocation::Allocate(device_, bytes);
    if (!a.ok()) return a.status();
    auto owner = std::make_shared<DeviceAllocation>(std::move(*a));
    return std::shared_ptr<uint8_t>(owner, owner->as<uint8_t>());
  }

  absl::Status CopyWithin(void* dst, const void* src, uint64_t bytes) override {
    return Copy(dst, src, bytes, cudaMemcpyDeviceToDevice);
  }
  absl::Status CopyToHost(void* dst, const void* src, uint64_t bytes) override {
    return Copy(dst, src, bytes, cudaMemcpyDeviceToHost);
  }
  absl::Status CopyFromHost(void* dst, const void* src, uint64_t bytes) override {
    return Copy(dst, src, bytes, cudaMemcpyHostToDevice);
  }
  absl::Status CopyInAsync(void* dst, const void* src, uint64_t bytes) override {
    absl::MutexLock lock(&mu_);
    if (!stream_) {
      absl::StatusOr<CudaStream> s = CudaStream::Create(device_);
      if (!s.ok()) return s.status();
      stream_ = std::move(*s);
    }
    cudaSetDevice(device_);
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_.get()),
                      absl::StrCat("copy of ", bytes, " bytes into GPU ", device_));
  }
  absl::Status Synchronize() override {
    absl::MutexLock lock(&mu_);
    return stream_.Synchronize();
  }
  absl::StatusOr<uint64_t> Checksum(const void* p, uint64_t bytes) override {
    absl::MutexLock lock(&checksum_mu_);
    return DeviceChecksum64(device_, p, bytes, nullptr, checksum_word_);
  }

 private:
  absl::Status Copy(void* dst, const void* src, uint64_t bytes, cudaMemcpyKind kind) {
    cudaSetDevice(device_);
    return CudaStatus(cudaMemcpy(dst, src, bytes, kind), absl::StrCat("GPU copy of ", bytes, " bytes"));
  }
  const int device_;
  absl::Mutex mu_;
  CudaStream stream_ ABSL_GUARDED_BY(mu_);  // for CopyInAsync, made on first use
  absl::Mutex checksum_mu_;
  DeviceAllocation checksum_word_ ABSL_GUARDED_BY(checksum_mu_);  // Checksum's result word, made on first use
};

bool HaveDevice() {
  int n = 0;
  bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  (void)cudaGetLastError();
  return ok;
}

}  // namespace

std::unique_ptr<Memory> NewHostMemory();

std::unique_ptr<Memory> NewPinnedHostMemory() {
  if (!HaveDevice()) return NewHostMemory();
  return std::make_unique<PinnedHostMemory>();
}

absl::StatusOr<uint64_t> DeviceChecksum64(int device, const void* p, uint64_t bytes, void* stream,
                                          DeviceAllocation& word) {
  // The caller's result word, allocated once per owner (no cudaMalloc per parameter inside a
  // commit's pause) and freed with it.
  if (!word || word.device() != device) {
    absl::StatusOr<DeviceAllocation> a = DeviceAllocation::Allocate(device, sizeof(uint64_t));
    if (!a.ok()) return a.status();
    word = std::move(*a);
  }
  cudaSetDevice(device);
  absl::Status st = kernels::DeviceChecksum(p, bytes, 0, word.as<uint64_t>(), stream);
  if (!st.ok()) return st;
  uint64_t sum = 0;
  cudaError_t e =
      cudaMemcpyAsync(&sum, word.get(), sizeof(sum), cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream));
  if (e == cudaSuccess) e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  if (e != cudaSuccess) return CudaStatus(e, absl::StrCat("checksum of ", bytes, " bytes on GPU ", device));
  return sum;
}

absl::StatusOr<std::unique_ptr<Memory>> NewDeviceMemory(int device) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || device < 0 || device >= n) {
    (void)cudaGetLastError();
    return absl::UnavailableError(absl::StrCat("no CUDA device ", device, " (",
                                               e != cudaSuccess ? cudaGetErrorString(e) : "out of range", ")"));
  }
  return std::unique_ptr<Memory>(std::make_unique<DeviceMemory>(device));
}

}  // namespace refit::storage
