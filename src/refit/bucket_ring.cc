#include "refit/bucket_ring.h"

namespace refit {

absl::StatusOr<std::unique_ptr<BucketRing>> BucketRing::Create(uint32_t slots, uint64_t slot_bytes,
                                                               storage::Memory& memory) {
  std::unique_ptr<BucketRing> ring(new BucketRing(slot_bytes, memory));
  absl::MutexLock lock(&ring->mu_);
  for (uint32_t i = 0; i < slots; ++i) {
    absl::StatusOr<std::shared_ptr<uint8_t>> slot = memory.Allocate(slot_bytes);
    if (!slot.ok()) return slot.status();
    ring->slots_.push_back(std::move(*slot));
    ring->free_.push_back(static_cast<int>(i));
  }
  return ring;
}

int BucketRing::Acquire() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](BucketRing* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) { return r->cancelled_ || !r->free_.empty(); }, this));
  if (cancelled_) return -1;
  int slot = free_.back();
  free_.pop_back();
  return slot;
}

void BucketRing::Release(int slot) {
  absl::MutexLock lock(&mu_);
  free_.push_back(slot);
}

void BucketRing::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
}

void BucketRing::Reset() {
  absl::MutexLock lock(&mu_);
  cancelled_ = false;
  free_.clear();
  for (size_t i = 0; i < slots_.size(); ++i) free_.push_back(static_cast<int>(i));
}

}  // namespace refit
