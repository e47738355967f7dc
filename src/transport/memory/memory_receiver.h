// An in-process data plane: payloads handed over by pointer, matched by tag. For unit tests and
// the CPU session benchmark, where the core runs without sockets; not a deployable transport.
//
// Threading: Put and Cancel from any thread; Receive from the session's receiver thread.
#ifndef REFIT_TRANSPORT_MEMORY_MEMORY_RECEIVER_H_
#define REFIT_TRANSPORT_MEMORY_MEMORY_RECEIVER_H_

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "storage/memory.h"
#include "transport/transport.h"

namespace refit::transport {

class MemoryReceiver final : public Receiver {
 public:
  MemoryReceiver() = default;
  // Receives into slots of `slot_memory` (e.g. device memory, standing in for an NCCL ring in
  // GPU tests); such a receiver checks integrity itself, as device data planes do, so the session
  // reads no slot back to verify a checksum. REQUIRES: `slot_memory` outlives the receiver.
  explicit MemoryReceiver(storage::Memory* slot_memory) : slot_memory_(slot_memory) {}
  bool ChecksIntegrity() const override { return slot_memory_ != nullptr; }
  // `payload` must outlive its receipt.
  void Put(uint64_t tag, const std::vector<uint8_t>* payload) {
    absl::MutexLock lock(&mu_);
    payloads_[tag] = payload;
  }
  std::string Endpoint() const override { return "memory"; }
  absl::StatusOr<uint64_t> Receive(uint64_t tag, void* dst, uint64_t capacity, absl::Time deadline) override {
    absl::MutexLock lock(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cancelled_ || payloads_.count(tag) > 0; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) return absl::DeadlineExceededError("receive");
    if (cancelled_) return absl::CancelledError("receive cancelled");
    const std::vector<uint8_t>* p = payloads_[tag];
    payloads_.erase(tag);
    if (p->size() > capacity) return absl::InvalidArgumentError("message larger than the slot");
    if (slot_memory_ != nullptr) {
      absl::Status st = slot_memory_->CopyFromHost(dst, p->data(), p->size());
      if (!st.ok()) return st;
    } else {
      std::memcpy(dst, p->data(), p->size());
    }
    return p->size();
  }
  void Cancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  void Reset() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = false;
  }
  void DisconnectPeers() override { ++disconnects_; }
  int disconnects() const { return disconnects_; }

 private:
  storage::Memory* const slot_memory_ = nullptr;
  absl::Mutex mu_;
  std::map<uint64_t, const std::vector<uint8_t>*> payloads_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  int disconnects_ = 0;
};

}  // namespace refit::transport

#endif  // REFIT_TRANSPORT_MEMORY_MEMORY_RECEIVER_H_
