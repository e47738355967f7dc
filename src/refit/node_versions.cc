// Node's versions kept in staging (hold: K, docs/versions.md): keeping a session's staging as a
// version, dropping and listing versions, and the commits of kept versions (by tag, rollback).
// Loop thread only, like the rest of Node.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "refit/manifest_check.h"
#include "refit/node.h"

namespace refit {

const char* StagedVersionStateName(StagedVersion::State state) {
  switch (state) {
    case StagedVersion::State::kHeld: return "held";
    case StagedVersion::State::kCurrent: return "current";
    case StagedVersion::State::kPrevious: return "previous";
  }
  return "held";
}

void Node::KeepActive(StagedVersion::State state, uint64_t checksum) {
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
  versions_.push_back(std::move(v));
}

std::shared_ptr<StagedVersion> Node::Find(StagedVersion::State state) const {
  for (const auto& v : versions_) {
    if (v->state == state) return v;
  }
  return nullptr;
}

void Node::Drop(const std::shared_ptr<StagedVersion>& v) {
  versions_.erase(std::remove(versions_.begin(), versions_.end(), v), versions_.end());
  if (v.use_count() == 1 && v->pool != nullptr) {
    // Only the caller holds it now (no commit in flight uses it): its buffers serve the next
    // session instead of being freed and allocated again.
    v->staging.reset();
    spare_pool_ = std::move(v->pool);
  }
  NotifySession();
}

uint64_t Node::versions_bytes() const {
  uint64_t bytes = 0;
  for (const auto& v : versions_) bytes += v->bytes;
  return bytes;
}

std::vector<VersionInfo> Node::Versions() const {
  std::vector<VersionInfo> out;
  for (StagedVersion::State state :
       {StagedVersion::State::kHeld, StagedVersion::State::kCurrent, StagedVersion::State::kPrevious}) {
    for (const auto& v : versions_) {
      if (v->state != state) continue;
      out.push_back({v->tag, StagedVersionStateName(v->state), v->version, v->bytes, v->checksum, v->session_id});
    }
  }
  return out;
}

absl::StatusOr<std::shared_ptr<Commit>> Node::StartVersionCommit(const std::string& tag) {
  if (options_.hold == 0) return absl::FailedPreconditionError("this daemon holds no versions (config hold: 0)");
  std::vector<std::string> held;
  for (const auto& v : versions_) {
    if (v->state != StagedVersion::State::kHeld) continue;
    if (v->tag == tag) return StartKeptCommit(v, false);
    held.push_back(v->tag);
  }
  return absl::NotFoundError(absl::StrCat("no held version is tagged '", PrintableName(tag), "' (held: ",
                                          held.empty() ? "none" : absl::StrJoin(held, ", "), ")"));
}

absl::StatusOr<std::shared_ptr<Commit>> Node::StartRollback() {
  if (options_.hold == 0) return absl::FailedPreconditionError("this daemon holds no versions (config hold: 0)");
  std::shared_ptr<StagedVersion> previous = Find(StagedVersion::State::kPrevious);
  if (previous == nullptr) {
    return absl::FailedPreconditionError(
        "nothing to roll back to: the version committed before the current one is not staged (none was, or "
        "staging needed its memory)");
  }
  return StartKeptCommit(previous, true);
}

absl::StatusOr<std::shared_ptr<Commit>> Node::StartKeptCommit(std::shared_ptr<StagedVersion> v, bool rollback) {
  if (!engine_ || engine_->gone) return absl::UnavailableError("no engine is registered");
  if (version_commit_ != nullptr || (active_ && active_->committing)) {
    return absl::UnavailableError("busy: another commit is in progress");
  }
  if (!engine_->control->Responsive()) {
    return absl::UnavailableError("the engine did not answer a pause or resume in time");
  }
  if (engine_->asleep) {
    return absl::FailedPreconditionError("the engine is asleep: commit a kept version after it wakes");
  }
  auto commit = std::make_shared<Commit>();
  commit->generation_ = engine_->generation;
  commit->session_id_ = v->session_id;
  commit->engine_ = engine_;
  commit->failpoints_ = options_.failpoints;
  commit->hooks_ = &hooks_;
  commit->pause_timeout_ = options_.pause_timeout;
  commit->resume_timeout_ = options_.resume_timeout;
  commit->resume_on_loop_ = options_.resume_on_loop;
  commit->from_version_ = engine_->version;
  commit->from_tag_ = engine_->tag;
  commit->to_tag_ = v->tag;
  commit->dirty_at_start_ = engine_->dirty;
  commit->verify_ = options_.verify_after_commit;
  commit->held_ = std::move(v);
  commit->rollback_ = rollback;
  commit->staged_checksum_ = commit->held_->checksum;
  version_commit_ = commit;
  return commit;
}

const RefitReport& Node::FinishVersionCommit(Commit& c) {
  ApplyCommitOutcome(c);
  const EngineRecord& engine = *c.engine_;
  RefitReport r;
  r.session_id = c.held_->session_id;
  r.tag = c.held_->tag;
  r.outcome = c.outcome_;
  r.cause = c.outcome_ == Outcome::kCommitted ? EndCause::kNone : c.cause_;
  r.reason = c.reason_;
  if (c.outcome_ == Outcome::kCommitted) {
    r.reason = c.rollback_ ? absl::StrCat("rolled back to the version tagged '", c.held_->tag, "'")
                           : absl::StrCat("committed the held version '", c.held_->tag, "'");
  }
  r.version = c.outcome_ == Outcome::kCommitted ? engine.version : 0;
  r.bytes_out = c.held_->bytes;
  r.tensors = c.held_->tensors;
  r.times = c.times_;
  r.times.total_ms = c.times_.prepare_ms + c.times_.pause_ms + c.times_.verify_ms;
  switch (c.outcome_) {
    case Outcome::kCommitted: ++committed_; break;
    case Outcome::kRefused: ++refused_; break;
    default: ++aborted_; break;
  }
  if (c.outcome_ == Outcome::kCommitted && engine_.get() == &engine) {
    // The engine serves this version now: it is the current one, the one it replaced the previous.
    std::shared_ptr<StagedVersion> old_current = Find(StagedVersion::State::kCurrent);
    std::shared_ptr<StagedVersion> old_previous = Find(StagedVersion::State::kPrevious);
    if (old_previous != nullptr && old_previous != c.held_) Drop(old_previous);
    if (old_current != nullptr) old_current->state = StagedVersion::State::kPrevious;
    c.held_->state = StagedVersion::State::kCurrent;
    c.held_->version = r.version;
  }
  version_commit_.reset();
  last_report_ = r;
  if (hooks_.on_log) hooks_.on_log(r);
  if (hooks_.on_report) hooks_.on_report(r);
  NotifySession();
  return last_report_;
}

}  // namespace refit
