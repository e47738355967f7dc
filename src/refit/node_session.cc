// Node's active session from begin to its end: checking a call is for it, ranks that join and
// detach, announces, the trainer's and operator's aborts, its deadline, and End, the one place
// every session ends (its report, counters, kept staging); and the session ids. Loop thread only,
// like the rest of Node.
#include <algorithm>
#include <array>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "refit/node.h"

namespace refit {

absl::Status Node::CheckActive(uint64_t session_id) const {
  if (active_ && active_->session->id() == session_id) return absl::OkStatus();
  if (active_) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", session_id, " is not active (session ", active_->session->id(), " is)"));
  }
  if (last_report_.session_id == session_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", session_id, " is not active (it ended ", OutcomeName(last_report_.outcome),
                     last_report_.reason.empty() ? "" : ": ", last_report_.reason, ")"));
  }
  return absl::FailedPreconditionError(absl::StrCat("session ", session_id, " is not active (no session is)"));
}

absl::StatusOr<uint32_t> Node::Join(uint64_t session_id) {
  absl::Status active = CheckActive(session_id);
  if (!active.ok()) return active;
  if (active_->committing) {
    return absl::FailedPreconditionError(absl::StrCat("session ", session_id, " is committing; too late to join"));
  }
  if (active_->joined >= Session::kMaxRanks) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session ", session_id, " has ", active_->joined, " joined trainer ranks, the most it takes"));
  }
  ++active_->open_members;
  return ++active_->joined;
}

absl::Status Node::Detach(uint64_t session_id) {
  absl::Status active = CheckActive(session_id);
  if (!active.ok()) return active;
  if (active_->open_members == 0) {
    return absl::FailedPreconditionError(absl::StrCat("session ", session_id, " has no joined rank left to detach"));
  }
  --active_->open_members;
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> Node::Announce(uint64_t session_id, BucketHeader header, uint32_t rank) {
  absl::Status active = CheckActive(session_id);
  if (!active.ok()) return active;
  uint32_t seq = 0;
  absl::Status status = active_->session->Announce(std::move(header), &seq, rank);
  if (!status.ok()) {
    if (!active_->committing) {
      End(Outcome::kAborted,
          status.code() == absl::StatusCode::kFailedPrecondition ? EndCause::kInvalidInput
                                                                 : CauseOfSessionFailure(status),
          std::string(status.message()));
    }
    return status;
  }
  return seq;
}

void Node::EndByTrainer(uint64_t session_id, EndCause cause, const std::string& reason) {
  // A refit staged for the engine's wake no longer needs its trainer.
  if (!active_ || active_->session->id() != session_id || active_->committing || active_->awaiting_wake) return;
  End(Outcome::kAborted, cause, reason);
}

bool Node::AbortActive(const std::string& reason) {
  if (!active_) return false;
  AbortWith(EndCause::kClientAbort, reason);
  return true;
}

void Node::AbortWith(EndCause cause, const std::string& reason) {
  if (!active_) return;
  if (active_->committing) {
    // The commit's Finish returns at once (still receiving) or the commit runs to its end in
    // the window; either way it ends the session, with this cause if it did not commit.
    active_->session->Abort(reason);
    if (!active_->ended_by) active_->ended_by.emplace(cause, reason);
    return;
  }
  End(Outcome::kAborted, cause, reason);
}

bool Node::Poll(uint64_t session_id) {
  if (!active_ || active_->session->id() != session_id) return false;
  if (active_->committing) return true;      // the commit ends it
  if (active_->awaiting_wake) return false;  // validated and received: the wake commits it
  absl::Status failure = active_->session->failure();
  if (!failure.ok()) {
    End(failure.code() == absl::StatusCode::kResourceExhausted ? Outcome::kFailed : Outcome::kAborted,
        CauseOfSessionFailure(failure), std::string(failure.message()));
    return false;
  }
  if (clock_->Now() >= active_->deadline) {
    End(Outcome::kAborted, EndCause::kDeadlineExceeded, "session deadline passed");
    return false;
  }
  return true;
}

bool Node::Shutdown() {
  ReleaseEnded();
  AbortWith(EndCause::kDisconnected, "daemon shutting down");
  return committing();
}

void Node::End(Outcome outcome, EndCause cause, std::string reason, const PhaseTimes* times, uint64_t staged_checksum) {
  if (!active_) return;
  const bool sealed = active_->session->sealed();
  const bool ended_well = outcome == Outcome::kCommitted || outcome == Outcome::kStaged;
  if (!ended_well) active_->session->Abort(reason);
  if (active_->direct_pause != nullptr) {
    // staging: direct, ended before its commit settled the engine (the commit clears this): once
    // nothing of the session runs, the engine either holds a mix of versions (it stays paused and
    // dirty until a full refit lands) or is untouched (resumed at what it holds).
    active_->direct_pause.reset();
    EngineRecord& engine = *active_->engine;
    const bool was_dirty = engine.dirty;
    absl::StrAppend(&reason, SettleDirectSession(*active_->session, *engine.control, !engine.gone && !engine.dirty,
                                                 engine.version, engine.tag, absl::ZeroDuration(), engine.dirty));
    if (engine.dirty != was_dirty && hooks_.on_ranks) hooks_.on_ranks(Ranks());
  }
  RefitReport r = active_->session->Report();
  if (times != nullptr) {
    r.times.validate_ms = times->validate_ms;
    r.times.finish_ms = times->finish_ms;
    r.times.prepare_ms = times->prepare_ms;
    r.times.commit_ms = times->commit_ms;
    r.times.pause_ms = times->pause_ms;
    r.times.verify_ms = times->verify_ms;
  }
  r.times.plan_ms = active_->plan_ms;
  r.times.total_ms = absl::ToDoubleMilliseconds(absl::Now() - active_->begun);
  r.outcome = outcome;
  r.cause = outcome == Outcome::kCommitted ? EndCause::kNone : cause;
  r.reason = std::move(reason);
  r.version = outcome == Outcome::kCommitted ? active_->engine->version : 0;
  r.tag = active_->tag;
  switch (outcome) {
    case Outcome::kCommitted: ++committed_; break;
    case Outcome::kRefused: ++refused_; break;
    case Outcome::kStaged: ++staged_; break;
    default: ++aborted_; break;
  }
  if (outcome == Outcome::kStaged) {
    versions_.Keep(TakeActiveStaging(StagedVersion::State::kHeld, staged_checksum));
  } else if (outcome == Outcome::kCommitted && options_.hold > 0) {
    // The committed version stays staged for rollback (a partial refit's does not: no whole
    // staged version equals what the engine holds then).
    std::shared_ptr<StagedVersion> committed;
    if (!active_->session->partial()) {
      committed = TakeActiveStaging(StagedVersion::State::kCurrent, staged_checksum);
      committed->version = r.version;
    }
    versions_.SessionCommitted(std::move(committed));
  }
  last_report_ = r;
  if (hooks_.on_log) hooks_.on_log(r);
  if (!ended_well && r.cause != EndCause::kClientAbort && !sealed) {
    // Ended by refitd before every bucket was in (deadline, a corrupt bucket, engine gone,
    // shutdown): a trainer of this session may be blocked sending a bucket nobody will receive.
    // Its connection is dropped so the send fails; it reconnects for its next session. A session
    // refused or failed after its buckets were all received (validation, commit) blocks nobody:
    // its trainers keep their connections.
    receiver_.DisconnectPeers();
  }
  if (hooks_.on_report) hooks_.on_report(r);
  // A session's pool that no version kept (aborted, refused, partial) serves the next session.
  versions_.GiveBackPool(std::move(active_->own_pool));
  ReleaseEnded();
  if (outcome == Outcome::kCommitted) ended_ = std::move(active_);
  active_.reset();
  NotifySession();
}

void Node::NotifySession() {
  if (hooks_.on_session) hooks_.on_session(staging_bytes(), active_.has_value());
  if (hooks_.on_versions) {
    const std::array<uint32_t, 3> n = versions_.Counts();
    hooks_.on_versions(n[0], n[1], n[2]);
  }
}

uint64_t Node::NewSessionId() {
  // A random nonzero 32-bit nonce: data-plane tags are (id << 32) | seq and ids are handed out
  // only over the control plane, so a data-plane peer cannot address a live session without it.
  while (true) {
    const uint64_t id = entropy_();
    if (id == 0) continue;
    if (absl::StatusOr<uint64_t> taken = TakeSessionId(id); taken.ok()) return *taken;  // not a recent one
  }
}

absl::StatusOr<uint64_t> Node::TakeSessionId(uint64_t proposed) {
  if (proposed == 0) return NewSessionId();
  // A trainer's choice is as secret as the node's: it goes over the control plane only.
  if (proposed >> 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("session id ", proposed,
                                                   ": a trainer's choice must be below 2^32 (data-plane tags are "
                                                   "(id << 32) | seq)"));
  }
  if (std::find(recent_session_ids_.begin(), recent_session_ids_.end(), proposed) != recent_session_ids_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("session id ", proposed, " was one of this daemon's recent sessions; choose another"));
  }
  recent_session_ids_.push_back(proposed);
  if (recent_session_ids_.size() > kRecentSessionIds) recent_session_ids_.pop_front();
  return proposed;
}

}  // namespace refit
