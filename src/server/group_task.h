// An engine group member's calls as daemon tasks (docs/architecture.md "Engine groups"):
// Daemon.groupCommit (the held version copied into the paused engine, answered "copied" with the
// engine still paused, the member's deadline armed), Daemon.groupResume (the engine's resume,
// sent from the loop) and Daemon.groupAbort (the version the engine held written back, then its
// resume), and the deadline's own abort. Node and GroupMember hold the state; these run its
// steps on the worker threads and the loop, and answer. Event loop thread only.
#ifndef REFIT_SERVER_GROUP_TASK_H_
#define REFIT_SERVER_GROUP_TASK_H_

#include <algorithm>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/failpoint.h"
#include "kj/async.h"
#include "proto/wire.h"
#include "refit/commit.h"
#include "server/daemon_state.h"
#include "server/log.h"
#include "server/rpc_answer.h"
#include "server/status_causes.h"

namespace refit::server {

// The copied member's answer: the engine paused with `tag`'s bytes, awaiting the group's resume.
inline RefitReport CopiedReport(const Commit& commit, const GroupMember& group) {
  RefitReport r;
  r.session_id = commit.session_id();
  r.tag = commit.setup().to_tag;
  r.outcome = Outcome::kStaged;
  r.version = commit.from().version + 1;
  r.times = commit.result().times;
  r.reason = absl::StrCat("copied: the engine is paused holding '", r.tag, "' until the group resumes it (deadline in ",
                          absl::ToInt64Milliseconds(group.DeadlineLeft()), " ms)");
  return r;
}

// Restores the version the engine held (RunRestore on a worker), then finishes the commit on the
// node. The promise resolves once the engine was resumed at that version, or left dirty.
inline kj::Promise<void> RunGroupRestore(DaemonState* state, Node::GroupRestore restore, std::string reason) {
  auto commit = restore.commit;
  return state->blocking
      .Run([commit, before = restore.before, reason = std::move(reason)] { commit->RunRestore(before.get(), reason); })
      .then([state, commit] {
        const RefitReport& r = state->node.FinishCommit(*commit);
        LogEvent(LogLevel::kWarn, "group_restored")
            .Add("tag", commit->setup().to_tag)
            .Add("outcome", OutcomeName(r.outcome))
            .Add("reason", r.reason);
        state->Changed();
      });
}

// The member's deadline: once copied, unless the coordinator resumes or aborts `tag` first, the
// member restores the version it held and resumes (GroupMember: the group is marked dirty).
inline constexpr int64_t kGroupDeadlineGraceMs = 50;
inline kj::Promise<void> WatchGroupDeadline(DaemonState* state, std::string tag, bool grace = false) {
  const GroupMember& group = state->node.group();
  if (group.phase() != GroupPhase::kCopied || group.pending_tag() != tag) return kj::READY_NOW;
  if (!group.Expired()) {
    const int64_t left_ms = std::max<int64_t>(1, absl::ToInt64Milliseconds(group.DeadlineLeft()) + 1);
    return state->timer.afterDelay(left_ms * kj::MILLISECONDS).then([state, tag] {
      return WatchGroupDeadline(state, tag);
    });
  }
  if (!grace) {
    // A member stopped past its deadline (SIGSTOP, a long stall) may find the coordinator's resume
    // or abort already in its socket: those are read first.
    return state->timer.afterDelay(kGroupDeadlineGraceMs * kj::MILLISECONDS).then([state, tag] {
      return WatchGroupDeadline(state, tag, /*grace=*/true);
    });
  }
  absl::StatusOr<Node::GroupRestore> restore = state->node.StartGroupAbort(tag, /*expired=*/true);
  if (!restore.ok() || restore->commit == nullptr) return kj::READY_NOW;
  LogEvent(LogLevel::kWarn, "group_deadline").Add("tag", tag);
  return RunGroupRestore(
      state, *std::move(restore),
      absl::StrCat("group version '", tag, "': neither resume nor abort came before this member's deadline"));
}

// What a group call answers, set by its daemon task (a caller that disconnects cannot stop a
// group step halfway: the task runs on, the answer is dropped).
struct GroupAnswer {
  RefitReport report;
  absl::Status status;
};

// Runs `work` (which fills the answer) as a daemon task and answers `context` once it is done.
template <typename Context>
kj::Promise<void> AnswerWhenDone(DaemonState* state, kj::Promise<void> work, std::shared_ptr<GroupAnswer> answer,
                                 Context context) {
  auto done = work.fork();
  state->tasks.add(done.addBranch());
  return done.addBranch().then([answer, context]() mutable {
    wire::ToWire(answer->report, context.getResults().initReport());
    wire::ToWire(answer->status, context.getResults().initStatus());
  });
}

// Daemon.groupCommit after Node::StartGroupCommit: Run on a worker; copied, the answer is OK
// (outcome staged, "copied") and the deadline is armed; otherwise the commit's own outcome.
template <typename Context>
kj::Promise<void> RunGroupCopy(DaemonState& state_ref, std::shared_ptr<Commit> commit, Context context) {
  DaemonState* state = &state_ref;
  auto answer = std::make_shared<GroupAnswer>();
  auto work = state->blocking.Run([commit] { commit->Run(); }).then([state, commit, answer]() -> kj::Promise<void> {
    if (!state->node.FinishGroupCopy(*commit)) {
      // Ended before the copy: refused or failed, the engine as the commit left it.
      answer->report = state->node.FinishCommit(*commit);
      answer->status = CommitAnswer(answer->report, state->node);
      state->Changed();
      return kj::READY_NOW;
    }
    const std::string tag = commit->setup().to_tag;
    absl::Status hit = REFIT_FAILPOINT(state->failpoints.get(), failpoints::kGroupCopied);
    if (hit.ok() && state->node.group().abort_requested()) {
      hit = absl::AbortedError(
          absl::StrCat("group version '", tag, "' was aborted by the coordinator while it was copied"));
    }
    if (!hit.ok()) {
      // Aborted meanwhile, or (test builds) this member cannot report copied: it
      // restores what it held and refuses.
      answer->status = hit;
      absl::StatusOr<Node::GroupRestore> restore = state->node.StartGroupAbort(tag, false);
      if (!restore.ok() || restore->commit == nullptr) return kj::READY_NOW;
      return RunGroupRestore(state, *std::move(restore), std::string(hit.message())).then([state, answer] {
        answer->report = state->node.last_report();
      });
    }
    LogEvent(LogLevel::kInfo, "group_copied").Add("tag", tag);
    state->tasks.add(WatchGroupDeadline(state, tag));
    answer->report = CopiedReport(*commit, state->node.group());
    return kj::READY_NOW;
  });
  return AnswerWhenDone(state, kj::mv(work), answer, kj::mv(context));
}

// Daemon.groupResume after Node::StartGroupResume: the engine's resume, sent from the loop (or a
// worker), then the commit finished on the node and answered with its report.
template <typename Context>
kj::Promise<void> RunGroupResume(DaemonState& state_ref, std::shared_ptr<Commit> commit, Context context) {
  DaemonState* state = &state_ref;
  auto answer = std::make_shared<GroupAnswer>();
  auto resumed = kj::newPromiseAndFulfiller<void>();
  auto fulfiller = std::make_shared<kj::Own<kj::PromiseFulfiller<void>>>(kj::mv(resumed.fulfiller));
  kj::Promise<void> sent = Commit::StartLoopResume(commit, [fulfiller] { (*fulfiller)->fulfill(); })
                               ? kj::mv(resumed.promise)
                               : state->blocking.Run([commit] { commit->RunResume(); });
  auto work = sent.then([state, commit, answer] {
    answer->report = state->node.FinishCommit(*commit);
    answer->status = CommitAnswer(answer->report, state->node);
    state->Changed();
    LogEvent(LogLevel::kInfo, "group_resumed")
        .Add("tag", answer->report.tag)
        .Add("outcome", OutcomeName(answer->report.outcome));
    state->tasks.add(kj::evalLast([state] { state->node.ReleaseEnded(); }));
  });
  return AnswerWhenDone(state, kj::mv(work), answer, kj::mv(context));
}

// Daemon.groupAbort: copied, the version the engine held restored and resumed (answered OK with
// outcome aborted, or the failure that left the engine paused and dirty); held only, dropped.
template <typename Context>
kj::Promise<void> RunGroupAbort(DaemonState& state_ref, const std::string& tag, const std::string& why,
                                Context context) {
  DaemonState* state = &state_ref;
  absl::StatusOr<Node::GroupRestore> restore = state->node.StartGroupAbort(tag, false);
  if (!restore.ok()) return Answer(context, restore.status());
  auto answer = std::make_shared<GroupAnswer>();
  if (restore->commit == nullptr) {
    answer->report.tag = tag;
    answer->report.outcome = Outcome::kAborted;
    answer->report.cause = EndCause::kClientAbort;
    answer->report.reason =
        absl::StrCat("group version '", tag, "' aborted before this member copied it: nothing was written");
    return AnswerWhenDone(state, kj::READY_NOW, answer, kj::mv(context));
  }
  LogEvent(LogLevel::kWarn, "group_abort").Add("tag", tag).Add("reason", why);
  auto work = RunGroupRestore(state, *std::move(restore), absl::StrCat("group version '", tag, "' aborted: ", why))
                  .then([state, answer] {
                    answer->report = state->node.last_report();
                    if (answer->report.outcome != Outcome::kAborted) {
                      answer->status = CommitAnswer(answer->report, state->node);
                    }
                  });
  return AnswerWhenDone(state, kj::mv(work), answer, kj::mv(context));
}

}  // namespace refit::server

#endif  // REFIT_SERVER_GROUP_TASK_H_
