#include "server/daemon_state.h"

#include <memory>
#include <utility>

#include "absl/time/clock.h"
#include "server/engine_setup.h"
#include "server/log.h"

namespace refit::server {
namespace {

// One line per ended session; values are escaped by the log (no value can forge a line).
void LogReport(const RefitReport& r) {
  LogEvent e(r.outcome == Outcome::kCommitted ? LogLevel::kInfo : LogLevel::kWarn, "refit");
  e.Add("session", r.session_id)
      .Add("outcome", OutcomeName(r.outcome))
      .Add("cause", EndCauseName(r.cause))
      .Add("version", r.version)
      .Add("tag", r.tag)
      .Add("bytes_in", r.bytes_in)
      .Add("bytes_out", r.bytes_out)
      .Add("buckets", r.buckets)
      .Add("tensors", r.tensors)
      .Add("receive_ms", r.times.receive_ms)
      .Add("convert_ms", r.times.convert_ms)
      .Add("validate_ms", r.times.validate_ms)
      .Add("commit_ms", r.times.commit_ms)
      .Add("pause_ms", r.times.pause_ms)
      .Add("total_ms", r.times.total_ms)
      .Add("plan_ms", r.times.plan_ms)
      .Add("finish_ms", r.times.finish_ms)
      .Add("prepare_ms", r.times.prepare_ms);
  if (r.times.verify_ms > 0) e.Add("verify_ms", r.times.verify_ms);
  if (!r.reason.empty()) e.Add("reason", r.reason);
}

}  // namespace

DaemonState::DaemonState(Config config_in, spec::ModelSpec spec_in, std::unique_ptr<transport::Receiver> receiver_in,
                         std::unique_ptr<BucketRing> ring_in, kj::LowLevelAsyncIoProvider& io_in, kj::Timer& timer_in,
                         DaemonHooks hooks_in, std::unique_ptr<FailpointSet> failpoints_in)
    : config(std::move(config_in)),
      spec(std::move(spec_in)),
      failpoints(std::move(failpoints_in)),
      receiver(std::move(receiver_in)),
      ring(std::move(ring_in)),
      io(io_in),
      timer(timer_in),
      node(
          [&] {
            NodeOptions o;
            o.model = spec.model;
            o.limits = config.limits;
            o.pause_timeout = absl::Milliseconds(config.pause_timeout_ms);
            o.resume_timeout = absl::Milliseconds(config.resume_timeout_ms);
            o.verify_after_commit = config.verify_after_commit;
            o.hold = config.hold;
            o.group.name = config.group_name;
            o.group.members = config.group_members;
            o.group.member = config.group_member;
            o.group.decision_timeout = absl::Milliseconds(config.group_decision_timeout_ms);
            o.group.ask_peers = !config.group_addresses.empty();
            o.group.hold_unanswered = config.group_hold_unanswered;
            o.refuse_while_asleep = config.asleep_refits == "refuse";
            o.direct = config.staging == "direct";
            o.resume_on_loop = true;  // RunCommitTask sends the commit's resume from the loop
            o.failpoints = failpoints.get();
            o.spec = &spec;
            const Config* cfg = &config;
            o.make_staging = [cfg](EngineSetup& setup) { return MakeStaging(*cfg, setup); };
            return o;
          }(),
          *receiver, *ring,
          [&] {
            NodeHooks h = std::move(hooks_in);
            h.on_commit_phase = [](uint64_t session, const char* phase) {
              LogEvent(LogLevel::kDebug, "commit_window").Add("session", session).Add("phase", phase);
            };
            h.on_log = LogReport;
            return h;
          }()),
      blocking(io_in),
      tasks(error_handler_) {
  node.GroupChanged();  // an engine group's member starts joining (metrics)
}

DaemonState::~DaemonState() = default;

void DaemonState::Heat() {
  heated_at_ = absl::Now();
  expect_until_ = absl::InfinitePast();  // the refit expected came (or another call did)
  if (heat_.get() != nullptr) heat_->fulfill();
  heat_ = nullptr;
}

void DaemonState::Changed() {
  for (auto& w : change_waiters_) w->fulfill();
  change_waiters_.clear();
}

kj::Promise<void> DaemonState::OnChange() {
  // Waiters that stopped waiting (a timer came first) go, so that a long wait holds one.
  std::erase_if(change_waiters_, [](kj::Own<kj::PromiseFulfiller<void>>& w) { return !w->isWaiting(); });
  auto paf = kj::newPromiseAndFulfiller<void>();
  change_waiters_.push_back(kj::mv(paf.fulfiller));
  return kj::mv(paf.promise);
}

void DaemonState::Expect() {
  Heat();
  expect_until_ = absl::Now() + kExpectRefitFor;
}

kj::Promise<void> DaemonState::OnHeat() {
  auto paf = kj::newPromiseAndFulfiller<void>();
  heat_ = kj::mv(paf.fulfiller);
  return kj::mv(paf.promise);
}

bool DaemonState::Hot() const {
  // A session whose trainer has gone quiet (it began ahead of a long step, or its buckets come
  // slowly) stops the spin after kQuietAfter; its next call heats the loop again. A session staged
  // for a sleeping engine waits for the wake without spinning.
  constexpr absl::Duration kJustHeated = absl::Milliseconds(5);
  constexpr absl::Duration kQuietAfter = absl::Seconds(1);
  const absl::Time now = absl::Now();
  if (now < expect_until_) return true;
  const absl::Duration since = now - heated_at_;
  if (since < kJustHeated) return true;
  if (since > kQuietAfter) return false;
  return node.committing() || (node.active_session_id() != 0 && node.awaiting_wake_session() == 0);
}

bool DaemonState::Drain(kj::WaitScope& wait_scope) {
  if (!node.Shutdown()) return true;
  // A commit in its window runs to the engine's resume (or its failure) before refitd exits, so
  // a shutdown never leaves the engine paused with half-copied weights. Bounded by the engine
  // timeouts: a stuck engine cannot hold the shutdown forever. An engine group's version copied
  // here waits for the group's resume or abort, or this member's deadline (its restore).
  const absl::Time until =
      absl::Now() + absl::Milliseconds(config.pause_timeout_ms) + absl::Milliseconds(config.resume_timeout_ms) +
      absl::Seconds(30) +
      (config.group_members > 0 ? absl::Milliseconds(config.group_decision_timeout_ms) : absl::ZeroDuration());
  while (node.committing() && absl::Now() < until) timer.afterDelay(10 * kj::MILLISECONDS).wait(wait_scope);
  return !node.committing();
}

void DaemonState::ErrorHandler::taskFailed(kj::Exception&& e) {
  LogEvent(LogLevel::kError, "task_failed").Add("error", e.getDescription().cStr());
}

}  // namespace refit::server
