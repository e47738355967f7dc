// Per-bucket device memory of the GPU converter, so that a bucket's tensors cost no allocation,
// no memset and no read-back each: a fixed number of tensor slots, each with a non-finite probe
// word (~0 until a kernel records a bad index) and an amax float (+0 until an amax pass raises
// it), plus room for the descriptor tables of batched runs (pinned host buffer and device buffer
// at the same offsets). At the end of a bucket all probe words come back with one device-to-host
// copy, and the words are reset behind it on the same stream, so that the arena is clean when its
// next bucket takes it: a bucket's start enqueues nothing its lanes would have to wait for. The
// converter keeps one arena per bucket in flight (a bucket's words are read while the next
// bucket's kernels already run on another arena).
//
// Threading: used by one converter thread; every device operation is enqueued on the stream given
// to it, and buffers are replaced only after that stream was synchronized.
#ifndef REFIT_REFIT_GPU_DEVICE_ARENA_H_
#define REFIT_REFIT_GPU_DEVICE_ARENA_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "storage/memory.h"

namespace refit {

class DeviceArena {
 public:
  struct Slot {
    size_t index;
    unsigned long long* probe;  // device word, ~0ULL until a kernel records a bad index
    float* amax;                // device float, +0 until an amax pass raises it
  };
  struct Table {
    void* host;    // pinned
    void* device;  // 256-byte aligned
  };

  // `max_table_bytes_per_slot`: the largest descriptor a slot's tensor may add to a table.
  // REQUIRES: both memories outlive this; `pinned` is page-locked host memory.
  DeviceArena(storage::Memory& device, storage::Memory& pinned, uint64_t max_table_bytes_per_slot)
      : device_(device), pinned_(pinned), per_slot_table_(max_table_bytes_per_slot) {}

  bool full() const { return used_ == capacity_; }
  size_t used() const { return used_; }

  // Allocates buffers for at least `slots` slots (at least twice the current capacity) and
  // enqueues their words' reset on `stream`: work that takes slots must be ordered after it.
  // REQUIRES: no slot is taken (Reset was called) and no queued work uses the current buffers.
  absl::Status Grow(size_t slots, cudaStream_t stream);

  // The next slot, its words reset (by Grow, CopyProbesAndReset or ResetWords before).
  // REQUIRES: !full().
  absl::StatusOr<Slot> Take();

  // Room for a descriptor table of `bytes` (at most max_table_bytes_per_slot per tensor), for a
  // run of tensors that each hold a slot: a bucket's tables then always fit.
  absl::StatusOr<Table> TakeTable(uint64_t bytes);

  // Enqueues the copy of the taken slots' probe words to the host, then the reset of those words
  // and amax floats, on `stream`; once `stream` passed them, probe(index) reads the words.
  absl::Status CopyProbesAndReset(cudaStream_t stream);
  // CopyProbesAndReset, then synchronizes `stream`.
  absl::Status Collect(cudaStream_t stream);
  size_t capacity() const { return capacity_; }
  unsigned long long probe(size_t index) const { return host_words_[index]; }

  // Forgets every slot and table. REQUIRES: `stream` passed all work using them (Collect).
  void Reset();

 private:
  // Enqueues the reset of the first `slots` probe words and amax floats on `stream`.
  absl::Status ResetWords(size_t slots, cudaStream_t stream);

  storage::Memory& device_;
  storage::Memory& pinned_;
  const uint64_t per_slot_table_;
  std::shared_ptr<uint8_t> device_buf_;  // [probe words | amax floats | tables]
  std::shared_ptr<uint8_t> host_buf_;    // [probe words | tables]
  unsigned long long* host_words_ = nullptr;
  size_t capacity_ = 0;
  uint64_t amax_offset_ = 0, table_offset_ = 0, host_table_offset_ = 0, table_bytes_ = 0;
  size_t used_ = 0;
  uint64_t table_used_ = 0;
};

}  // namespace refit

#endif  // REFIT_REFIT_GPU_DEVICE_ARENA_H_
