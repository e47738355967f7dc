// Checksums a commit uses to check itself (engine.verify_after_commit, docs/reliability.md
// "Verify after commit") and to name a kept version (hold: K, docs/versions.md). Every checksum is
// ParallelChecksum64 (common/parallel_checksum.h), computed where the bytes are: on the GPU for
// device memory (kernels/checksum.h), on the CPU for host memory.
// Thread-compatible: one commit at a time, on its worker thread.
#ifndef REFIT_REFIT_COMMIT_VERIFY_H_
#define REFIT_REFIT_COMMIT_VERIFY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "refit/committer.h"
#include "refit/planner.h"
#include "refit/staging.h"
#include "storage/engine_storage.h"
#include "storage/memory.h"

namespace refit {

// The checksum of the staged bytes each of `prepared`'s writes copies (`memory`: the staging's).
// Before the pause.
absl::StatusOr<std::vector<uint64_t>> StagedChecksums(const Planner& planner, const PreparedCommit& prepared,
                                                      storage::Memory& memory);

// A kept version's checksum: each staged tensor's, chained with its name by Checksum64, in name
// order. Equal staged bytes give equal checksums.
absl::StatusOr<uint64_t> StagingChecksum(const Staging& staging);

// The names of the written parameters whose bytes in `storage` do not match `expected` (from
// StagedChecksums). REQUIRES: the copy finished (storage flushed).
absl::StatusOr<std::vector<std::string>> VerifyWrites(const Planner& planner, const PreparedCommit& prepared,
                                                      const std::vector<uint64_t>& expected,
                                                      const storage::EngineStorage& storage);

// The corrupt_copy failpoint's fault: flips one bit of the first byte of the first written
// (nonempty) parameter in `storage`. Test builds only.
absl::Status CorruptOneByte(const PreparedCommit& prepared, storage::EngineStorage& storage);

}  // namespace refit

#endif  // REFIT_REFIT_COMMIT_VERIFY_H_
