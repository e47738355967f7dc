// Committer: writes a validated session into the engine's registered storage, in place, in two
// steps. PrepareCommit (before the engine pauses) rebuilds each produced engine parameter from
// the staged checkpoint-format pieces (fused/stacked slots assembled, layout steps applied) and
// recomputes derived parameters from the staged values of their sources — never from engine
// memory, so nothing is applied twice however many full or partial refits run. WritePrepared
// (the commit window, engine paused) only copies the prepared bytes into the registered
// addresses, so the pause is the copy and nothing else.
// Thread-compatible: one commit at a time.
#ifndef REFIT_REFIT_COMMITTER_H_
#define REFIT_REFIT_COMMITTER_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "refit/converter.h"
#include "refit/param_build.h"
#include "refit/planner.h"
#include "refit/staging.h"
#include "storage/engine_storage.h"

namespace refit {

struct CommitStats {
  uint64_t bytes_written = 0;
  uint32_t params_written = 0;
  uint32_t derived_written = 0;
};

// Computes derived op `op` of `from` (dtype, shape of `target`) into `out` (target nbytes).
absl::Status ComputeDerived(spec::DerivedOp op, const storage::ParamInfo& target, const uint8_t* from, uint8_t* out);

// A staged checkpoint-format piece by key, or nullptr.
using PieceLookup = std::function<const StagedTensor*(const std::string& key)>;

// Concatenates `pieces` (slot order) into the parameter `rule` assembles from them, pre-layout.
absl::StatusOr<Built> AssemblePieces(const spec::Rule& rule, const std::string& name,
                                     const std::vector<const StagedTensor*>& pieces);

// Assembles engine parameter `index` (pre-layout when `apply_layout` is false) from its slots.
absl::StatusOr<Built> BuildParam(const Planner& planner, size_t index, const PieceLookup& lookup, bool apply_layout);

// Everything a commit writes, each parameter's final bytes in the staging memory kind.
struct PreparedCommit {
  // Bytes [offset, offset + bytes) of parameter `index` from `data`: a whole parameter, or (with
  // PrepareOptions::pieces_in_place) one staged piece of a fused or stacked one.
  struct Write {
    size_t index;
    const uint8_t* data;
    uint64_t offset = 0;
    uint64_t bytes = 0;
  };
  std::vector<Write> writes;
  uint32_t params = 0;   // parameters written (a parameter written piece by piece counts once)
  uint32_t derived = 0;  // how many of them are derived parameters
  uint32_t built_on_device = 0;  // laid-out and derived parameters built by the GPU (DeviceOps)
  storage::MemoryKind kind = storage::MemoryKind::kHost;
  bool batched = false;  // the storage holds these writes as one prepared device batch
};

// Hands the writes to `storage` as one batch where it supports that (device staging into GPU
// engine memory: one copy kernel instead of one copy per parameter). Before the pause.
absl::Status PrepareStorageWrites(PreparedCommit& prepared, storage::EngineStorage& storage);

struct PrepareOptions {
  // A piece converted in place (StagedTensor::in_place, staging: direct) is where it belongs
  // already: it is never written. Otherwise:
  // Device staging: a fused or stacked parameter with no layout step is written piece by piece,
  // each staged piece copied to its offset in the engine's parameter in the commit window,
  // instead of assembled in a pool buffer first (which reads and writes its bytes once more
  // before the pause). Off, every write is a whole parameter (verify_after_commit checksums
  // whole parameters).
  bool pieces_in_place = false;
  // Only a commit that builds nothing: every write is a staged piece as it is (no layout step, no
  // derived parameter, no assembly copy). Anything else is kUnavailable, with nothing built or
  // allocated. Such a prepare reads no staged bytes, only where they are, so it may run while the
  // last conversions still run (Node: once every tensor arrived).
  bool only_placement = false;
};

// Builds every produced parameter (and derived one) before the engine pauses. A parameter that
// is one staged piece with no layout step is written from staging as it is; assembled or laid
// out ones are built into buffers of the staging pool. With device staging and `ops` (the GPU
// converter's device side) layout steps and derived parameters run on the GPU, byte-identical
// to the host build; otherwise laid-out ones are built on the host. Pool memory for a laid-out
// parameter on the device: its final bytes ("built:"), the assembled pieces when it has several
// ("pre:"), and one buffer per further layout step ("layout<k>:"), each kept for the next refit.
// A build error leaves the engine untouched.
absl::StatusOr<PreparedCommit> PrepareCommit(const Planner& planner, const Staging& staging,
                                             const std::vector<size_t>& produced, DeviceOps* ops = nullptr,
                                             PrepareOptions options = {});

// The commit window: copies the prepared bytes in (host→engine or device→engine), then flushes.
// REQUIRES: the engine is paused.
absl::StatusOr<CommitStats> WritePrepared(const Planner& planner, const PreparedCommit& prepared,
                                          storage::EngineStorage& storage);

// Both steps at once (tests and offline tools).
absl::StatusOr<CommitStats> CommitStaged(const Planner& planner, const Staging& staging,
                                         const std::vector<size_t>& produced, storage::EngineStorage& storage);

}  // namespace refit

#endif  // REFIT_REFIT_COMMITTER_H_
