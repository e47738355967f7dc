// A version kept in staging (hold: K, docs/versions.md): a converted, validated full refit whose
// staging outlived its session, with what a later commit of it needs. Node owns the list; a
// commit in flight shares the one it writes. Not thread-safe: the loop thread changes state;
// a commit's worker reads only staging, pool and produced, which nothing changes meanwhile.
#ifndef REFIT_REFIT_STAGED_VERSION_H_
#define REFIT_REFIT_STAGED_VERSION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "refit/staging.h"

namespace refit {

// A converted, validated full refit kept in staging (hold > 0): held (staged only, never
// committed since), or the engine's current or previous committed version, kept for rollback.
// Shared by the node's list and a commit in flight.
struct StagedVersion {
  enum class State { kHeld, kCurrent, kPrevious };
  State state = State::kHeld;
  std::string tag;
  uint64_t session_id = 0;  // the session that staged it
  uint64_t version = 0;     // refitd's version when it was last committed (0 while only held)
  uint64_t bytes = 0;
  uint64_t checksum = 0;
  uint32_t tensors = 0;
  std::unique_ptr<StagingPool> pool;  // declared before staging: outlives it
  std::unique_ptr<Staging> staging;
  std::vector<size_t> produced;  // engine parameters it writes
};
const char* StagedVersionStateName(StagedVersion::State state);  // "held", "current", "previous"

// One line of Node::Versions().
struct VersionInfo {
  std::string tag;
  const char* state;
  uint64_t version, bytes, checksum, session_id;
};

}  // namespace refit

#endif  // REFIT_REFIT_STAGED_VERSION_H_
