// Node's side of the versions kept in staging (hold: K, docs/versions.md): a session's staging
// kept as a version, and the commits of kept versions (by tag, rollback). What is kept, and what
// gives way, is VersionStore's. Loop thread only, like the rest of Node.
#include "absl/strings/str_cat.h"
#include "refit/node.h"

namespace refit {

std::shared_ptr<StagedVersion> Node::TakeActiveStaging(StagedVersion::State state, uint64_t checksum) {
  auto v = std::make_shared<StagedVersion>();
  v->state = state;
  v->tag = active_->tag;
  v->session_id = active_->session->id();
  v->checksum = checksum;
  v->tensors = static_cast<uint32_t>(active_->session->ledger().tensors());
  v->produced = active_->session->ledger().Produced();
  v->staging = active_->session->TakeStaging();
  v->pool = std::move(active_->own_pool);
  v->bytes = v->staging->bytes();
  active_->staging_taken = true;
  return v;
}

absl::StatusOr<std::shared_ptr<Commit>> Node::StartVersionCommit(const std::string& tag) {
  absl::StatusOr<std::shared_ptr<StagedVersion>> held = versions_.Held(tag);
  if (!held.ok()) return held.status();
  return StartKeptCommit(*std::move(held), false);
}

absl::StatusOr<std::shared_ptr<Commit>> Node::StartRollback() {
  absl::StatusOr<std::shared_ptr<StagedVersion>> previous = versions_.Previous();
  if (!previous.ok()) return previous.status();
  return StartKeptCommit(*std::move(previous), true);
}

absl::StatusOr<std::shared_ptr<Commit>> Node::StartKeptCommit(std::shared_ptr<StagedVersion> v, bool rollback,
                                                              bool group) {
  if (!engine_ || engine_->gone) return WithCause(absl::UnavailableError("no engine is registered"), EndCause::kEngineError);
  if (!group && group_.enabled()) {
    // A member's own commit would switch its ranks alone: only the group's coordinator commits.
    return absl::FailedPreconditionError(absl::StrCat("this daemon serves part of engine group '",
                                                      group_.options().name,
                                                      "': its versions are committed by the group's coordinator"));
  }
  if (version_commit_ != nullptr || (active_ && active_->committing)) {
    return WithCause(absl::UnavailableError("busy: another commit is in progress"), EndCause::kBusy);
  }
  if (!engine_->control->Responsive()) {
    return WithCause(absl::UnavailableError("the engine did not answer a pause or resume in time"),
                     EndCause::kEngineError);
  }
  if (engine_->asleep) {
    return absl::FailedPreconditionError("the engine is asleep: commit a kept version after it wakes");
  }
  CommitSetup setup = CommitBase(engine_);
  setup.session_id = v->session_id;
  setup.to_tag = v->tag;
  setup.staged_checksum = v->checksum;
  setup.held = std::move(v);
  setup.rollback = rollback;
  setup.group = group;
  version_commit_ = std::make_shared<Commit>(std::move(setup));
  return version_commit_;
}

const RefitReport& Node::FinishVersionCommit(Commit& c) {
  ApplyCommitOutcome(c);
  const CommitSetup& setup = c.setup();
  const CommitResult& result = c.result();
  const StagedVersion& held = *setup.held;
  const EngineRecord& engine = *setup.engine;
  RefitReport r;
  r.session_id = held.session_id;
  r.tag = held.tag;
  r.outcome = result.outcome;
  r.cause = result.outcome == Outcome::kCommitted ? EndCause::kNone : result.cause;
  r.reason = result.reason;
  if (setup.group) {
    // The group member's phase follows what the commit did: ended before the copy, resumed, or
    // restored to the version it held.
    switch (group_.phase()) {
      case GroupPhase::kResuming: group_.Resumed(result.outcome == Outcome::kCommitted); break;
      case GroupPhase::kRestoring: group_.Restored(result.outcome == Outcome::kAborted, result.reason); break;
      default: group_.CommitEnded(); break;
    }
    if (result.outcome != Outcome::kCommitted) versions_.DropHeld(held.tag);  // the group aborts it everywhere
    GroupChanged();
  }
  if (result.outcome == Outcome::kCommitted) {
    r.reason = setup.group      ? absl::StrCat("committed the group version '", held.tag, "'")
               : setup.rollback ? absl::StrCat("rolled back to the version tagged '", held.tag, "'")
                                : absl::StrCat("committed the held version '", held.tag, "'");
  }
  r.version = result.outcome == Outcome::kCommitted ? engine.version : 0;
  r.bytes_out = held.bytes;
  r.tensors = held.tensors;
  r.times = result.times;
  r.times.total_ms = result.times.prepare_ms + result.times.pause_ms + result.times.verify_ms;
  switch (result.outcome) {
    case Outcome::kCommitted: ++committed_; break;
    case Outcome::kRefused: ++refused_; break;
    default: ++aborted_; break;
  }
  // The engine serves this version now: it is the current one, the one it replaced the previous.
  if (result.outcome == Outcome::kCommitted && engine_.get() == &engine) versions_.KeptCommitted(setup.held, r.version);
  version_commit_.reset();
  last_report_ = r;
  if (hooks_.on_log) hooks_.on_log(r);
  if (hooks_.on_report) hooks_.on_report(r);
  NotifySession();
  return last_report_;
}

}  // namespace refit
