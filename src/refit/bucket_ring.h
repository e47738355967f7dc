// A bounded ring of bucket-sized host slots: the receiver fills slot k+1 while the converter
// reads slot k. Memory = bucket_bytes x slots, allocated once per daemon.
// Thread-safe.
#ifndef REFIT_REFIT_BUCKET_RING_H_
#define REFIT_REFIT_BUCKET_RING_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace refit {

class BucketRing {
 public:
  BucketRing(uint32_t slots, uint64_t slot_bytes);
  // A free slot, or -1 once Cancel() was called. Blocks while all slots are in use.
  int Acquire();
  void Release(int slot);
  void Cancel();
  void Reset();
  uint8_t* data(int slot) { return slots_[slot].get(); }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint64_t total_bytes() const { return slot_bytes_ * slots_.size(); }

 private:
  const uint64_t slot_bytes_;
  std::vector<std::unique_ptr<uint8_t[]>> slots_;
  absl::Mutex mu_;
  std::vector<int> free_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace refit

#endif  // REFIT_REFIT_BUCKET_RING_H_
