// Batched launches for runs of many small tensors (a MoE layer's experts, norms and small
// projections): the descriptors of a whole run go to the device in one cudaMemcpyAsync from
// pinned host memory, and each kernel is launched once for the run, instead of a few API calls
// and launches per tensor. Results are byte-identical to the single-tensor path (Quantize with a
// device amax; cudaMemcpyAsync): the kernels run the same per-tile device code.
//
// Threading: as quantize.h; every function only enqueues work on `stream` (a cudaStream_t as
// void*). The caller owns the table buffers and keeps them (and every tensor) untouched until the
// stream has passed the work.
#ifndef REFIT_KERNELS_BATCH_QUANTIZE_H_
#define REFIT_KERNELS_BATCH_QUANTIZE_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "formats/format.h"

namespace refit::kernels {

// One tensor of an NVFP4 batch; device pointers. Built by Nvfp4BatchItemFor.
struct Nvfp4BatchItem {
  const void* in;                 // 16-byte aligned
  int64_t elements;               // > 0
  uint8_t* q;                     // output 0 of formats::PlanOutputs, 4-byte aligned
  uint8_t* scales;                // output 1
  float* scale_2;                 // output 2
  float* amax;                    // holds +0 when the batch starts; receives the tensor's max|x|
  unsigned long long* first_bad;  // holds ~0ULL when the batch starts; nullptr under kPropagate
};

// What every tensor of one NVFP4 batch shares (the kernels are specialized on it).
struct Nvfp4BatchKind {
  formats::Format format;  // kNvfp4 or kNvfp4Te
  DType dtype;             // input: kBF16 or kF32
  formats::Fp32InputPolicy fp32_input;
  friend bool operator==(const Nvfp4BatchKind&, const Nvfp4BatchKind&) = default;
};

// Makes the same checks as Quantize (errors name `tensor_name`). Returns the batch item for
// converting `in` with its own amax (the two-pass path: amax into `amax`, non-finite input into
// `first_bad`), or nullopt when the tensor must take the single-tensor path: a format other than
// NVFP4, an empty tensor, or pointers not aligned for 16-byte vector access.
absl::StatusOr<std::optional<Nvfp4BatchItem>> Nvfp4BatchItemFor(formats::Format f, const formats::ConstTensor& in,
                                                                const formats::QuantizeOptions& options,
                                                                std::span<const formats::MutableBytes> outs,
                                                                std::string_view tensor_name, float* amax,
                                                                unsigned long long* first_bad);
Nvfp4BatchKind Nvfp4KindOf(formats::Format f, DType dtype, const formats::QuantizeOptions& options);

// Bytes of descriptor table a batch of `count` tensors needs, in pinned host memory and in
// device memory alike.
uint64_t Nvfp4BatchTableBytes(size_t count);

// For every item: *amax = max|x| (one launch over all items), then the encode against that amax
// (one launch). Byte-identical to ResetAmax + AccumulateAmax + Quantize(GlobalAmax{.device =
// amax}) per item. Writes the descriptor table to `host_table` (pinned, Nvfp4BatchTableBytes
// bytes, no earlier copy from it still in flight) and copies it to `device_table` (device, same
// size, 16-byte aligned) with one cudaMemcpyAsync.
absl::Status QuantizeNvfp4Batch(const Nvfp4BatchKind& kind, std::span<const Nvfp4BatchItem> items, void* host_table,
                                void* device_table, void* stream);

// One device-to-device copy of a batch.
struct CopyBatchItem {
  void* dst;
  const void* src;
  uint64_t bytes;
};

uint64_t CopyBatchTableBytes(size_t count);

// Copies every item with one table upload and one launch (tables as for QuantizeNvfp4Batch).
// Meant for small tensors: a large copy runs at full bandwidth through cudaMemcpyAsync, whose
// few microseconds of call overhead it amortizes itself.
absl::Status CopyBatch(std::span<const CopyBatchItem> items, void* host_table, void* device_table, void* stream);

}  // namespace refit::kernels

#endif  // REFIT_KERNELS_BATCH_QUANTIZE_H_
