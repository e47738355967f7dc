#include "refit/group_member.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace refit {

const char* GroupPhaseName(GroupPhase phase) {
  switch (phase) {
    case GroupPhase::kJoining: return "joining";
    case GroupPhase::kIdle: return "idle";
    case GroupPhase::kCopying: return "copying";
    case GroupPhase::kCopied: return "copied";
    case GroupPhase::kResuming: return "resuming";
    case GroupPhase::kRestoring: return "restoring";
  }
  return "unknown";
}

GroupMember::GroupMember(GroupOptions options, const Clock* clock)
    : options_(std::move(options)), clock_(clock), phase_(GroupPhase::kJoining) {
  reason_ = "no group version has landed on this member since it started";
}

absl::Duration GroupMember::DeadlineLeft() const {
  if (phase_ != GroupPhase::kCopied) return absl::ZeroDuration();
  return std::max(absl::ZeroDuration(), deadline_ - clock_->Now());
}

absl::Status GroupMember::Ready() const {
  if (!enabled()) return absl::OkStatus();
  if (dirty_) return absl::UnavailableError(absl::StrCat("group ", options_.name, " dirty: ", reason_));
  if (phase_ == GroupPhase::kJoining) {
    return absl::UnavailableError(absl::StrCat("group ", options_.name, ": joining: ", reason_));
  }
  return absl::OkStatus();
}

absl::Status GroupMember::StartCommit(const std::string& tag, absl::Duration deadline) {
  if (!enabled()) return absl::FailedPreconditionError("this daemon is in no engine group (config group:)");
  if (tag.empty()) return absl::InvalidArgumentError("a group version needs a tag");
  if (phase_ != GroupPhase::kIdle && phase_ != GroupPhase::kJoining) {
    return absl::FailedPreconditionError(absl::StrCat("group ", options_.name, ": version '", pending_, "' is ",
                                                      GroupPhaseName(phase_), "; resume or abort it first"));
  }
  joining_before_ = phase_ == GroupPhase::kJoining;
  pending_ = tag;
  abort_requested_ = false;
  pending_deadline_ = deadline > absl::ZeroDuration() ? deadline : options_.decision_timeout;
  phase_ = GroupPhase::kCopying;
  return absl::OkStatus();
}

void GroupMember::Copied() {
  phase_ = GroupPhase::kCopied;
  deadline_ = clock_->Now() + pending_deadline_;
}

void GroupMember::CommitEnded() {
  // The engine never ran the version: the member serves what it served.
  phase_ = joining_before_ ? GroupPhase::kJoining : GroupPhase::kIdle;
  pending_.clear();
  deadline_ = absl::InfiniteFuture();
  ++aborts_;
}

absl::Status GroupMember::StartResume(const std::string& tag) {
  if (phase_ != GroupPhase::kCopied || pending_ != tag) {
    return absl::FailedPreconditionError(absl::StrCat("group ", options_.name, ": cannot resume '", tag,
                                                      "': this member is ", GroupPhaseName(phase_),
                                                      pending_.empty() ? "" : absl::StrCat(" with '", pending_, "'"),
                                                      dirty_ ? absl::StrCat(" (group dirty: ", reason_, ")") : ""));
  }
  phase_ = GroupPhase::kResuming;
  deadline_ = absl::InfiniteFuture();
  return absl::OkStatus();
}

void GroupMember::Resumed(bool ok) {
  phase_ = GroupPhase::kIdle;
  if (ok) {
    tag_ = pending_;
    dirty_ = false;
    reason_.clear();
    group_version_.clear();  // what the peers said while this member joined is history now
    conflict_.clear();
    ++commits_;
  } else {
    dirty_ = true;
    reason_ = absl::StrCat("the engine did not answer its resume with '", pending_, "'");
  }
  pending_.clear();
}

bool GroupMember::StartRestore(const std::string& tag, bool expired) {
  if (phase_ != GroupPhase::kCopied || pending_ != tag) return false;
  phase_ = GroupPhase::kRestoring;
  deadline_ = absl::InfiniteFuture();
  if (expired) {
    ++expiries_;
    // The coordinator vanished after this member copied: another member may have been resumed.
    dirty_ = true;
    reason_ = absl::StrCat("the coordinator sent neither resume nor abort of '", pending_,
                           "' before this member's deadline: it went back to the version it held");
  }
  return true;
}

void GroupMember::Restored(bool restored, const std::string& why) {
  phase_ = joining_before_ ? GroupPhase::kJoining : GroupPhase::kIdle;
  ++aborts_;
  if (!restored) {
    dirty_ = true;
    reason_ = absl::StrCat("aborting '", pending_, "' could not restore the version held before: ", why);
  }
  pending_.clear();
}

bool GroupMember::RequestAbort(const std::string& tag) {
  if (phase_ != GroupPhase::kCopying || pending_ != tag) return false;
  abort_requested_ = true;
  return true;
}

bool GroupMember::Expired() const { return phase_ == GroupPhase::kCopied && clock_->Now() >= deadline_; }

void GroupMember::EngineRegistered(const std::string& engine_tag, bool dirty) {
  if (!enabled() || phase_ != GroupPhase::kIdle) return;
  if (dirty || engine_tag != tag_) {
    phase_ = GroupPhase::kJoining;
    reason_ = dirty ? "the engine registered dirty (it lost refitd inside a commit window)"
                    : absl::StrCat("the engine registered holding '", engine_tag, "', the group's version here is '",
                                   tag_, "'");
  }
}

void GroupMember::PeersReported(const std::vector<PeerVersion>& peers) {
  if (!enabled() || peers.empty()) return;
  std::string first;
  bool differ = false;
  for (const PeerVersion& p : peers) {
    if (first.empty()) first = p.tag;
    differ = differ || p.tag != first;
  }
  if (differ) {
    std::vector<std::string> each;
    for (const PeerVersion& p : peers) each.push_back(absl::StrCat("member ", p.member, " serves '", p.tag, "'"));
    group_version_.clear();
    conflict_ = absl::StrJoin(each, ", ");
  } else {
    group_version_ = first;
    conflict_.clear();
  }
  if (phase_ == GroupPhase::kJoining) {
    reason_ = conflict_.empty() ? absl::StrCat("group ", options_.name, " is at version '", group_version_,
                                               "' (its peers said so); it has not landed on this member")
                                : absl::StrCat("group ", options_.name, "'s members serve different versions (",
                                               conflict_, "); the next group version brings every member to one");
  }
}

void GroupMember::PeersAsked(bool answered) {
  asked_ = true;
  answered_ = answered;
  if (answered && phase_ == GroupPhase::kJoining && !group_version_known()) {
    reason_ = "no group version has landed on this member since it started; the peers that answered know none either";
  }
}

bool GroupMember::MustHoldUnanswered() {
  if (!enabled() || !options_.ask_peers || !options_.hold_unanswered || phase_ != GroupPhase::kJoining) return false;
  if (!asked_ || answered_ || group_version_known()) return false;
  reason_ = absl::StrCat("no peer of group ", options_.name,
                         " answered: the group's version is unknown, so this member's engine is kept paused "
                         "until one does (group.peers_unreachable: hold)");
  return true;
}

bool GroupMember::MustHold(const std::string& engine_tag, bool dirty) {
  if (!enabled() || phase_ != GroupPhase::kJoining || !group_version_known()) return false;
  if (!dirty && conflict_.empty() && engine_tag == group_version_) return false;
  // A dirty engine (one held before, or one that lost refitd inside a commit window) is paused
  // already: nothing to pause, but the reason says so again, as the peers' latest answer
  // (PeersReported) replaced it.
  reason_ = absl::StrCat(
      "group ", options_.name, " is at version ",
      conflict_.empty() ? absl::StrCat("'", group_version_, "'") : absl::StrCat("unknown (", conflict_, ")"),
      "; this member's engine holds '", engine_tag, "'", dirty ? ", dirty" : "",
      ": its ranks are kept paused until the group's next version lands on this member");
  return !dirty;
}

bool GroupMember::JoinHeld(const std::string& engine_tag, bool dirty) {
  if (!enabled() || phase_ != GroupPhase::kJoining || dirty_ || dirty) return false;
  if (group_version_.empty() || !conflict_.empty() || engine_tag != group_version_) return false;
  phase_ = GroupPhase::kIdle;
  tag_ = group_version_;
  reason_.clear();
  return true;
}

}  // namespace refit
