// Staging: the converted, checkpoint-format bytes of one session, per engine parameter, held
// until commit, in host or GPU memory (StagingPool's kind). The pool keeps one buffer per engine
// parameter across sessions of a registration, so refits allocate nothing after the first.
// A session's staging is bounded by the configured limit (checked before allocating).
// Thread-safe: Allocate/Get lock; a buffer is written by one converter and read after Finish.
#ifndef REFIT_REFIT_STAGING_H_
#define REFIT_REFIT_STAGING_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "storage/memory.h"

namespace refit {

class StagingPool {
 public:
  explicit StagingPool(std::unique_ptr<storage::Memory> memory) : memory_(std::move(memory)) {}
  storage::MemoryKind kind() const { return memory_->kind(); }
  // The buffer of engine parameter `index`, at least `nbytes`, allocated on first use.
  absl::StatusOr<uint8_t*> Get(size_t index, uint64_t nbytes);
  uint64_t bytes() const;

 private:
  struct Buffer {
    std::shared_ptr<uint8_t> data;
    uint64_t bytes;
  };
  std::unique_ptr<storage::Memory> memory_;
  mutable absl::Mutex mu_;
  std::map<size_t, Buffer> buffers_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

class Staging {
 public:
  // REQUIRES: `pool` outlives this and serves one session at a time.
  Staging(uint64_t limit_bytes, StagingPool& pool) : limit_(limit_bytes), pool_(pool) {}

  // The buffer for engine parameter `index` in this session. ResourceExhausted past the limit;
  // AlreadyExists if the parameter is already staged.
  absl::StatusOr<uint8_t*> Allocate(size_t index, uint64_t nbytes);
  // The staged bytes of `index` in this session, or nullptr.
  const uint8_t* Get(size_t index) const;
  uint64_t bytes() const;
  uint64_t limit() const { return limit_; }
  storage::MemoryKind kind() const { return pool_.kind(); }

 private:
  const uint64_t limit_;
  StagingPool& pool_;
  mutable absl::Mutex mu_;
  std::map<size_t, uint8_t*> staged_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace refit

#endif  // REFIT_REFIT_STAGING_H_
