// Committer: writes a validated session's staged bytes into the engine's registered storage, in
// place, then recomputes derived parameters from the staged checkpoint-format values (never from
// engine memory, so nothing is applied twice). REQUIRES: the engine is paused for the whole call.
// Thread-compatible: one commit at a time.
#ifndef REFIT_REFIT_COMMITTER_H_
#define REFIT_REFIT_COMMITTER_H_

#include <vector>

#include "absl/status/statusor.h"
#include "refit/converter.h"
#include "refit/planner.h"
#include "refit/staging.h"
#include "storage/engine_storage.h"

namespace refit {

struct CommitStats {
  uint64_t bytes_written = 0;
  uint32_t params_written = 0;
  uint32_t derived_written = 0;
};

// Computes derived parameter `d` from the staged source bytes into `out` (target nbytes).
absl::Status ComputeDerived(const DerivedTarget& d, const storage::ParamInfo& target, const uint8_t* from,
                            uint8_t* out);

// Copies every produced parameter from staging into `storage` (host→engine or device→engine by
// the staging kind), then each derived parameter whose source was produced, computed by
// `converter` into `scratch` (a staging pool buffer) from the staged source.
absl::StatusOr<CommitStats> CommitStaged(const Planner& planner, const Staging& staging, Converter& converter,
                                         StagingPool& scratch, const std::vector<size_t>& produced,
                                         storage::EngineStorage& storage);

}  // namespace refit

#endif  // REFIT_REFIT_COMMITTER_H_
