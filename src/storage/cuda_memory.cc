// Device and pinned-host implementations of refit::Memory (built with CUDA only).
#include <cuda_runtime.h>

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "storage/memory.h"

namespace refit::storage {
namespace {

class PinnedHostMemory final : public Memory {
 public:
  MemoryKind kind() const override { return MemoryKind::kHost; }
  absl::StatusOr<std::shared_ptr<uint8_t>> Allocate(uint64_t bytes) override {
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocDefault) != cudaSuccess) {
      cudaGetLastError();
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
};

class DeviceMemory final : public Memory {
 public:
  explicit DeviceMemory(int device) : device_(device) {}

  MemoryKind kind() const override { return MemoryKind::kDevice; }
  absl::StatusOr<std::shared_ptr<uint8_t>> Allocate(uint64_t bytes) override {
    void* p = nullptr;
    cudaSetDevice(device_);
    cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes on GPU ", device_, ": ", cudaGetErrorString(e)));
    }
    int device = device_;
    return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [device](uint8_t* q) {
      cudaSetDevice(device);
      cudaFree(q);
    });
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

 private:
  absl::Status Copy(void* dst, const void* src, uint64_t bytes, cudaMemcpyKind kind) {
    cudaSetDevice(device_);
    cudaError_t e = cudaMemcpy(dst, src, bytes, kind);
    if (e != cudaSuccess) return absl::InternalError(absl::StrCat("GPU copy of ", bytes, " bytes: ", cudaGetErrorString(e)));
    return absl::OkStatus();
  }
  int device_;
};

bool HaveDevice() {
  int n = 0;
  bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  cudaGetLastError();
  return ok;
}

}  // namespace

std::unique_ptr<Memory> NewHostMemory();

std::unique_ptr<Memory> NewPinnedHostMemory() {
  if (!HaveDevice()) return NewHostMemory();
  return std::make_unique<PinnedHostMemory>();
}

absl::StatusOr<std::unique_ptr<Memory>> NewDeviceMemory(int device) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || device < 0 || device >= n) {
    cudaGetLastError();
    return absl::UnavailableError(absl::StrCat("no CUDA device ", device, " (",
                                               e != cudaSuccess ? cudaGetErrorString(e) : "out of range", ")"));
  }
  return std::unique_ptr<Memory>(std::make_unique<DeviceMemory>(device));
}

}  // namespace refit::storage
