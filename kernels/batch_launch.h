// Raw launchers of the batched kernels (batch_quantize.cu), callable from plain C++17 (no CUDA
// types, no std::span). Internal to kernels/: callers use batch_quantize.h, which validates the
// tensors and turns the returned cudaError_t codes (0 = success) into absl::Status.
// Thread-safe: each call writes only the caller's table buffers and enqueues work on `stream`.
#ifndef REFIT_KERNELS_BATCH_LAUNCH_H_
#define REFIT_KERNELS_BATCH_LAUNCH_H_

#include <cstddef>
#include <cstdint>

#include "kernels/launch.h"

namespace refit::kernels::launch {

// One tensor of a batched NVFP4 conversion; device pointers.
struct Nvfp4Item {
  const void* in;                  // 16-byte aligned, `n` elements
  int64_t n;                       // > 0, a multiple of 16
  uint8_t* q;                      // 4-byte aligned
  uint8_t* scales;
  float* scale_2;
  float* amax;                     // holds +0 before the batch runs; receives max|x|
  unsigned long long* first_bad;   // nullable: lowered to the first non-finite flat index
};

struct CopyItem {
  void* dst;
  const void* src;
  uint64_t bytes;
};

// Bytes of descriptor table (pinned host and device alike) a batch of `count` items needs.
uint64_t Nvfp4BatchTableBytes(size_t count);
uint64_t CopyBatchTableBytes(size_t count);

// Writes the descriptor table of `items` into `host_table` (pinned), copies it to `device_table`
// with one cudaMemcpyAsync, then launches the amax kernel over every item and the encode kernel
// over every item (NVFP4), or the copy kernel (copies). Both tables must stay untouched until the
// stream has passed the work.
int Nvfp4Batch(const Nvfp4Item* items, size_t count, Input input, bool te, void* host_table, void* device_table,
               void* stream);
int CopyBatch(const CopyItem* items, size_t count, void* host_table, void* device_table, void* stream);

}  // namespace refit::kernels::launch

#endif  // REFIT_KERNELS_BATCH_LAUNCH_H_
