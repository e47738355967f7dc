// Where buffers live: host memory or the engine GPU's memory. The converter and the
// committer pick copy directions from the kind; allocation goes through this seam so that the
// core never includes CUDA headers (the device implementation is in cuda_memory.cc, built with
// CUDA only). Thread-safe.
#ifndef REFIT_STORAGE_MEMORY_H_
#define REFIT_STORAGE_MEMORY_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/device_allocation.h"
#include "common/parallel_checksum.h"

namespace refit::storage {

enum class MemoryKind : uint8_t { kHost, kDevice };

class Memory {
 public:
  virtual ~Memory() = default;
  virtual MemoryKind kind() const = 0;
  // `bytes` of uninitialized memory, freed when the last owner lets go. ResourceExhausted when
  // the allocation fails.
  virtual absl::StatusOr<std::shared_ptr<uint8_t>> Allocate(uint64_t bytes) = 0;
  // Synchronous copies between buffers of this kind and host memory.
  virtual absl::Status CopyWithin(void* dst, const void* src, uint64_t bytes) = 0;
  virtual absl::Status CopyToHost(void* host_dst, const void* src, uint64_t bytes) = 0;
  virtual absl::Status CopyFromHost(void* dst, const void* host_src, uint64_t bytes) = 0;
  // Copies from `src` — host memory or CUDA device memory, told apart by the CUDA runtime — into
  // `dst` of this kind. Device memory queues the copy on this Memory's own stream; host kinds copy
  // at once. Every copy is complete (and `src` may change) once Synchronize() returned OK.
  virtual absl::Status CopyInAsync(void* dst, const void* src, uint64_t bytes) = 0;
  virtual absl::Status Synchronize() = 0;
  // ParallelChecksum64 (common/parallel_checksum.h) of `bytes` at `p`, a buffer of this kind:
  // computed where the bytes are (device memory: on the GPU, kernels/checksum.h).
  virtual absl::StatusOr<uint64_t> Checksum(const void* p, uint64_t bytes) {
    return ParallelChecksum64(p, bytes);
  }
};

// Plain host memory.
std::unique_ptr<Memory> NewHostMemory();
// Page-locked host memory (fast, asynchronous copies to the GPU); falls back to plain host memory
// where no CUDA device is usable, so the host path runs everywhere.
std::unique_ptr<Memory> NewPinnedHostMemory();
// Memory of GPU `device` (cudaMalloc). Unavailable when CUDA is not built in or no device exists.
absl::StatusOr<std::unique_ptr<Memory>> NewDeviceMemory(int device);

// OK when `p` is CUDA device memory; InvalidArgument saying why not; Unimplemented in a build
// without CUDA.
absl::Status CheckDeviceMemory(const void* p);
// ParallelChecksum64 of device bytes, computed on GPU `device` on `stream` (a cudaStream_t; null:
// the default stream), waiting for the result. `word` is the caller's result word on `device`,
// allocated here when empty and kept for the next call (so that a commit's pause allocates none);
// REQUIRES: no other call uses `word` at the same time. Unimplemented in a build without CUDA.
absl::StatusOr<uint64_t> DeviceChecksum64(int device, const void* p, uint64_t bytes, void* stream,
                                          DeviceAllocation& word);
// The calling thread's current CUDA device; Unavailable without CUDA or a device.
absl::StatusOr<int> CurrentDevice();

}  // namespace refit::storage

#endif  // REFIT_STORAGE_MEMORY_H_
