#include "server/rpc_engine_control.h"

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/trace.h"
#include "kj/debug.h"
#include "proto/wire.h"

namespace refit::server {
namespace {

// The engine's pause/resume over the control plane. The commit's worker thread calls it; each
// call runs on the event loop (the capability lives there) and is raced against a timer. A call
// that timed out stays pending at the engine: it is kept, and the engine counts as unresponsive
// until every such call has been answered.
class RpcEngineControl final : public EngineControl {
 public:
  RpcEngineControl(proto::EngineControl::Client client, kj::Timer& timer)
      : client_(kj::mv(client)),
        timer_(timer),
        loop_(kj::getCurrentThreadExecutor()),
        late_(std::make_shared<std::atomic<int>>(0)),
        late_calls_(std::make_unique<kj::TaskSet>(handler_)) {}
  // KJ's destructors may throw; here nothing is left to unwind to.
  ~RpcEngineControl() noexcept override {}

  absl::Status Pause(absl::Duration timeout) override {
    auto stale = std::make_shared<std::vector<std::string>>();
    absl::Status st = Run("pause", [this, timeout, &stale]() -> kj::Promise<absl::Status> {
      KJ_IF_MAYBE (started, started_) {
        // StartPause sent it (and raced it against its own timeout): its outcome is this pause's.
        kj::Promise<absl::Status> answer = started->addBranch();
        stale = started_stale_;
        started_ = nullptr;
        return answer;
      }
      return CallOnLoop("pause", timeout, [this, stale] { return SendPause(stale); });
    });
    // Only an answered pause's audit counts (a late answer fills a vector nobody reads).
    paused_stale_ = st.ok() ? std::move(*stale) : std::vector<std::string>{};
    return st;
  }

  std::vector<std::string> PausedStale() override { return paused_stale_; }

  absl::Status Resume(uint64_t version, const std::string& tag, absl::Duration timeout) override {
    return Run("resume", [this, version, tag, timeout] {
      return CallOnLoop("resume", timeout, [this, version, tag] { return SendResume(version, tag); });
    });
  }

  bool Responsive() const override { return late_->load() == 0; }

  bool StartResume(uint64_t version, const std::string& tag, absl::Duration timeout,
                   std::function<void(absl::Status)> done) override {
    // CallOnLoop's promise always settles (answered, failed, or its timeout).
    late_calls_->add(CallOnLoop("resume", timeout, [this, version, tag] {
                       return SendResume(version, tag);
                     }).then([done = std::move(done)](absl::Status st) { done(std::move(st)); }));
    return true;
  }

  void StartPause(absl::Duration timeout) override {
    started_stale_ = std::make_shared<std::vector<std::string>>();
    started_outcome_.reset();
    auto stale = started_stale_;
    started_ = CallOnLoop("pause", timeout, [this, stale] { return SendPause(stale); })
                   .then([this](absl::Status st) {
                     started_outcome_ = st;
                     return st;
                   })
                   .fork();
  }

  void WhenPauseAnswered(std::function<void()> then) override {
    KJ_IF_MAYBE (started, started_) {
      late_calls_->add(started->addBranch().then([then = std::move(then)](const absl::Status&) { then(); }));
      return;
    }
    then();
  }

  bool TakeAnsweredPause() override {
    if (started_ == nullptr || !started_outcome_ || !started_outcome_->ok() || !started_stale_->empty()) return false;
    started_ = nullptr;
    paused_stale_.clear();
    return true;
  }

 private:
  struct Handler : kj::TaskSet::ErrorHandler {
    void taskFailed(kj::Exception&&) override {}
  };

  // Loop thread only.
  kj::Promise<void> SendResume(uint64_t version, const std::string& tag) {
    auto req = client_.resumeRequest();
    req.setVersion(version);
    req.setTag(wire::Text(tag));
    return req.send().ignoreResult();
  }

  kj::Promise<void> SendPause(std::shared_ptr<std::vector<std::string>> stale) {
    TracePoint("daemon.pause_sent");
    return client_.pauseRequest().send().then([stale](capnp::Response<proto::EngineControl::PauseResults>&& r) {
      TracePoint("daemon.pause_answered");
      for (auto name : r.getStale()) stale->push_back(wire::Str(name));
    });
  }

  static absl::Status CallError(const char* what, const kj::Exception& e) {
    if (e.getType() == kj::Exception::Type::DISCONNECTED) {
      return absl::UnavailableError(absl::StrCat("the engine disconnected during ", what));
    }
    return absl::UnavailableError(absl::StrCat("the engine's ", what, " failed: ", e.getDescription().cStr()));
  }

  // Loop thread: `send`'s call raced against `timeout`, as a status. A call that timed out is kept:
  // the engine counts as unresponsive until it answers it.
  template <typename Send>
  kj::Promise<absl::Status> CallOnLoop(const char* what, absl::Duration timeout, Send send) {
    kj::ForkedPromise<void> call = nullptr;
    KJ_IF_MAYBE (e, kj::runCatchingExceptions([&] { call = send().fork(); })) {
      return CallError(what, *e);
    }
    auto late = late_;
    auto keep_late = [this, late](kj::ForkedPromise<void>& call) {
      ++*late;
      late_calls_->add(call.addBranch().then([late] { --*late; }, [late](kj::Exception&&) { --*late; }));
    };
    auto late_error = [what, timeout] {
      return absl::DeadlineExceededError(
          absl::StrCat("the engine did not answer ", what, " within ", absl::FormatDuration(timeout)));
    };
    if (timeout <= absl::ZeroDuration()) {
      keep_late(call);
      return late_error();
    }
    auto deadline = timer_.afterDelay(absl::ToInt64Milliseconds(timeout) * kj::MILLISECONDS).then([] { return false; });
    return call.addBranch()
        .then([] { return true; })
        .exclusiveJoin(kj::mv(deadline))
        .then(
            [keep_late, late_error, call = kj::mv(call)](bool in_time) mutable -> absl::Status {
              if (in_time) return absl::OkStatus();
              keep_late(call);
              return late_error();
            },
            [what](kj::Exception&& e) { return CallError(what, e); });
  }

  // From the commit's worker thread: `call` (returning CallOnLoop's promise) run on the loop.
  template <typename Call>
  absl::Status Run(const char* what, Call call) {
    absl::Status status;
    KJ_IF_MAYBE (e, kj::runCatchingExceptions([&] { status = loop_.executeSync(call); })) {
      return CallError(what, *e);
    }
    return status;
  }

  proto::EngineControl::Client client_;
  std::vector<std::string> paused_stale_;  // the thread that took the pause's answer (Pause, TakeAnsweredPause)
  // StartPause's request (raced against its timeout), until a Pause takes its outcome, and that
  // outcome once settled (loop thread only).
  kj::Maybe<kj::ForkedPromise<absl::Status>> started_;
  std::shared_ptr<std::vector<std::string>> started_stale_;
  std::optional<absl::Status> started_outcome_;
  kj::Timer& timer_;
  const kj::Executor& loop_;
  std::shared_ptr<std::atomic<int>> late_;
  Handler handler_;
  std::unique_ptr<kj::TaskSet> late_calls_;  // loop thread only
};

}  // namespace

std::unique_ptr<EngineControl> NewRpcEngineControl(proto::EngineControl::Client client, kj::Timer& timer) {
  return std::make_unique<RpcEngineControl>(kj::mv(client), timer);
}

}  // namespace refit::server
