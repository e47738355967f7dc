// VersionStore: the versions a node keeps in staging (hold: K, docs/versions.md): up to K held
// (staged only, committed later by tag), and the engine's current and previous committed full
// refits, kept for rollback while staging has room. It decides what a stage-only begin may
// hold, what gives way when a session needs room, and how versions rotate when one commits; it
// keeps the last dropped version's pool so the next session reuses its buffers.
//
// Threading: the loop thread only. A commit in flight shares the StagedVersion it writes and reads
// only its staging, pool and produced list, which nothing here changes meanwhile.
#ifndef REFIT_REFIT_VERSION_STORE_H_
#define REFIT_REFIT_VERSION_STORE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "refit/staged_version.h"
#include "refit/staging.h"

namespace refit {

class VersionStore {
 public:
  // `hold`: NodeOptions::hold (0: nothing is kept; every call below refuses or does nothing).
  explicit VersionStore(uint32_t hold) : hold_(hold) {}

  uint32_t hold() const { return hold_; }
  // Held, current and previous versions, held first, then current, then previous.
  std::vector<VersionInfo> List() const;
  uint64_t bytes() const;
  // How many versions are held, current, previous (indexed by StagedVersion::State).
  std::array<uint32_t, 3> Counts() const;

  // A stage-only begin tagged `tag`: refused (naming why) when nothing is held by this daemon, a
  // version of that tag is held, or `hold` versions are held.
  absl::Status CheckStageOnly(const std::string& tag, bool partial) const;
  // Room for a session of about `need` bytes within `limit` staging bytes: retained committed
  // versions give way (the previous, then the current one); held versions never do. Returns the
  // bytes the session may stage, or ResourceExhausted naming what holds the rest.
  absl::StatusOr<uint64_t> MakeRoom(uint64_t need, uint64_t limit);

  // Keeps a session's staging as a version in `state`.
  void Keep(std::shared_ptr<StagedVersion> version);
  // A session's full refit committed (`version` its staged copy, null for a partial refit): the
  // old current becomes previous, the old previous is dropped, `version` becomes current.
  void SessionCommitted(std::shared_ptr<StagedVersion> version);
  // A kept version committed: it becomes current, the old current previous, the old previous
  // (unless it is this one) is dropped.
  void KeptCommitted(const std::shared_ptr<StagedVersion>& version, uint64_t engine_version);

  // The held version tagged `tag` (NotFound naming the held tags), or the previous version
  // (FailedPrecondition when none is staged). FailedPrecondition when hold is 0.
  absl::StatusOr<std::shared_ptr<StagedVersion>> Held(const std::string& tag) const;
  absl::StatusOr<std::shared_ptr<StagedVersion>> Previous() const;
  // The current version, the one the engine serves (null when it is not staged).
  std::shared_ptr<StagedVersion> Current() const { return Find(StagedVersion::State::kCurrent); }
  // Drops the held version tagged `tag` (an aborted group version); false when none is held.
  bool DropHeld(const std::string& tag);

  // Every version dropped (the engine they were converted for left), the spare pool too.
  void Clear();
  // The pool a dropped version left, for the next session (same keys and sizes: no allocation);
  // null when none.
  std::unique_ptr<StagingPool> TakeSparePool() { return std::move(spare_pool_); }
  // A session's pool no version kept (aborted, refused, partial): the next session's, unless one
  // is spare already.
  void GiveBackPool(std::unique_ptr<StagingPool> pool);

 private:
  std::shared_ptr<StagedVersion> Find(StagedVersion::State state) const;
  void Drop(std::shared_ptr<StagedVersion> v);

  const uint32_t hold_;
  std::vector<std::shared_ptr<StagedVersion>> versions_;
  // At most one; freed with the engine.
  std::unique_ptr<StagingPool> spare_pool_;
};

}  // namespace refit

#endif  // REFIT_REFIT_VERSION_STORE_H_
