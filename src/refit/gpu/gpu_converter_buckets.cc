// GpuConverter's buckets: a bucket's end on the third stream and the wait for it, the two lanes,
// the arena's slots and drains, the device scratch, and the traced GPU times.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <memory>
#include <utility>

#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "common/trace.h"
#include "kernels/quantize.h"
#include "refit/gpu/gpu_converter_internal.h"

namespace refit::gpu_internal {

Failures GpuConverter::Sync() {
  cudaSetDevice(device_);
  Failures failed = WaitBucket(UINT64_MAX);
  Failures current = Drain();
  failed.insert(failed.end(), std::make_move_iterator(current.begin()), std::make_move_iterator(current.end()));
  retired_.clear();
  scratch_used_ = scratch_bucket_ = 0;  // both lanes are idle
  return failed;
}

uint64_t GpuConverter::EndBucket() {
  cudaSetDevice(device_);
  FlushNvfp4(failed_);
  FlushCopies(failed_);
  Submitted b;
  b.ticket = ++tickets_;
  absl::StatusOr<CudaEvent> done = TakeEvent();
  absl::StatusOr<std::unique_ptr<DeviceArena>> next = done.ok() ? TakeArena() : done.status();
  absl::Status st = next.status();
  if (st.ok()) st = EndOnThirdStream(done->get());
  if (!st.ok()) {
    // Completed here instead (the next bucket then waits for it), after whatever reached ends_.
    (void)cudaGetLastError();
    (void)ends_.Synchronize();
    if (next.ok()) spare_arenas_.push_back(std::move(*next));
    b.failed = Drain();
    if (done.ok()) spare_events_.push_back(std::move(*done));
  } else {
    b.done = std::move(*done);
    b.arena = std::move(arena_);
    arena_ = std::move(*next);
    b.pending = std::move(pending_);
    pending_.clear();
    b.failed = std::move(failed_);
    failed_.clear();
    lane_bytes_[0] = lane_bytes_[1] = 0;
  }
  b.retired = std::move(retired_);
  retired_.clear();
  b.start = std::move(bucket_start_);
  bucket_started_ = false;
  scratch_bucket_ = scratch_used_;
  submitted_.push_back(std::move(b));
  return submitted_.back().ticket;
}

Failures GpuConverter::WaitBucket(uint64_t ticket) {
  cudaSetDevice(device_);
  Failures failed;
  while (!submitted_.empty() && submitted_.front().ticket <= ticket) {
    Submitted b = std::move(submitted_.front());
    submitted_.pop_front();
    failed.insert(failed.end(), std::make_move_iterator(b.failed.begin()), std::make_move_iterator(b.failed.end()));
    if (!b.done) continue;  // completed at EndBucket
    cudaError_t e = cudaEventSynchronize(b.done.get());
    if (e != cudaSuccess) {
      failed.push_back({"(bucket)", CudaStatus(e, "GPU conversion")});
    } else {
      for (const Pending& p : b.pending) {
        absl::Status recorded = kernels::RecordedStatus(b.arena->probe(p.slot), p.name, p.claim);
        if (!recorded.ok()) failed.push_back({p.name, std::move(recorded)});
      }
    }
    if (e == cudaSuccess) TraceGpuTimes(b);
    b.arena->Reset();
    spare_arenas_.push_back(std::move(b.arena));
    if (b.done) spare_events_.push_back(std::move(b.done));
    if (b.start) spare_starts_.push_back(std::move(b.start));
  }
  // Nothing in flight reads the scratch any more: the next bucket starts it again.
  if (submitted_.empty() && scratch_used_ == scratch_bucket_) scratch_used_ = scratch_bucket_ = 0;
  return failed;
}

bool GpuConverter::BucketDone(uint64_t ticket) {
  for (const Submitted& b : submitted_) {
    if (b.ticket > ticket) break;
    if (b.done && cudaEventQuery(b.done.get()) == cudaErrorNotReady) return false;
  }
  (void)cudaGetLastError();  // an error shows at WaitBucket
  return true;
}

void GpuConverter::MarkBucketStart() {
  if (!timing_ || bucket_started_) return;
  bucket_started_ = true;
  TracePoint("daemon.bucket_first_launch");
  if (!bucket_start_) {
    if (!spare_starts_.empty()) {
      bucket_start_ = std::move(spare_starts_.back());
      spare_starts_.pop_back();
    } else if (absl::StatusOr<CudaEvent> e = CudaEvent::Create(device_, /*timing=*/true); e.ok()) {
      bucket_start_ = std::move(*e);
    }
  }
  if (bucket_start_ && cudaEventRecord(bucket_start_.get(), stream_.get()) != cudaSuccess) {
    (void)cudaGetLastError();
    spare_starts_.push_back(std::move(bucket_start_));
  }
}

void GpuConverter::TraceGpuTimes(Submitted& b) {
  if (!timing_ || !b.start) return;
  float busy = 0, wait = 0;
  if (cudaEventElapsedTime(&busy, b.start.get(), b.done.get()) == cudaSuccess) {
    TracePoint("daemon.gpu_bucket_us", static_cast<uint64_t>(std::max(0.0f, busy) * 1000));
  }
  if (last_done_ && cudaEventElapsedTime(&wait, last_done_.get(), b.start.get()) == cudaSuccess) {
    TracePoint("daemon.gpu_wait_us", static_cast<uint64_t>(std::max(0.0f, wait) * 1000));
  }
  (void)cudaGetLastError();
  // The bucket's end, kept to measure the next bucket's wait from (its event is not reused meanwhile).
  std::swap(last_done_, b.done);
}

absl::StatusOr<std::unique_ptr<DeviceArena>> GpuConverter::TakeArena() {
  if (!spare_arenas_.empty()) {
    std::unique_ptr<DeviceArena> a = std::move(spare_arenas_.back());
    spare_arenas_.pop_back();
    return a;
  }
  auto a = std::make_unique<DeviceArena>(*memory_, *pinned_, PerSlotTable());
  if (absl::Status st = a->Grow(arena_->capacity(), stream_.get()); !st.ok()) return st;
  MarkFork();
  return a;
}

absl::Status GpuConverter::EndOnThirdStream(cudaEvent_t done) {
  REFIT_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(main_end_.get(), stream_.get()), "marking the end of a bucket"));
  REFIT_RETURN_IF_ERROR(
      CudaStatus(cudaStreamWaitEvent(ends_.get(), main_end_.get(), 0), "marking the end of a bucket"));
  REFIT_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(join_.get(), side_.get()), "marking the end of a bucket"));
  REFIT_RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(ends_.get(), join_.get(), 0), "marking the end of a bucket"));
  REFIT_RETURN_IF_ERROR(arena_->CopyProbesAndReset(ends_.get()));
  return CudaStatus(cudaEventRecord(done, ends_.get()), "marking the end of a bucket");
}

absl::StatusOr<CudaEvent> GpuConverter::TakeEvent() {
  if (spare_events_.empty()) return CudaEvent::Create(device_, timing_);
  CudaEvent e = std::move(spare_events_.back());
  spare_events_.pop_back();
  return e;
}

cudaStream_t GpuConverter::Lane(uint64_t bytes) {
  const int k = lane_bytes_[1] < lane_bytes_[0] ? 1 : 0;
  if (k == 0) {
    lane_bytes_[0] += bytes;
    return stream_.get();
  }
  if (fork_pending_) {
    if (cudaStreamWaitEvent(side_.get(), fork_.get(), 0) != cudaSuccess) {
      (void)cudaGetLastError();
      lane_bytes_[0] += bytes;
      return stream_.get();
    }
    fork_pending_ = false;
  }
  lane_bytes_[1] += bytes;
  side_pending_ = true;
  Count(&GpuConverterStats::side_lane);
  return side_.get();
}

void GpuConverter::MarkFork() {
  if (cudaEventRecord(fork_.get(), stream_.get()) != cudaSuccess) {
    (void)cudaGetLastError();
    lane_bytes_[1] = UINT64_MAX;  // the side lane stays unused until the next bucket
    return;
  }
  fork_pending_ = true;
}

void GpuConverter::JoinSide() {
  if (!side_pending_) return;
  if (cudaEventRecord(join_.get(), side_.get()) != cudaSuccess ||
      cudaStreamWaitEvent(stream_.get(), join_.get(), 0) != cudaSuccess) {
    (void)cudaGetLastError();
    (void)side_.Synchronize();  // ordered the slow way
  }
  side_pending_ = false;
}

absl::StatusOr<DeviceArena::Slot> GpuConverter::TakeSlot() {
  if (arena_->full()) {
    Failures drained = Drain();
    failed_.insert(failed_.end(), std::make_move_iterator(drained.begin()), std::make_move_iterator(drained.end()));
    Count(&GpuConverterStats::drains);
    if (absl::Status st = arena_->Grow(arena_->used() + 1, stream_.get()); !st.ok()) return st;
    MarkFork();  // the side lane's next work waits for the new arena's reset
  }
  return arena_->Take();
}

Failures GpuConverter::Drain() {
  FlushNvfp4(failed_);
  FlushCopies(failed_);
  Failures failed = std::move(failed_);
  failed_.clear();
  JoinSide();
  absl::Status st = arena_->Collect(stream_.get());
  lane_bytes_[0] = lane_bytes_[1] = 0;
  fork_pending_ = false;  // both lanes are idle
  if (!st.ok()) failed.push_back({"(bucket)", st});
  for (const Pending& p : pending_) {
    absl::Status recorded = kernels::RecordedStatus(arena_->probe(p.slot), p.name, p.claim);
    if (st.ok() && !recorded.ok()) failed.push_back({p.name, std::move(recorded)});
  }
  pending_.clear();
  arena_->Reset();
  return failed;
}

absl::StatusOr<uint8_t*> GpuConverter::Scratch(uint64_t bytes) {
  uint64_t offset = (scratch_used_ + 255) & ~uint64_t{255};
  if (offset + bytes > scratch_bytes_) {
    if (offset > 0) {
      JoinSide();
      cudaError_t e = cudaStreamSynchronize(stream_.get());  // earlier tensors still read the buffer
      if (e != cudaSuccess) return CudaStatus(e, "GPU conversion");
      if (offset - std::min(offset, scratch_bucket_) + bytes <= scratch_bytes_) {
        // Earlier buckets' regions are free now: this bucket continues from the start.
        scratch_used_ = bytes;
        scratch_bucket_ = 0;
        return scratch_.get();
      }
    }
    uint64_t want = std::max<uint64_t>(offset + bytes, scratch_bytes_ * 2);
    absl::StatusOr<std::shared_ptr<uint8_t>> a = memory_->Allocate(want);
    if (!a.ok()) return a.status();
    retired_.push_back(std::move(scratch_));  // freed after the bucket's Sync
    scratch_ = std::move(*a);
    scratch_bytes_ = want;
    offset = 0;
  }
  scratch_used_ = offset + bytes;
  return scratch_.get() + offset;
}

}  // namespace refit::gpu_internal
