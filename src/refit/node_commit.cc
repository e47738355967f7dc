// Node's side of the commit protocol: starting a session's commit (its CommitSetup), applying
// the commit's outcome to the engine record (and its ranks), and ending the session with it, or
// keeping it staged for the engine's wake. The commit's phases themselves are Commit's
// (commit.h). Loop thread only, like the rest of Node.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "refit/node.h"

namespace refit {

absl::StatusOr<std::shared_ptr<Commit>> Node::StartCommit(uint64_t session_id) {
  absl::Status active = CheckActive(session_id);
  if (!active.ok()) return active;
  if (active_->committing) return absl::FailedPreconditionError("commit already in progress");
  if (active_->engine->gone) {
    return WithCause(absl::UnavailableError("the engine unregistered"), EndCause::kEngineError);
  }
  if (version_commit_ != nullptr && !active_->stage_only) {
    return WithCause(absl::UnavailableError(absl::StrCat("busy: the kept version '", version_commit_->setup().held->tag,
                                                         "' is being committed; commit again when it is done")),
                     EndCause::kBusy);
  }
  if (!active_->engine->control->Responsive()) {
    return absl::UnavailableError("the engine did not answer a pause or resume in time");
  }
  active_->committing = true;
  return std::make_shared<Commit>(SessionCommitSetup());
}

CommitSetup Node::CommitBase(std::shared_ptr<EngineRecord> engine) const {
  CommitSetup c;
  c.engine = std::move(engine);
  c.failpoints = options_.failpoints;
  c.on_phase = hooks_.on_commit_phase;
  c.pause_timeout = options_.pause_timeout;
  c.resume_timeout = options_.resume_timeout;
  c.resume_on_loop = options_.resume_on_loop;
  c.verify = options_.verify_after_commit;
  return c;
}

CommitSetup Node::SessionCommitSetup() const {
  CommitSetup c = CommitBase(active_->engine);
  c.session_id = active_->session->id();
  c.session = active_->session.get();
  c.to_tag = active_->tag;
  c.stage_only = active_->stage_only;
  c.keep = options_.hold > 0 && !active_->session->partial();
  c.asleep = active_->engine->asleep;
  c.refuse_asleep = options_.refuse_while_asleep;
  c.direct = active_->direct_pause;
  return c;
}

void Node::ApplyCommitOutcome(const Commit& c) {
  const CommitResult& result = c.result();
  EngineRecord& engine = *c.setup().engine;
  if (result.engine_dirty) engine.dirty = true;
  if (result.engine_version_set) {
    engine.version = c.from().version + 1;
    engine.tag = c.setup().to_tag;
    engine.dirty = false;
  }
  if (result.verify_mismatch) ++verify_mismatches_;
  if (engine.ranks.empty()) {
    if (hooks_.on_ranks) hooks_.on_ranks(Ranks());
    return;
  }
  // Engine ranks: every rank holds what the group holds, except a rank the pause or resume failed
  // on (it left, or did not answer): that rank is dirty, and with it the group.
  std::vector<size_t> failed;
  if (result.outcome != Outcome::kCommitted && engine.group_control != nullptr) {
    failed = engine.group_control->failed_ranks();
  }
  for (size_t r = 0; r < engine.ranks.size(); ++r) {
    RankRecord& rank = *engine.ranks[r];
    rank.version = engine.version;
    rank.tag = engine.tag;
    rank.dirty = engine.dirty;
  }
  for (size_t r : failed) {
    RankRecord& rank = *engine.ranks[r];
    rank.dirty = true;
    engine.dirty = true;
    const size_t tp = static_cast<size_t>(rank.placement.tp_rank);
    if (rank.gone && tp < left_dirty_.size() && ranks_[tp] == nullptr) left_dirty_[tp] = true;
  }
  if (hooks_.on_ranks) hooks_.on_ranks(Ranks());
}

const RefitReport& Node::FinishCommit(Commit& c) {
  if (c.setup().held != nullptr) return FinishVersionCommit(c);
  ApplyCommitOutcome(c);
  if (!active_ || active_->session->id() != c.session_id()) return last_report_;  // cannot happen: committing
  active_->direct_pause.reset();  // the commit settled the engine (resumed, or paused and dirty)
  const CommitSetup& setup = c.setup();
  const CommitResult& result = c.result();
  const bool staged_for_wake = setup.asleep && !setup.stage_only && result.outcome == Outcome::kStaged;
  if (staged_for_wake && !active_->ended_by && !setup.engine->gone) return AwaitWake(result);
  Outcome outcome = result.outcome;
  EndCause cause = result.cause;
  std::string reason = result.reason;
  if (staged_for_wake) {
    // Validated for the wake, but the session was ended meanwhile (operator, shutdown, engine gone).
    outcome = Outcome::kAborted;
    cause = EndCause::kEngineError;
    reason = "the engine unregistered while its refit was staged for the wake";
  }
  if (outcome == Outcome::kAborted && active_->ended_by) {
    // The node ended the session while its commit was still receiving (engine gone, operator,
    // shutdown): that is why it ended.
    cause = active_->ended_by->first;
    reason = active_->ended_by->second;
  }
  End(outcome, cause, std::move(reason), &result.times, result.staged_checksum);
  return last_report_;
}

const RefitReport& Node::AwaitWake(const CommitResult& result) {
  // Validated while the engine sleeps: the session stays, waiting for the wake to commit it.
  active_->committing = false;
  active_->awaiting_wake = true;
  active_->staged_times = result.times;
  active_->staged_checksum = result.staged_checksum;
  RefitReport r = active_->session->Report();
  r.times.validate_ms = result.times.validate_ms;
  r.times.finish_ms = result.times.finish_ms;
  r.times.plan_ms = active_->plan_ms;
  r.times.total_ms = absl::ToDoubleMilliseconds(absl::Now() - active_->begun);
  r.outcome = Outcome::kStaged;
  r.cause = EndCause::kNone;
  r.reason = result.reason;
  r.tag = active_->tag;
  last_report_ = r;
  if (hooks_.on_log) hooks_.on_log(r);
  NotifySession();
  return last_report_;
}

}  // namespace refit
