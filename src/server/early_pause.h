// staging: direct's early pause (Node::StartEarlyPause): for a manifest like the last one placed,
// the engine's pause is sent as the begin arrives, before its manifest is decoded. Taken on the
// loop when answered in time, or undone when the begin does not adopt it. Event loop thread only.
#ifndef REFIT_SERVER_EARLY_PAUSE_H_
#define REFIT_SERVER_EARLY_PAUSE_H_

#include <memory>
#include <string>

#include "kj/async.h"
#include "refit/engine_pause.h"
#include "server/daemon_state.h"

namespace refit::server {

// Owns an early pause until the begin's planning (DaemonImpl::Plan) takes it; dropped untaken,
// it ends the early window and undoes the pause (a daemon task).
class EarlyPending {
 public:
  EarlyPending(DaemonState* state, std::shared_ptr<DirectPause> early) : state_(state), early_(std::move(early)) {}
  std::shared_ptr<DirectPause> Take() { return std::move(early_); }
  ~EarlyPending();

 private:
  DaemonState* state_;
  std::shared_ptr<DirectPause> early_;
};

// An early pause not taken: once its DirectPause::Run (`paused`) returned, the engine is resumed
// unless it was dirty (Node::StartUndoEarlyPause, EnginePause::Undo, Node::FinishUndoEarlyPause;
// begins are busy meanwhile).
kj::Promise<void> UndoEarlyPause(DaemonState* state, std::shared_ptr<DirectPause> early, kj::Promise<void> paused,
                                 std::string reason);

// An early pause's outcome: taken on this thread once the engine answered, when it paused in
// time with nothing stale (no worker thread, no hop back); otherwise by DirectPause::Run on a
// worker thread, which takes the same answer.
kj::Promise<void> SettleEarlyPause(DaemonState* state, std::shared_ptr<DirectPause> early);

}  // namespace refit::server

#endif  // REFIT_SERVER_EARLY_PAUSE_H_
