// The Cap'n Proto `Session` capability of one trainer rank in a refit session, adapted onto the
// node: announces, a joined rank's detach, abort, and the commit of the rank that began it (which
// waits for the joined ranks, an early pause's undo and a kept version's commit). Dropping it
// (disconnect or done) aborts a session that is not committing.
//
// Event loop thread only.
#ifndef REFIT_SERVER_SESSION_SERVICE_H_
#define REFIT_SERVER_SESSION_SERVICE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kj/async.h"
#include "proto/refit.capnp.h"
#include "server/daemon_state.h"

namespace refit::server {

class SessionImpl final : public proto::Session::Server {
 public:
  // `member`: a trainer rank that joined the session (Daemon.join) rather than began it; it
  // announces, then detaches (or aborts the refit); only the rank that began it commits.
  // `rank`: the trainer rank's number in the session (0 for the rank that began it; Node::Join).
  SessionImpl(DaemonState& state, uint64_t id, bool member = false, uint32_t rank = 0)
      : state_(state), id_(id), member_(member), rank_(rank) {}
  ~SessionImpl();

  // staging: direct: a commit that arrives before the engine's pause settled waits for it.
  void CommitAfter(kj::Promise<void> paused) {
    paused_ = paused.catch_([](kj::Exception&&) {}).fork();
  }

 protected:
  kj::Promise<void> announce(AnnounceContext context) override;
  kj::Promise<void> detach(DetachContext context) override;
  kj::Promise<void> abort(AbortContext context) override;
  // Also waits while an early pause is undone (staging: direct, Node::StartEarlyPause).
  kj::Promise<void> commit(CommitContext context) override;

 private:
  kj::Promise<void> Commit(CommitContext context);
  static kj::Promise<void> WaitForMembers(DaemonState* state, uint64_t id);
  // A commit of a session that has already ended: Aborted (or DeadlineExceeded; a session that
  // failed, as ReportStatus: ResourceExhausted for staging) naming why, with its cause.
  static absl::Status EndedBeforeCommit(const DaemonState& state, uint64_t id);
  static kj::Promise<void> StartCommit(DaemonState* state, uint64_t id, CommitContext context);

  DaemonState& state_;
  const uint64_t id_;
  const bool member_;
  const uint32_t rank_;
  bool detached_ = false;
  kj::Maybe<kj::ForkedPromise<void>> paused_;  // CommitAfter, until a commit waits for it
};

}  // namespace refit::server

#endif  // REFIT_SERVER_SESSION_SERVICE_H_
