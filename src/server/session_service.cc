#include "server/session_service.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/trace.h"
#include "proto/wire.h"
#include "server/commit_task.h"
#include "server/log.h"
#include "server/rpc_answer.h"
#include "server/status_causes.h"

namespace refit::server {

SessionImpl::~SessionImpl() {
  // The trainer dropped its session (disconnect or done). An uncommitted session is aborted;
  // a commit in progress runs to its end on its own. A joined rank that detached is done.
  if (detached_) return;
  state_.node.EndByTrainer(id_, EndCause::kDisconnected,
                           member_ ? "a joined trainer rank disconnected before detaching" : "trainer disconnected");
  state_.Changed();
}

kj::Promise<void> SessionImpl::announce(AnnounceContext context) {
  TracePoint("daemon.announce_received");
  state_.Heat();
  if (detached_)
    return Answer(context, absl::FailedPreconditionError("this trainer rank has detached from the session"));
  absl::StatusOr<BucketHeader> header = wire::FromWire(context.getParams().getHeader());
  if (!header.ok()) {
    // A header that does not parse fails the session like one that does not check.
    state_.node.EndByTrainer(id_, EndCause::kInvalidInput, std::string(header.status().message()));
    return Answer(context, header.status());
  }
  absl::StatusOr<uint32_t> seq = state_.node.Announce(id_, std::move(*header), rank_);
  if (!seq.ok()) return Answer(context, seq.status());
  context.getResults().setSeq(*seq);
  return kj::READY_NOW;
}

kj::Promise<void> SessionImpl::detach(DetachContext context) {
  TracePoint("daemon.detach_received");
  if (!member_) {
    return Answer(context, absl::FailedPreconditionError(
                               "the rank that began the session commits or aborts it; detach is for joined ranks"));
  }
  if (state_.node.active_session_id() != id_) {
    return Answer(context, absl::FailedPreconditionError(absl::StrCat("session ", id_, " is not active")));
  }
  if (absl::Status st = state_.node.Detach(id_); !st.ok()) return Answer(context, st);
  detached_ = true;
  LogEvent(LogLevel::kInfo, "session_detach").Add("session", id_).Add("open_ranks", state_.node.open_members());
  state_.Changed();  // a commit waiting for the joined ranks starts now
  return kj::READY_NOW;
}

kj::Promise<void> SessionImpl::abort(AbortContext context) {
  if (state_.node.active_session_id() != id_) {
    return Answer(context, absl::FailedPreconditionError(absl::StrCat("session ", id_, " is not active")));
  }
  state_.node.EndByTrainer(id_, EndCause::kClientAbort,
                           absl::StrCat("trainer aborted: ", wire::Str(context.getParams().getReason())));
  state_.Changed();
  return kj::READY_NOW;
}

kj::Promise<void> SessionImpl::commit(CommitContext context) {
  TracePoint("daemon.commit_received");
  state_.Heat();
  KJ_IF_MAYBE (paused, paused_) {
    auto settled = paused->addBranch();
    paused_ = nullptr;
    return settled.then([this, context]() mutable { return Commit(kj::mv(context)); });
  }
  return Commit(kj::mv(context));
}

kj::Promise<void> SessionImpl::Commit(CommitContext context) {
  if (member_) {
    return Answer(
        context, absl::FailedPreconditionError("only the rank that began the session commits it; joined ranks detach"));
  }
  // Joined ranks still pushing: the commit waits until every one of them detached, the
  // session ended (a joined rank died or aborted, an operator aborted) or its deadline passed.
  DaemonState* state = &state_;
  const uint64_t id = id_;
  if (state_.node.active_session_id() == id && state_.node.open_members() > 0) {
    LogEvent(LogLevel::kInfo, "commit_waits_for_ranks")
        .Add("session", id)
        .Add("open_ranks", state_.node.open_members());
  }
  return WaitForMembers(state, id).then([state, id, context]() mutable { return StartCommit(state, id, context); });
}

kj::Promise<void> SessionImpl::WaitForMembers(DaemonState* state, uint64_t id) {
  if (state->node.active_session_id() != id ||
      (state->node.open_members() == 0 && !state->node.undoing_early_pause())) {
    return kj::READY_NOW;
  }
  // Checked again at each change (DaemonState::Changed: the last detach starts the commit at
  // once), and every 5 ms for what ends a session without one.
  return state->OnChange().exclusiveJoin(state->timer.afterDelay(5 * kj::MILLISECONDS)).then([state, id] {
    return WaitForMembers(state, id);
  });
}

absl::Status SessionImpl::EndedBeforeCommit(const DaemonState& state, uint64_t id) {
  const RefitReport& last = state.node.last_report();
  const bool failed = last.outcome == Outcome::kFailed;
  if (state.node.active_session_id() == id || last.session_id != id || (last.outcome != Outcome::kAborted && !failed)) {
    return absl::OkStatus();
  }
  std::string msg =
      absl::StrCat("session ", id, failed ? " failed" : " was aborted", " before its commit: ", last.reason);
  if (failed) return WithCause(absl::Status(ReportStatus(last).code(), msg), last.cause);
  if (last.cause == EndCause::kDeadlineExceeded) return WithCause(absl::DeadlineExceededError(msg), last.cause);
  return WithCause(absl::AbortedError(msg), last.cause);
}

kj::Promise<void> SessionImpl::StartCommit(DaemonState* state, uint64_t id, CommitContext context) {
  TracePoint("daemon.commit_started");
  if (absl::Status ended = EndedBeforeCommit(*state, id); !ended.ok()) {
    wire::ToWire(state->node.last_report(), context.getResults().initReport());  // how it ended
    return Answer(context, ended);
  }
  return CommitSessionWhenFree(state, id, kj::mv(context));
}

}  // namespace refit::server
