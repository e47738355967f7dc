// Node's side of engine groups (GroupMember, docs/architecture.md "Engine groups"): the group
// version's commit split at the resume (copied, the engine paused until the coordinator resumes
// it), and its abort (the version the engine held written back from staging). Loop thread only,
// like the rest of Node.
#include <array>

#include "absl/strings/str_cat.h"
#include "refit/node.h"

namespace refit {

absl::StatusOr<std::shared_ptr<Commit>> Node::StartGroupCommit(const std::string& tag, absl::Duration deadline) {
  if (!group_.enabled()) return absl::FailedPreconditionError("this daemon is in no engine group (config group:)");
  absl::StatusOr<std::shared_ptr<StagedVersion>> held = versions_.Held(tag);
  if (!held.ok()) return held.status();
  if (absl::Status st = group_.StartCommit(tag, deadline); !st.ok()) return st;
  absl::StatusOr<std::shared_ptr<Commit>> started = StartKeptCommit(*std::move(held), false, /*group=*/true);
  if (!started.ok()) group_.CommitEnded();
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

}  // namespace refit
