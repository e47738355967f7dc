// SliceAssembler: puts a tensor back together from the slices trainer ranks push (e.g. its
// tensor-parallel shards, TensorSlice in types.h) so that it is converted exactly as if it had
// arrived whole. Each slice is copied into the tensor's assembly buffer as it arrives; the tensor
// is handed out once its slices tile the sliced dimension exactly once (no gap, no overlap).
// A slice that overlaps another, falls outside the tensor, or disagrees with the tensor's
// earlier slices (dtype, full shape, dimension) is refused, naming the tensor; the tensor is then
// dropped (its later slices are refused too), so the refit is refused at commit.
//
// Threading: Add() from one thread (the session's converter); Incomplete() from any thread.
#ifndef REFIT_REFIT_SLICE_ASSEMBLER_H_
#define REFIT_REFIT_SLICE_ASSEMBLER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "refit/types.h"
#include "storage/memory.h"

namespace refit {

class SliceAssembler {
 public:
  // Assembly buffers come from `memory` (the bucket ring's memory: the converter reads an
  // assembled tensor like a bucket); at most `limit_bytes` of them are held at once.
  SliceAssembler(storage::Memory& memory, uint64_t limit_bytes) : memory_(memory), limit_bytes_(limit_bytes) {}

  struct Whole {
    TensorDesc desc;                // the whole tensor: full shape and size, no slice
    std::shared_ptr<uint8_t> data;  // its bytes, in `memory`; keep until converted
  };
  // Adds one slice whose bytes are at `src` (memory of the same kind). Returns the whole tensor
  // when this slice completes it, nullopt while slices are missing. Errors: InvalidArgument
  // naming the tensor (see above), ResourceExhausted past the limit.
  absl::StatusOr<std::optional<Whole>> Add(const TensorDesc& slice, const uint8_t* src);

  // One line per tensor whose slices have not tiled it, e.g. "tensor 'x': slices cover 2048 of
  // 4096 rows of dimension 0; missing [2048, 4096)".
  std::vector<std::string> Incomplete() const;
  uint64_t held_bytes() const;

 private:
  struct Pending {
    DType dtype;
    Shape full;
    int dim;
    uint64_t bytes;
    std::shared_ptr<uint8_t> data;
    std::map<uint64_t, uint64_t> covered;  // start -> end of each slice added
    uint64_t covered_rows = 0;
    float amax = 0.0f;           // max of the slices' supplied amax so far
    bool amax_supplied = true;   // every slice so far supplied one
  };

  storage::Memory& memory_;
  const uint64_t limit_bytes_;
  mutable absl::Mutex mu_;
  std::map<std::string, Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> dropped_ ABSL_GUARDED_BY(mu_);
  uint64_t held_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace refit

#endif  // REFIT_REFIT_SLICE_ASSEMBLER_H_
