// Node's side of engine groups (GroupMember, docs/architecture.md "Engine groups"): the group
// version's commit split at the resume (copied, the engine paused until the coordinator resumes
// it), and its abort (the version the engine held written back from staging). Loop thread only,
// like the rest of Node.
#include <algorithm>
#include <array>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "refit/node.h"

namespace refit {
namespace {

Node::JoinHold HoldOf(std::string who, uint64_t engine, std::shared_ptr<EngineControl> control) {
  Node::JoinHold hold;
  hold.who = std::move(who);
  hold.engine = engine;
  hold.control = std::move(control);
  return hold;
}

Node::JoinHold ReleaseOf(std::string who, uint64_t engine, std::shared_ptr<EngineControl> control, uint64_t version,
                         std::string tag) {
  Node::JoinHold release = HoldOf(std::move(who), engine, std::move(control));
  release.release = true;
  release.version = version;
  release.tag = std::move(tag);
  return release;
}

}  // namespace

absl::StatusOr<std::shared_ptr<Commit>> Node::StartGroupCommit(const std::string& tag, absl::Duration deadline) {
  if (!group_.enabled()) return absl::FailedPreconditionError("this daemon is in no engine group (config group:)");
  absl::StatusOr<std::shared_ptr<StagedVersion>> held = versions_.Held(tag);
  if (!held.ok()) return held.status();
  if (absl::Status st = group_.StartCommit(tag, deadline); !st.ok()) return st;
  absl::StatusOr<std::shared_ptr<Commit>> started = StartKeptCommit(*std::move(held), false, /*group=*/true);
  if (!started.ok()) {
    group_.CommitEnded();
  } else {
    // The commit pauses and resumes what late join held while no peer answered.
    unanswered_engine_.reset();
    unanswered_ranks_.clear();
  }
  GroupChanged();
  return started;
}

bool Node::FinishGroupCopy(const Commit& commit) {
  if (version_commit_.get() != &commit || !commit.resume_pending()) return false;
  group_.Copied();
  GroupChanged();
  return true;
}

absl::StatusOr<std::shared_ptr<Commit>> Node::StartGroupResume(const std::string& tag) {
  if (absl::Status st = group_.StartResume(tag); !st.ok()) return st;
  GroupChanged();
  return version_commit_;
}

absl::StatusOr<Node::GroupRestore> Node::StartGroupAbort(const std::string& tag, bool expired) {
  if (!group_.enabled()) return absl::FailedPreconditionError("this daemon is in no engine group (config group:)");
  GroupRestore restore;
  if (group_.StartRestore(tag, expired)) {
    restore.commit = version_commit_;
    restore.before = versions_.Current();
    GroupChanged();
    return restore;
  }
  if (group_.RequestAbort(tag)) return restore;  // restored once copied (FinishGroupCopy's caller)
  if (group_.phase() == GroupPhase::kResuming || group_.phase() == GroupPhase::kRestoring) {
    if (group_.pending_tag() == tag) {
      return absl::UnavailableError(absl::StrCat("group version '", tag, "' is ", GroupPhaseName(group_.phase()),
                                                 " on this member; abort it again once that ends"));
    }
  }
  versions_.DropHeld(tag);  // prepared only (or nothing): the held version goes
  if (hooks_.on_versions) {
    const std::array<uint32_t, 3> n = versions_.Counts();
    hooks_.on_versions(n[0], n[1], n[2]);
  }
  return restore;
}

void Node::GroupPeersReported(const std::vector<GroupMember::PeerVersion>& peers, bool answered) {
  group_.PeersReported(peers);
  group_.PeersAsked(answered);
  GroupChanged();
}

std::vector<Node::JoinHold> Node::GroupJoinHolds() {
  std::vector<JoinHold> holds;
  if (!group_.enabled()) return holds;
  if (group_.phase() != GroupPhase::kJoining) {
    // A group version's commit took over what was held unanswered (it paused and resumed them).
    unanswered_engine_.reset();
    unanswered_ranks_.clear();
    return holds;
  }
  if (group_.MustHoldUnanswered()) {
    HoldUnanswered(holds);
  } else if (group_.group_version_known()) {
    HoldOthers(holds);
  }
  if (!committing()) ReleaseUnanswered(holds);
  if (!holds.empty()) {
    GroupChanged();
    if (hooks_.on_ranks) hooks_.on_ranks(Ranks());
  }
  return holds;
}

void Node::HoldUnanswered(std::vector<JoinHold>& holds) {
  if (!ranked_) {
    if (engine_ != nullptr && !engine_->gone && !engine_->dirty && unanswered_engine_ != engine_) {
      unanswered_engine_ = engine_;
      holds.push_back(
          HoldOf("the engine", engine_->id, std::shared_ptr<EngineControl>(engine_, engine_->control.get())));
    }
    return;
  }
  for (const std::shared_ptr<RankRecord>& rank : ranks_) {
    if (rank == nullptr || rank->gone || rank->dirty) continue;
    if (std::find(unanswered_ranks_.begin(), unanswered_ranks_.end(), rank) != unanswered_ranks_.end()) continue;
    unanswered_ranks_.push_back(rank);
    holds.push_back(HoldOf(absl::StrCat("engine rank ", rank->placement.tp_rank), rank->id, rank->control));
  }
}

void Node::HoldOthers(std::vector<JoinHold>& holds) {
  if (engine_ != nullptr && !engine_->gone && !committing()) {
    // Every rank (all registered: the engine is built) clean and on the engine's tag.
    const bool mixed = std::any_of(engine_->ranks.begin(), engine_->ranks.end(),
                                   [this](const auto& r) { return r->dirty || r->tag != engine_->tag; });
    if (group_.JoinHeld(engine_->tag, engine_->dirty || mixed)) {
      GroupChanged();
      return;
    }
  }
  // One held while no peer answered is paused already: marked dirty, it stays so.
  if (!ranked_) {
    if (engine_ != nullptr && !engine_->gone && group_.MustHold(engine_->tag, engine_->dirty)) {
      engine_->dirty = true;
      if (unanswered_engine_ == engine_) {
        unanswered_engine_.reset();
        return;
      }
      // The record keeps the control alive while the pause is in flight.
      holds.push_back(
          HoldOf("the engine", engine_->id, std::shared_ptr<EngineControl>(engine_, engine_->control.get())));
    }
    return;
  }
  for (const std::shared_ptr<RankRecord>& rank : ranks_) {
    if (rank == nullptr || rank->gone || !group_.MustHold(rank->tag, rank->dirty)) continue;
    rank->dirty = true;
    if (engine_ != nullptr) engine_->dirty = true;
    auto held = std::find(unanswered_ranks_.begin(), unanswered_ranks_.end(), rank);
    if (held != unanswered_ranks_.end()) {
      unanswered_ranks_.erase(held);
      continue;
    }
    holds.push_back(HoldOf(absl::StrCat("engine rank ", rank->placement.tp_rank), rank->id, rank->control));
  }
}

void Node::ReleaseUnanswered(std::vector<JoinHold>& holds) {
  if (group_.MustHoldUnanswered()) return;
  if (unanswered_engine_ != nullptr && !unanswered_engine_->gone && !unanswered_engine_->dirty) {
    EngineRecord& e = *unanswered_engine_;
    holds.push_back(ReleaseOf("the engine", e.id, std::shared_ptr<EngineControl>(unanswered_engine_, e.control.get()),
                              e.version, e.tag));
  }
  unanswered_engine_.reset();
  for (const std::shared_ptr<RankRecord>& rank : unanswered_ranks_) {
    if (rank->gone || rank->dirty) continue;
    holds.push_back(ReleaseOf(absl::StrCat("engine rank ", rank->placement.tp_rank), rank->id, rank->control,
                              rank->version, rank->tag));
  }
  unanswered_ranks_.clear();
}

}  // namespace refit
