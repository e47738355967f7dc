#include "server/registration_service.h"

#include <memory>
#include <utility>

#include "server/commit_task.h"
#include "server/engine_setup.h"
#include "server/log.h"
#include "server/rpc_answer.h"

namespace refit::server {
namespace {

class RegistrationImpl final : public proto::Registration::Server {
 public:
  RegistrationImpl(DaemonState& state, uint64_t engine_id) : state_(state), engine_id_(engine_id) {}
  ~RegistrationImpl() {
    if (state_.node.UnregisterEngine(engine_id_)) {
      LogEvent(LogLevel::kInfo, "engine_unregistered").Add("engine", engine_id_);
    }
  }

 protected:
  kj::Promise<void> version(VersionContext context) override {
    context.getResults().setVersion(state_.node.version());
    context.getResults().setTag(wire::Text(state_.node.tag()));
    return kj::READY_NOW;
  }

  kj::Promise<void> sleep(SleepContext context) override {
    absl::Status slept = state_.node.Sleep(engine_id_);
    if (slept.ok()) {
      LogEvent e(LogLevel::kInfo, "engine_asleep");
      AddRank(e, state_.node, engine_id_);
    }
    return Answer(context, slept);
  }

  kj::Promise<void> wake(WakeContext context) override { return Wake(&state_, engine_id_, kj::mv(context)); }

 private:
  static kj::Promise<void> Wake(DaemonState* state, uint64_t engine_id, WakeContext context) {
    if (state->node.committing()) {
      // A commit in flight (a refit validated against the sleeping engine, a kept version): the
      // wake waits for it, then maps and commits what it staged.
      return state->OnChange()
          .exclusiveJoin(state->timer.afterDelay(10 * kj::MILLISECONDS))
          .then([state, engine_id, context]() mutable { return Wake(state, engine_id, kj::mv(context)); });
    }
    absl::StatusOr<std::unique_ptr<storage::EngineStorage>> storage = OpenStorage(context.getParams().getParams());
    if (!storage.ok()) return Answer(context, storage.status());
    absl::StatusOr<std::shared_ptr<Commit>> woken = state->node.Wake(engine_id, std::move(*storage));
    if (!woken.ok()) return Answer(context, woken.status());
    {
      LogEvent e(LogLevel::kInfo, "engine_awake");
      AddRank(e, state->node, engine_id);
      e.Add("staged_session", *woken ? (*woken)->session_id() : 0);
    }
    if (*woken == nullptr) {
      // In a colocated loop the trainer's refit follows the wake: the loop is hot for its begin.
      state->Expect();
      return Answer(context, absl::OkStatus());
    }
    return RunCommitTask(*state, *woken, context).then([state, context]() mutable {
      context.getResults().setCommitted(state->node.last_report().outcome == Outcome::kCommitted);
    });
  }

  // The registration's engine, and for an engine rank which rank and whether the engine (every
  // rank) is still asleep.
  static void AddRank(LogEvent& e, const Node& node, uint64_t engine_id) {
    e.Add("engine", engine_id);
    if (const int tp_rank = node.TpRankOf(engine_id); tp_rank >= 0) {
      e.Add("tp_rank", tp_rank).Add("engine_asleep", node.asleep());
    }
  }

  DaemonState& state_;
  uint64_t engine_id_;
};

}  // namespace

proto::Registration::Client MakeRegistration(DaemonState& state, uint64_t engine_id) {
  return kj::heap<RegistrationImpl>(state, engine_id);
}

}  // namespace refit::server
