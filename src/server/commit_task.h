// A commit as a daemon task: run on a kept worker thread (BlockingThreads), its engine resume sent
// and answered on the loop, then finished on the node; the call that started it (Session.commit,
// Registration.wake, Daemon.commitVersion, Daemon.rollback) is answered with its report and
// status once it finished. Event loop thread only.
#ifndef REFIT_SERVER_COMMIT_TASK_H_
#define REFIT_SERVER_COMMIT_TASK_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/failpoint.h"
#include "common/trace.h"
#include "kj/async.h"
#include "proto/wire.h"
#include "refit/commit.h"
#include "server/daemon_state.h"
#include "server/rpc_answer.h"
#include "server/status_causes.h"

namespace refit::server {

// Runs `commit` as a daemon task (a caller that disconnects cannot stop the swap halfway) and
// answers `context` with its report and status once it finished.
template <typename Context>
kj::Promise<void> RunCommitTask(DaemonState& state_ref, std::shared_ptr<Commit> commit, Context context) {
  DaemonState* state = &state_ref;
  auto done = state->blocking.Run([commit] { commit->Run(); })
                  .then([state, commit]() -> kj::Promise<void> {
                    if (!commit->resume_pending()) return kj::READY_NOW;
                    // The engine's resume goes out from here, and its answer is taken here.
                    auto resumed = kj::newPromiseAndFulfiller<void>();
                    auto fulfiller = std::make_shared<kj::Own<kj::PromiseFulfiller<void>>>(kj::mv(resumed.fulfiller));
                    if (Commit::StartLoopResume(commit, [fulfiller] { (*fulfiller)->fulfill(); })) {
                      return kj::mv(resumed.promise);
                    }
                    return state->blocking.Run([commit] { commit->RunResume(); });
                  })
                  .then([state, commit] {
                    state->node.FinishCommit(*commit);
                    state->Changed();  // a wake or a session's commit waiting for this one goes on now
                  })
                  .fork();
  state->tasks.add(done.addBranch());
  return done.addBranch().then([state, context]() mutable {
    TracePoint("daemon.commit_answered");
    const RefitReport& report = state->node.last_report();
    wire::ToWire(report, context.getResults().initReport());
    absl::Status status = CommitAnswer(report, state->node);
    if (status.ok() && report.outcome == Outcome::kCommitted) {
      // The engine serves the new version; the trainer has not been answered yet.
      status = REFIT_FAILPOINT(state->failpoints.get(), failpoints::kAfterCommit);
    }
    wire::ToWire(status, context.getResults().initStatus());
    // The ended session's teardown (threads joined, staging and ledger freed) once the answer is
    // on its way (kj::evalLast: after every event queued now).
    state->tasks.add(kj::evalLast([state] { state->node.ReleaseEnded(); }));
  });
}

// A session's commit waits while a kept version is being committed (the engine's commit window is
// one at a time); the session may end meanwhile (deadline, abort), which StartCommit then reports.
template <typename Context>
kj::Promise<void> CommitSessionWhenFree(DaemonState* state, uint64_t id, Context context) {
  if (state->node.version_committing() && state->node.active_session_id() == id) {
    return state->OnChange()
        .exclusiveJoin(state->timer.afterDelay(10 * kj::MILLISECONDS))
        .then([state, id, context]() mutable { return CommitSessionWhenFree(state, id, kj::mv(context)); });
  }
  absl::StatusOr<std::shared_ptr<Commit>> started = state->node.StartCommit(id);
  if (!started.ok()) return Answer(context, started.status());
  return RunCommitTask(*state, *started, kj::mv(context));
}

}  // namespace refit::server

#endif  // REFIT_SERVER_COMMIT_TASK_H_
