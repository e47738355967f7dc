#include "server/early_pause.h"

#include <memory>
#include <string>
#include <utility>

#include "server/log.h"

namespace refit::server {

EarlyPending::~EarlyPending() {
  if (early_ == nullptr) return;
  std::shared_ptr<DirectPause> early = std::move(early_);
  state_->node.EndEarlyWindow();
  state_->tasks.add(
      UndoEarlyPause(state_, early, state_->blocking.Run([early] { early->Run(); }), "its begin was dropped"));
}

kj::Promise<void> UndoEarlyPause(DaemonState* state, std::shared_ptr<DirectPause> early, kj::Promise<void> paused,
                                 std::string reason) {
  state->node.StartUndoEarlyPause();
  return paused.then([state, early] { return state->blocking.Run([early] { early->pause().Undo(); }); })
      .then([state, reason = std::move(reason)] {
        state->node.FinishUndoEarlyPause();
        state->Changed();
        LogEvent(LogLevel::kInfo, "early_pause_undone").Add("reason", reason);
      });
}

kj::Promise<void> SettleEarlyPause(DaemonState* state, std::shared_ptr<DirectPause> early) {
  auto answered = kj::newPromiseAndFulfiller<void>();
  auto fulfiller = std::make_shared<kj::Own<kj::PromiseFulfiller<void>>>(kj::mv(answered.fulfiller));
  early->pause().WhenAnswered([fulfiller] { (*fulfiller)->fulfill(); });
  auto settle = [state, early]() -> kj::Promise<void> {
    if (early->TakeAnswered()) return kj::READY_NOW;
    return state->blocking.Run([early] { early->Run(); });
  };
  auto on_error = [settle](kj::Exception&&) { return settle(); };
  return answered.promise.then(kj::mv(settle), kj::mv(on_error));
}

}  // namespace refit::server
