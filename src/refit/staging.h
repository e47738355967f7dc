// Staging: the converted, checkpoint-format tensors of one session (this rank's part of each),
// keyed by checkpoint tensor name, held until commit in host or GPU memory (the pool's kind);
// the committer assembles engine parameters from them. The pool keeps one buffer per key across
// sessions of a registration, so repeated refits allocate nothing after the first. A session's
// staging is bounded by the configured limit (checked before allocating).
// Thread-safe: all methods lock; a buffer is written by one converter and read after Finish.
// Entries are stable in memory until released.
#ifndef REFIT_REFIT_STAGING_H_
#define REFIT_REFIT_STAGING_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/dtype.h"
#include "storage/memory.h"

namespace refit {

class StagingPool {
 public:
  explicit StagingPool(std::unique_ptr<storage::Memory> memory) : memory_(std::move(memory)) {}
  storage::MemoryKind kind() const { return memory_->kind(); }
  storage::Memory& memory() { return *memory_; }
  // The buffer for `key`, at least `nbytes`, allocated on first use and reused afterwards.
  absl::StatusOr<uint8_t*> Get(const std::string& key, uint64_t nbytes);
  uint64_t bytes() const;

 private:
  struct Buffer {
    std::shared_ptr<uint8_t> data;
    uint64_t bytes;
  };
  std::unique_ptr<storage::Memory> memory_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Buffer> buffers_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

struct StagedTensor {
  DType dtype;
  Shape shape;
  uint64_t nbytes = 0;
  uint8_t* data = nullptr;  // in the pool's memory (host or device)
  std::shared_ptr<uint8_t> owner;  // set when the tensor owns its bytes (offline assembly)
  bool in_place = false;  // `data` is where the engine's parameter holds it (staging: direct)
};

// staging: direct: where each staging key's bytes go in the engine's own memory (mapped by
// refitd, of the pool's memory kind), so that the converter writes them there and the commit
// copies nothing for them. Only keys whose place is known before anything arrives are here: a
// whole parameter, or one piece of a fused or stacked one at its offset (see PlanPlacement).
// Places are kept as (parameter, offset) under the bases of refitd's mappings now, so that an
// engine woken with the same parameters at new mappings takes the same places at its new bases
// (RebasePlacement) rather than having them planned again.
struct Placement {
  struct Place {
    uint32_t param;   // the engine parameter's index
    uint64_t offset;  // in it
    uint64_t bytes;
  };
  using Places = absl::flat_hash_map<std::string, Place>;
  std::shared_ptr<const Places> places = std::make_shared<const Places>();
  std::vector<uint8_t*> bases;  // by parameter index: where refitd maps it (null where nothing is placed)

  // `key`'s place, or nullptr if it is not placed.
  const Place* Find(const std::string& key) const {
    auto it = places->find(key);
    return it == places->end() ? nullptr : &it->second;
  }
  uint8_t* Address(const Place& place) const { return bases[place.param] + place.offset; }
  // Where `key` goes, or nullptr if it is not placed.
  uint8_t* AddressOf(const std::string& key) const {
    const Place* place = Find(key);
    return place == nullptr ? nullptr : Address(*place);
  }
  size_t size() const { return places->size(); }
  bool empty() const { return places->empty(); }
};

class Staging {
 public:
  // REQUIRES: `pool` outlives this and serves one session at a time.
  Staging(uint64_t limit_bytes, StagingPool& pool) : limit_(limit_bytes), pool_(pool) {}

  // A buffer for `key`. ResourceExhausted past the limit; AlreadyExists if already staged. With
  // a placement that has `key` at exactly `nbytes`, its place in the engine's memory (not counted
  // against the limit).
  absl::StatusOr<uint8_t*> Allocate(const std::string& key, DType dtype, const Shape& shape, uint64_t nbytes);
  // Buffers for `parts` back to back in one allocation, in order (an output split by rows over
  // engine ranks: the whole output is then written in place, no slicing). Errors as Allocate;
  // FailedPrecondition (nothing allocated) when a placement has any of the keys: the caller then
  // allocates them one by one.
  struct RunPart {
    const std::string* key;
    DType dtype;
    const Shape* shape;
    uint64_t nbytes;
  };
  absl::StatusOr<std::vector<uint8_t*>> AllocateRun(std::span<const RunPart> parts);
  // From now on, keys of `placement` are allocated where it says (staging: direct, once the
  // engine is paused). REQUIRES: `placement`'s addresses stay mapped while this staging lives.
  void Place(std::shared_ptr<const Placement> placement);
  // Bytes allocated in the engine's memory so far: what a session that ends without its commit
  // leaves written into the engine.
  uint64_t in_place_bytes() const;
  // Counts `nbytes` of other session memory (fused members held on the device) against the
  // limit; ResourceExhausted naming `what` past it. Unreserve gives them back.
  absl::Status Reserve(uint64_t nbytes, const std::string& what);
  void Unreserve(uint64_t nbytes);
  // The staged tensor, or nullptr.
  const StagedTensor* Get(const std::string& key) const;
  // The staged tensors of `keys`, in order, into `out` (under one lock: a stacked parameter has a
  // key per expert). The index of the first key not staged, or keys.size() when all are.
  size_t GetAll(std::span<const std::string> keys, std::vector<const StagedTensor*>& out) const;
  // Forgets `key` for this session (no-op when absent); the pool keeps its buffer.
  void Release(const std::string& key);
  uint64_t bytes() const;
  // Every staged key, sorted.
  std::vector<std::string> Keys() const;
  uint64_t limit() const { return limit_; }
  storage::MemoryKind kind() const { return pool_.kind(); }
  StagingPool& pool() const { return pool_; }

 private:
  const uint64_t limit_;
  StagingPool& pool_;
  mutable absl::Mutex mu_;
  absl::node_hash_map<std::string, StagedTensor> staged_ ABSL_GUARDED_BY(mu_);  // nodes: Get's pointers stay put
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<const Placement> placement_ ABSL_GUARDED_BY(mu_);
  uint64_t in_place_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace refit

#endif  // REFIT_REFIT_STAGING_H_
