// The GPU converter: quantizes into device staging with the kernels of kernels/, which equal
// the CPU reference byte for byte. Host-resident inputs (UCX buckets in pinned slots) are first
// copied to a device scratch buffer; device-resident inputs (NCCL slots) are read in place.
// Built only with CUDA; this folder is the core's only CUDA adapter.
//
// Many small tensors (a MoE layer's experts) cost little each: NVFP4 tensors and small copies
// are gathered into runs converted by one launch per kernel (kernels/batch_quantize.h), and the
// non-finite checks of a whole bucket come back with one device-to-host copy at Sync.
//
// Two streams ("lanes"): each whole tensor read from device memory goes to the lane with fewer
// input bytes so far in the bucket, so that one tensor's kernel runs while another's drains its
// last tiles (a Llama-8B refit's conversion: 7.09 ms on one stream, 6.25 ms on two; kernel_bench
// --sequence). The arena, batched runs, host inputs and every DeviceOps call stay on the main
// lane, ordered against the side lane by events both ways.
#ifndef REFIT_REFIT_GPU_GPU_CONVERTER_H_
#define REFIT_REFIT_GPU_GPU_CONVERTER_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "refit/converter.h"

namespace refit {

// What a GPU converter did since it was created (for tests and benchmarks).
struct GpuConverterStats {
  uint64_t tensors = 0;        // Convert calls that enqueued work
  uint64_t batched_nvfp4 = 0;  // tensors converted in NVFP4 runs
  uint64_t batched_copies = 0; // tensors copied in copy runs
  uint64_t runs = 0;           // batched launches (each: one table upload + one or two kernels)
  uint64_t drains = 0;         // mid-bucket synchronizations because the slots ran out
  uint64_t planned = 0;        // tensors converted with the whole plan on the device (transposed, sharded, fused)
  uint64_t side_lane = 0;      // tensors converted on the second stream
  uint64_t grouped = 0;        // fused-group members converted in NVFP4 runs (ConvertAmaxGroup)
};

struct GpuConverterOptions {
  // A run is launched when it reaches this many tensors...
  size_t max_run_tensors = 256;
  // ... or, for NVFP4, this many input bytes. Each run costs a table upload and two launches
  // with their tails: a Qwen3-30B-A3B layer's experts (1.21 GB) took 2.20 ms in 16 MiB runs,
  // 1.75 ms in 64 MiB and 1.50 ms in 256 MiB on an H100 (kernel_bench, docs/benchmarks.md run 47),
  // though 16 MiB runs re-read their input from L2. 64 MiB keeps most of that and a short tail
  // (the GPU starts a bucket once one run is issued).
  uint64_t max_nvfp4_run_bytes = uint64_t{64} << 20;
  // Copies up to this size go into copy runs; larger ones are one cudaMemcpyAsync each.
  uint64_t max_batched_copy_bytes = uint64_t{4} << 20;
  uint64_t max_copy_run_bytes = uint64_t{64} << 20;
  // Tensor slots (probe word, amax float, table room) allocated up front; doubled when a bucket
  // needs more (after draining the stream once).
  size_t initial_slots = 1024;
  // Batched runs on/off (off: every tensor takes the single-tensor path).
  bool batch = true;
  // The device side (Converter::device_ops): transposed, sharded and fused-NVFP4 tensors, layout
  // steps and derived parameters on the GPU. Off: those take the host path (for comparison).
  bool device_ops = true;
  // When set, updated by the converter; must outlive it.
  GpuConverterStats* stats = nullptr;
};

// A converter on CUDA device `device` with its own stream.
absl::StatusOr<std::unique_ptr<Converter>> NewGpuConverter(int device, const GpuConverterOptions& options = {});

}  // namespace refit

#endif  // REFIT_REFIT_GPU_GPU_CONVERTER_H_
