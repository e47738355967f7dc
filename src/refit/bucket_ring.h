// A bounded ring of bucket-sized host slots: the receiver fills slot k+1 while the converter
// reads slot k. Memory = bucket_bytes x slots, allocated once per daemon.
// Thread-safe.
#ifndef REFIT_REFIT_BUCKET_RING_H_
#define REFIT_REFIT_BUCKET_RING_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "storage/memory.h"

namespace refit {

class BucketRing {
 public:
  // Slots of `slot_bytes` in `memory` (the transport's bucket memory, transport/registry.h:
  // pinned host or device). REQUIRES: `memory` outlives the ring.
  static absl::StatusOr<std::unique_ptr<BucketRing>> Create(uint32_t slots, uint64_t slot_bytes,
                                                            storage::Memory& memory);
  // A free slot, or -1 once Cancel() was called. Blocks while all slots are in use.
  int Acquire();
  void Release(int slot);
  void Cancel();
  void Reset();
  uint8_t* data(int slot) { return slots_[slot].get(); }
  storage::MemoryKind kind() const { return kind_; }
  // Where the slots live (for buffers the converter reads like a slot, e.g. assembled slices).
  storage::Memory& memory() const { return *memory_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint64_t total_bytes() const { return slot_bytes_ * slots_.size(); }

 private:
  BucketRing(uint64_t slot_bytes, storage::Memory& memory)
      : slot_bytes_(slot_bytes), kind_(memory.kind()), memory_(&memory) {}
  const uint64_t slot_bytes_;
  const storage::MemoryKind kind_;
  storage::Memory* const memory_;  // outlives the ring (Create's contract)
  std::vector<std::shared_ptr<uint8_t>> slots_;
  absl::Mutex mu_;
  std::vector<int> free_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace refit

#endif  // REFIT_REFIT_BUCKET_RING_H_
