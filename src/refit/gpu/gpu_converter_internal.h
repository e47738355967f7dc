// The GPU converter's class, shared by the files that implement it; gpu_converter.h is its public
// side (NewGpuConverter and the options). Included only by refit/gpu/.
//
// Threading: as Converter's (one converter thread; Warm from any thread). Device work is enqueued
// on the converter's streams and ordered by the events below.
//
// Files: gpu_converter.cc (creation, a tensor's conversion, fused groups, batched runs),
// gpu_converter_planned.cc (ConvertPlanned: a tensor's whole plan on the device),
// gpu_converter_device_ops.cc (the other DeviceOps: amax passes, copies, layout steps,
// Synchronize), gpu_converter_buckets.cc (a bucket's end and wait, the lanes, slots and drains,
// the device scratch, traced GPU times).
#ifndef REFIT_REFIT_GPU_GPU_CONVERTER_INTERNAL_H_
#define REFIT_REFIT_GPU_GPU_CONVERTER_INTERNAL_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/cuda_handles.h"
#include "common/trace.h"
#include "kernels/batch_copy.h"
#include "kernels/batch_quantize.h"
#include "refit/converter.h"
#include "refit/gpu/device_arena.h"
#include "refit/gpu/gpu_converter.h"
#include "storage/memory.h"

namespace refit::gpu_internal {

using Failures = std::vector<std::pair<std::string, absl::Status>>;

class GpuConverter final : public Converter, public DeviceOps {
 public:
  static absl::StatusOr<std::unique_ptr<Converter>> Create(int device, const GpuConverterOptions& options);

  // The streams are drained before the arena's buffers go; they are destroyed last.
  ~GpuConverter() override;

  storage::MemoryKind staging_kind() const override { return storage::MemoryKind::kDevice; }

  void Warm() override;

  absl::Status Convert(const TensorPlan& plan, const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                       std::span<const formats::MutableBytes> outs, const formats::QuantizeOptions& options) override;

  DeviceOps* device_ops() override { return options_.device_ops ? this : nullptr; }

  absl::Status ConvertPlanned(const TensorPlan& plan, const TensorDesc& desc, const uint8_t* src,
                              storage::MemoryKind src_kind, std::span<const formats::MutableBytes> outs,
                              const formats::QuantizeOptions& options, const PlannedAmax& planned) override;
  absl::Status ResetAmax(float* amax) override;
  absl::Status AccumulateAmax(const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                              const formats::QuantizeOptions& options, float* amax) override;
  absl::Status Copy(uint8_t* dst, const uint8_t* src, uint64_t bytes, storage::MemoryKind src_kind) override;
  absl::Status CopyMany(std::span<const CopyRegion> regions) override;
  absl::StatusOr<bool> ConvertAmaxGroup(formats::Format format, std::span<const GroupMember> members,
                                        const formats::QuantizeOptions& options) override;
  absl::Status Copy2D(uint8_t* dst, uint64_t dst_pitch, const uint8_t* src, uint64_t src_pitch, uint64_t width,
                      uint64_t height) override;
  absl::Status Zero(uint8_t* dst, uint64_t bytes) override;
  absl::Status Swizzle128x4(const uint8_t* s, int64_t batch, int64_t rows, int64_t cols, uint8_t* out,
                            uint64_t out_bytes) override;
  absl::Status PackUe8m0(const float* sf, int64_t groups, int64_t mn, int64_t kb, int32_t* out, uint64_t out_words,
                         const std::string& name) override;
  absl::Status AddOne(const uint8_t* w, DType dtype, int64_t n, uint8_t* out) override;
  absl::Status Synchronize() override;

  Failures Sync() override;

  // The bucket's runs are launched; a third stream (ends_) waits for the bucket's work on both
  // lanes, copies its probe words back, resets them and marks the bucket's end with an event. The
  // lanes themselves go on with the next bucket at once (on another arena, already reset), so
  // that neither lane idles at a bucket's end while the other drains its last kernel.
  uint64_t EndBucket() override;
  Failures WaitBucket(uint64_t ticket) override;
  bool BucketDone(uint64_t ticket) override;

 private:
  struct Pending {
    std::string name;
    size_t slot;
    std::optional<float> claim = std::nullopt;  // a supplied amax the encode checked
  };
  // Tensors gathered for one batched launch, with their names for errors.
  struct Nvfp4Run {
    kernels::Nvfp4BatchKind kind{};
    std::vector<kernels::Nvfp4BatchItem> items;
    std::vector<std::string> names;
    uint64_t bytes = 0;
  };
  struct CopyRun {
    std::vector<kernels::CopyBatchItem> items;
    std::vector<std::string> names;
    uint64_t bytes = 0;
  };
  // A bucket ended (EndBucket) and not yet waited for.
  struct Submitted {
    uint64_t ticket = 0;
    CudaEvent done;                      // after its work on both lanes and its probe copy; empty: completed
    std::unique_ptr<DeviceArena> arena;  // its slots, probe words copied back
    std::vector<Pending> pending;
    Failures failed;                                // found before it ended (failed launches)
    std::vector<std::shared_ptr<uint8_t>> retired;  // scratch buffers its work may still read
    CudaEvent start;                                // traced runs: recorded before its first work (MarkBucketStart)
  };

  // Traced runs (REFIT_TRACE_FILE) only: a timing event on the main lane before a bucket's first
  // work, so that WaitBucket can trace how long the GPU worked on the bucket and how long the
  // main lane waited for it after the bucket before ended ("daemon.gpu_bucket_us",
  // "daemon.gpu_wait_us"): the host's issue against the kernels' own time.
  void MarkBucketStart();
  void TraceGpuTimes(Submitted& b);

  // A spare arena (reset behind its last bucket's probe copy), or a new one, reset on the main
  // lane (the side lane waits for that: only until the converter has one arena per bucket in flight).
  absl::StatusOr<std::unique_ptr<DeviceArena>> TakeArena();
  // EndBucket's work on ends_: after the bucket's work on both lanes, the probe words' copy and
  // reset, then `done`. The lanes are not joined: the main lane still waits for the side lane's
  // work before its next device op (side_pending_ stays as it is).
  absl::Status EndOnThirdStream(cudaEvent_t done);
  absl::StatusOr<CudaEvent> TakeEvent();
  static uint64_t PerSlotTable() { return std::max(kernels::Nvfp4BatchTableBytes(1), kernels::CopyBatchTableBytes(1)); }

  GpuConverter(int device, const GpuConverterOptions& options) : device_(device), options_(options) {}

  // Two lanes (streams): whole tensors on the device go to the less loaded one, so that one
  // tensor's kernel runs while another's drains its last tiles. Everything else (the arena, batched
  // runs, host inputs, every DeviceOps call) is on the main lane, ordered against the side lane:
  // a device op waits for the side lane's work so far (it may read a tensor converted there),
  // and side-lane work enqueued after it waits for it (it may read what the op wrote).
  cudaStream_t Lane(uint64_t bytes);
  // Side-lane work enqueued from now on waits for the main lane's work so far.
  void MarkFork();
  // The main lane's work from now on waits for the side lane's work so far.
  void JoinSide();
  // Scope of one DeviceOps call on the main lane.
  struct OnMainLane {
    explicit OnMainLane(GpuConverter& c) : c(c) { c.JoinSide(); }
    ~OnMainLane() { c.MarkFork(); }
    GpuConverter& c;
  };

  void Count(uint64_t GpuConverterStats::*field, uint64_t n = 1) {
    if (options_.stats != nullptr) options_.stats->*field += n;
  }

  // `src` on the device: as it is, or (host memory) copied into this bucket's scratch.
  absl::StatusOr<const uint8_t*> DeviceInput(const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind);

  absl::Status Copy(const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                    std::span<const formats::MutableBytes> outs);

  absl::Status AddNvfp4(const kernels::Nvfp4BatchKind& kind, const kernels::Nvfp4BatchItem& item,
                        const std::string& name);

  // Launches the open runs; a run whose launch fails fails each of its tensors.
  void FlushNvfp4(Failures& failed);
  void FlushCopies(Failures& failed);

  // A slot for the next tensor; when the arena is full, drains the stream first and grows it.
  absl::StatusOr<DeviceArena::Slot> TakeSlot();

  // Launches the open runs, waits for the stream, reads every probe word back with one copy
  // (resetting them), and frees the slots. Returns every failure recorded since the last Drain.
  Failures Drain();

  // Device scratch for host inputs and transposes, bump-allocated: buckets in flight use
  // successive regions; it starts again at 0 once nothing in flight reads it (WaitBucket, Sync)
  // or after a synchronization when it is full. Grows (only after that synchronization) when one
  // bucket's own regions do not fit.
  absl::StatusOr<uint8_t*> Scratch(uint64_t bytes);

  static constexpr uint64_t kWarmBytes = 256;
  const int device_;
  const GpuConverterOptions options_;
  std::shared_ptr<uint8_t> warm_;  // Warm's target
  CudaStream stream_;              // the main lane
  CudaStream side_;                // the side lane
  CudaStream ends_;                // each bucket's end: probe copy and reset after both lanes (EndBucket)
  CudaEvent fork_, join_, main_end_;
  uint64_t lane_bytes_[2] = {0, 0};  // input bytes given to each lane since the last drain
  bool fork_pending_ = false;        // fork_ holds main-lane work the side lane has not waited for
  bool side_pending_ = false;        // the side lane has work the main lane has not waited for
  std::unique_ptr<storage::Memory> memory_;
  std::unique_ptr<storage::Memory> pinned_;
  std::unique_ptr<DeviceArena> arena_;
  std::shared_ptr<uint8_t> scratch_;
  std::vector<std::shared_ptr<uint8_t>> retired_;
  uint64_t scratch_bytes_ = 0;
  uint64_t scratch_used_ = 0;
  uint64_t scratch_bucket_ = 0;   // where the open bucket's scratch regions begin
  std::vector<Pending> pending_;  // tensors whose probe word is read at the next Drain
  Nvfp4Run nvfp4_;
  CopyRun copies_;
  std::vector<std::shared_ptr<uint8_t>> pack_chunks_;  // pack_ue8m0 check words, 4096 per chunk
  std::vector<std::string> pack_checks_;               // the parameter of each word in use
  Failures failed_;  // failures found before the next Sync (failed launches, mid-bucket drains)
  uint64_t tickets_ = 0;
  std::deque<Submitted> submitted_;  // ended buckets not yet waited for, oldest first
  std::vector<std::unique_ptr<DeviceArena>> spare_arenas_;
  std::vector<CudaEvent> spare_events_;
  const bool timing_ = TraceOn();
  bool bucket_started_ = false;
  CudaEvent bucket_start_;
  CudaEvent last_done_;
  std::vector<CudaEvent> spare_starts_;
};

}  // namespace refit::gpu_internal

#endif  // REFIT_REFIT_GPU_GPU_CONVERTER_INTERNAL_H_
