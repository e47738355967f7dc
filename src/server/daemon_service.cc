#include "server/daemon_service.h"

#include <atomic>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/checksum.h"
#include "common/trace.h"
#include "common/version.h"
#include "kj/debug.h"
#include "proto/wire.h"
#include "refit/cpu_converter.h"
#include "server/blocking.h"
#include "server/engine_params.h"
#include "server/log.h"
#include "server/status_causes.h"
#include "storage/shm_storage.h"
#include "transport/builtin_transports.h"
#if REFIT_HAVE_CUDA
#include "refit/gpu/gpu_converter.h"
#include "storage/cuda_ipc_storage.h"
#endif

namespace refit::server {
namespace {

// Every expected failure is answered as a typed status in the call's results; exceptions are
// left to the connection itself failing.
template <typename Context>
kj::Promise<void> Answer(Context& context, const absl::Status& status) {
  wire::ToWire(status, context.getResults().initStatus());
  return kj::READY_NOW;
}

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
      KJ_IF_MAYBE(started, started_) {
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
    late_calls_->add(CallOnLoop("resume", timeout, [this, version, tag] { return SendResume(version, tag); })
                         .then([done = std::move(done)](absl::Status st) { done(st); }));
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
    KJ_IF_MAYBE(started, started_) {
      late_calls_->add(started->addBranch().then([then = std::move(then)](absl::Status) { then(); }));
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
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&] { call = send().fork(); })) {
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
    auto deadline = timer_.afterDelay(absl::ToInt64Milliseconds(timeout) * kj::MILLISECONDS).then([] {
      return false;
    });
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
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&] { status = loop_.executeSync(call); })) {
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

absl::StatusOr<std::unique_ptr<storage::EngineStorage>> OpenStorage(capnp::List<proto::EngineParam>::Reader list);

template <typename Context>
kj::Promise<void> RunCommitTask(DaemonState& state_ref, std::shared_ptr<Commit> commit, Context context);

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

class SessionImpl final : public proto::Session::Server {
 public:
  // `member`: a trainer rank that joined the session (Daemon.join) rather than began it; it
  // announces, then detaches (or aborts the refit); only the rank that began it commits.
  // `rank`: the trainer rank's number in the session (0 for the rank that began it; Node::Join).
  SessionImpl(DaemonState& state, uint64_t id, bool member = false, uint32_t rank = 0)
      : state_(state), id_(id), member_(member), rank_(rank) {}

  ~SessionImpl() {
    // The trainer dropped its session (disconnect or done). An uncommitted session is aborted;
    // a commit in progress runs to its end on its own. A joined rank that detached is done.
    if (detached_) return;
    state_.node.EndByTrainer(id_, EndCause::kDisconnected,
                             member_ ? "a joined trainer rank disconnected before detaching" : "trainer disconnected");
    state_.Changed();
  }

  // staging: direct: a commit that arrives before the engine's pause settled waits for it.
  void CommitAfter(kj::Promise<void> paused) { paused_ = paused.catch_([](kj::Exception&&) {}).fork(); }

 protected:
  kj::Promise<void> announce(AnnounceContext context) override {
    TracePoint("daemon.announce_received");
    state_.Heat();
    if (detached_) return Answer(context, absl::FailedPreconditionError("this trainer rank has detached from the session"));
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

  kj::Promise<void> detach(DetachContext context) override {
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

  kj::Promise<void> abort(AbortContext context) override {
    if (state_.node.active_session_id() != id_) {
      return Answer(context, absl::FailedPreconditionError(absl::StrCat("session ", id_, " is not active")));
    }
    state_.node.EndByTrainer(id_, EndCause::kClientAbort,
                             absl::StrCat("trainer aborted: ", wire::Str(context.getParams().getReason())));
    state_.Changed();
    return kj::READY_NOW;
  }

  // Also waits while an early pause is undone (staging: direct, Node::StartEarlyPause).
  kj::Promise<void> commit(CommitContext context) override {
    TracePoint("daemon.commit_received");
    state_.Heat();
    KJ_IF_MAYBE(paused, paused_) {
      auto settled = paused->addBranch();
      paused_ = nullptr;
      return settled.then([this, context]() mutable { return Commit(kj::mv(context)); });
    }
    return Commit(kj::mv(context));
  }

 private:
  kj::Promise<void> Commit(CommitContext context) {
    if (member_) {
      return Answer(context, absl::FailedPreconditionError(
                                 "only the rank that began the session commits it; joined ranks detach"));
    }
    // Joined ranks still pushing: the commit waits until every one of them detached, the
    // session ended (a joined rank died or aborted, an operator aborted) or its deadline passed.
    DaemonState* state = &state_;
    const uint64_t id = id_;
    if (state_.node.active_session_id() == id && state_.node.open_members() > 0) {
      LogEvent(LogLevel::kInfo, "commit_waits_for_ranks").Add("session", id).Add("open_ranks", state_.node.open_members());
    }
    return WaitForMembers(state, id).then([state, id, context]() mutable { return StartCommit(state, id, context); });
  }

 private:
  static kj::Promise<void> WaitForMembers(DaemonState* state, uint64_t id) {
    if (state->node.active_session_id() != id ||
        (state->node.open_members() == 0 && !state->node.undoing_early_pause())) {
      return kj::READY_NOW;
    }
    // Checked again at each change (DaemonState::Changed: the last detach starts the commit at
    // once), and every 5 ms for what ends a session without one.
    return state->OnChange()
        .exclusiveJoin(state->timer.afterDelay(5 * kj::MILLISECONDS))
        .then([state, id] { return WaitForMembers(state, id); });
  }

  // A commit of a session that has already ended: Aborted (or DeadlineExceeded; a session that
  // failed, as ReportStatus: ResourceExhausted for staging) naming why, with its cause.
  static absl::Status EndedBeforeCommit(const DaemonState& state, uint64_t id) {
    const RefitReport& last = state.node.last_report();
    const bool failed = last.outcome == Outcome::kFailed;
    if (state.node.active_session_id() == id || last.session_id != id || (last.outcome != Outcome::kAborted && !failed)) {
      return absl::OkStatus();
    }
    std::string msg = absl::StrCat("session ", id, failed ? " failed" : " was aborted", " before its commit: ", last.reason);
    if (failed) return WithCause(absl::Status(ReportStatus(last).code(), msg), last.cause);
    if (last.cause == EndCause::kDeadlineExceeded) return WithCause(absl::DeadlineExceededError(msg), last.cause);
    return WithCause(absl::AbortedError(msg), last.cause);
  }

  static kj::Promise<void> StartCommit(DaemonState* state, uint64_t id, CommitContext context) {
    TracePoint("daemon.commit_started");
    if (absl::Status ended = EndedBeforeCommit(*state, id); !ended.ok()) {
      wire::ToWire(state->node.last_report(), context.getResults().initReport());  // how it ended
      return Answer(context, ended);
    }
    return CommitSessionWhenFree(state, id, kj::mv(context));
  }

  DaemonState& state_;
  const uint64_t id_;
  const bool member_;
  const uint32_t rank_;
  bool detached_ = false;
  kj::Maybe<kj::ForkedPromise<void>> paused_;  // CommitAfter, until a commit waits for it
};

// Maps the engine's registered parameters: all in POSIX shm, or all in GPU memory (CUDA IPC and
// CUDA virtual memory).
absl::StatusOr<std::unique_ptr<storage::EngineStorage>> OpenStorage(capnp::List<proto::EngineParam>::Reader list) {
  absl::StatusOr<EngineParamList> params = ReadEngineParams(list);
  if (!params.ok()) return params.status();
  if (!params->cuda.empty()) {
    if (!params->shm.empty()) return absl::InvalidArgumentError("an engine registers all parameters in shm or all on the GPU");
#if REFIT_HAVE_CUDA
    absl::StatusOr<std::unique_ptr<storage::CudaIpcEngineStorage>> s =
        storage::CudaIpcEngineStorage::Open(std::move(params->cuda));
    if (!s.ok()) return s.status();
    return std::unique_ptr<storage::EngineStorage>(std::move(*s));
#else
    return absl::InvalidArgumentError(absl::StrCat("engine parameter '", params->cuda[0].info.name,
                                                   "' is in GPU memory, but this refitd was built without CUDA"));
#endif
  }
  absl::StatusOr<std::unique_ptr<storage::ShmEngineStorage>> s = storage::ShmEngineStorage::Open(std::move(params->shm));
  if (!s.ok()) return s.status();
  return std::unique_ptr<storage::EngineStorage>(std::move(*s));
}

// Staging memory and converter for a registered engine: host staging and the CPU converter, or,
// with `staging: device` and an engine on the GPU, device staging and the GPU converter.
absl::Status MakeStaging(const Config& config, EngineSetup& setup) {
  const storage::EngineStorage& storage = *setup.storage;
  // staging: direct converts into the engine's memory: on its GPU (as device staging, whose pool
  // holds what cannot be placed) or, for host (shm) parameters, on the host.
  if (config.staging == "direct") {
    const transport::TransportRegistry transports = transport::BuiltinTransports();
    const transport::TransportDescriptor* t = transports.Find(config.transport);
    if (t != nullptr && t->payload_memory == storage::MemoryKind::kDevice && !storage.on_device()) {
      return absl::InvalidArgumentError(absl::StrCat("config says staging: direct with the ", t->name,
                                                     " data plane (buckets on the GPU), but the engine registered "
                                                     "host (shm) parameters"));
    }
    if (storage.on_device() && t != nullptr && t->payload_memory == storage::MemoryKind::kDevice &&
        storage.device() != config.data_device) {
      return absl::InvalidArgumentError(absl::StrCat("config says staging: direct, but the engine's parameters are on "
                                                     "GPU ", storage.device(), " and data_plane.device is ",
                                                     config.data_device, "; they must be the same GPU"));
    }
  }
  if (config.staging == "device" || (config.staging == "direct" && storage.on_device())) {
    if (!storage.on_device()) {
      return absl::InvalidArgumentError("config says staging: device, but the engine registered host (shm) parameters");
    }
#if REFIT_HAVE_CUDA
    absl::StatusOr<std::unique_ptr<storage::Memory>> memory = storage::NewDeviceMemory(storage.device());
    if (!memory.ok()) return memory.status();
    absl::StatusOr<std::unique_ptr<Converter>> converter = NewGpuConverter(storage.device());
    if (!converter.ok()) return converter.status();
    setup.pool = std::make_unique<StagingPool>(std::move(*memory));
    setup.converter = std::move(*converter);
    const int device = storage.device();
    setup.new_pool = [device]() -> std::unique_ptr<StagingPool> {
      absl::StatusOr<std::unique_ptr<storage::Memory>> m = storage::NewDeviceMemory(device);
      // The device was usable at registration; if it no longer is, allocations fail (overloaded).
      return std::make_unique<StagingPool>(m.ok() ? std::move(*m) : storage::NewHostMemory());
    };
    return absl::OkStatus();
#endif
  }
  // Host staging: pinned when the engine is on the GPU, so the commit copy is a fast H2D copy.
  const bool pinned = storage.on_device();
  setup.pool = std::make_unique<StagingPool>(pinned ? storage::NewPinnedHostMemory() : storage::NewHostMemory());
  setup.new_pool = [pinned] {
    return std::make_unique<StagingPool>(pinned ? storage::NewPinnedHostMemory() : storage::NewHostMemory());
  };
  setup.converter = std::make_unique<CpuConverter>();
  return absl::OkStatus();
}

// Bytes hashed into a key: texts NUL-terminated, integers as their 8 bytes.
struct KeyBytes {
  std::string bytes;
  void Text(capnp::Text::Reader t) {
    bytes.append(t.cStr(), t.size());
    bytes.push_back('\0');
  }
  void Int(int64_t v) { bytes.append(reinterpret_cast<const char*>(&v), sizeof(v)); }
  uint64_t Hash() const { return Checksum64(bytes.data(), bytes.size()); }
};

// A manifest's tensor list, hashed (every field a manifest's TensorDesc carries), and whether
// refitd keeps it for begins by key (no supplied amax: that changes each refit).
struct ManifestTensors {
  uint64_t key = 0;
  bool keepable = true;
};

ManifestTensors HashTensors(capnp::List<proto::TensorDesc>::Reader tensors) {
  ManifestTensors out;
  KeyBytes key;
  key.bytes.reserve(64 * tensors.size() + 8);
  key.Int(static_cast<int64_t>(tensors.size()));
  for (proto::TensorDesc::Reader t : tensors) {
    key.Text(t.getName());
    key.Text(t.getDtype());
    key.Int(static_cast<int64_t>(t.getShape().size()));
    for (int64_t d : t.getShape()) key.Int(d);
    key.Int(static_cast<int64_t>(t.getOffset()));
    key.Int(static_cast<int64_t>(t.getNbytes()));
    key.Int(t.getSliceDim());
    key.Int(static_cast<int64_t>(t.getSliceStart()));
    key.Int(static_cast<int64_t>(t.getFullShape().size()));
    for (int64_t d : t.getFullShape()) key.Int(d);
    if (t.getHasAmax()) out.keepable = false;
  }
  out.key = key.Hash();
  if (out.key == 0) out.keepable = false;  // 0 names no list
  return out;
}

// What a manifest's placement (staging: direct) depends on, hashed: its tensor list (`tensors`,
// HashTensors), the model and the kind of refit (not the tag or deadline).
uint64_t PlacementKey(proto::Manifest::Reader m, uint64_t tensors) {
  KeyBytes key;
  key.Text(m.getModel());
  key.Text(m.getWireFormat());
  key.Int((m.getPartial() ? 1 : 0) | (m.getStageOnly() ? 2 : 0));
  key.Int(static_cast<int64_t>(tensors));
  return key.Hash();
}

// A begin that names its tensor list by key (Daemon.begin) instead of sending it.
bool BeginsByKey(proto::Daemon::BeginParams::Reader params) {
  return params.getManifestKey() != 0 && params.getManifest().getTensors().size() == 0;
}

}  // namespace

std::shared_ptr<const std::vector<TensorDesc>> DaemonState::KeptTensors(uint64_t key) {
  for (auto it = kept_manifests.begin(); it != kept_manifests.end(); ++it) {
    if (it->key != key) continue;
    KeptManifest kept = std::move(*it);
    kept_manifests.erase(it);
    kept_manifests.push_back(std::move(kept));
    return kept_manifests.back().tensors;
  }
  return nullptr;
}

void DaemonState::KeepTensors(uint64_t key, std::shared_ptr<const std::vector<TensorDesc>> tensors) {
  for (auto it = kept_manifests.begin(); it != kept_manifests.end(); ++it) {
    if (it->key == key) {
      kept_manifests.erase(it);
      break;
    }
  }
  kept_manifests.push_back({key, std::move(tensors)});
  if (kept_manifests.size() > kKeptManifests) kept_manifests.pop_front();
}

namespace {

class DaemonImpl final : public proto::Daemon::Server {
 public:
  explicit DaemonImpl(DaemonState& state) : state_(state) {}

 protected:
  kj::Promise<void> begin(BeginContext context) override {
    state_.Heat();
    const uint64_t chosen = context.getParams().getSessionId();
    if (chosen == 0) return Begin(context);
    // The trainer chose the session's id and may have sent bytes of it already: if the begin is
    // refused, nothing of that id is received (Receiver::EndSession).
    DaemonState* state = &state_;
    return Begin(context).then([state, context, chosen]() mutable {
      if (context.getResults().getStatus().getCode() != proto::StatusCode::OK) state->receiver->EndSession(chosen);
    });
  }

  kj::Promise<void> Begin(BeginContext context) {
    TracePoint("daemon.begin_received");
    if (absl::Status hit = REFIT_FAILPOINT(state_.failpoints.get(), failpoints::kBeginReceived); !hit.ok()) {
      return Answer(context, hit);
    }
    const absl::Time requested = absl::Now();  // total_ms counts the manifest's planning too
    DaemonState* state = &state_;
    // A begin by manifest key: the tensor list kept from an earlier begin (Daemon.begin).
    const uint64_t by_key = context.getParams().getManifestKey();
    std::shared_ptr<const std::vector<TensorDesc>> kept;
    ManifestTensors tensors;
    if (BeginsByKey(context.getParams())) {
      kept = state_.KeptTensors(by_key);
      if (kept == nullptr) {
        context.getResults().setNeedManifest(true);
        return Answer(context, absl::FailedPreconditionError(absl::StrCat(
                                   "manifest key ", by_key,
                                   " is not this refitd's (it restarted, or many other manifests came since): send "
                                   "the manifest")));
      }
      tensors.key = by_key;
    } else {
      tensors = HashTensors(context.getParams().getManifest().getTensors());
    }
    // staging: direct: for a manifest like the last one placed, the engine starts pausing now,
    // while the manifest is decoded and planned on this thread (Node::StartEarlyPause). Its
    // request is written when the event loop next turns: decoding and planning wait for that.
    const uint64_t key = PlacementKey(context.getParams().getManifest(), tensors.key);
    std::shared_ptr<DirectPause> early = state_.node.StartEarlyPause(key);
    if (early == nullptr) return Plan(state, context, requested, key, nullptr, tensors, std::move(kept));
    // Should the deferred planning never run (the call dropped meanwhile: not expected, the loop
    // runs it before it reads anything else), the early pause is still settled.
    auto pending = kj::heap<EarlyPending>(state, early);
    return kj::evalLater([state, context, requested, key, tensors, kept = std::move(kept),
                          pending = kj::mv(pending)]() mutable {
      return Plan(state, context, requested, key, pending->Take(), tensors, std::move(kept));
    });
  }

  // Owns an early pause until Plan takes it; dropped untaken, it ends the early window and undoes
  // the pause (a daemon task).
  class EarlyPending {
   public:
    EarlyPending(DaemonState* state, std::shared_ptr<DirectPause> early) : state_(state), early_(std::move(early)) {}
    std::shared_ptr<DirectPause> Take() { return std::move(early_); }
    ~EarlyPending() {
      if (early_ == nullptr) return;
      std::shared_ptr<DirectPause> early = std::move(early_);
      state_->node.EndEarlyWindow();
      state_->tasks.add(UndoEarlyPause(state_, early, state_->blocking.Run([early] { early->Run(); }),
                                       "its begin was dropped"));
    }

   private:
    DaemonState* state_;
    std::shared_ptr<DirectPause> early_;
  };

  // An early pause not taken: once its DirectPause::Run (`paused`) returned, the engine is resumed
  // unless it was dirty (Node::StartUndoEarlyPause, EnginePause::Undo, Node::FinishUndoEarlyPause;
  // begins are busy meanwhile).
  static kj::Promise<void> UndoEarlyPause(DaemonState* state, std::shared_ptr<DirectPause> early,
                                          kj::Promise<void> paused, std::string reason) {
    state->node.StartUndoEarlyPause();
    return paused.then([state, early] { return state->blocking.Run([early] { early->pause().Undo(); }); })
        .then([state, reason = std::move(reason)] {
          state->node.FinishUndoEarlyPause();
          state->Changed();
          LogEvent(LogLevel::kInfo, "early_pause_undone").Add("reason", reason);
        });
  }

  // An early pause's outcome: taken on this thread once the engine answered, when it paused in
  // time with nothing stale (no worker thread, no hop back); otherwise by DirectPause::Run on a
  // worker thread, which takes the same answer.
  static kj::Promise<void> SettleEarlyPause(DaemonState* state, std::shared_ptr<DirectPause> early) {
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

  // The begin's decode and planning (Node::Begin), then the rest (Begun); `early`: its early
  // pause (DirectPause::Run not started yet), or nullptr. `kept`: the tensor list of a begin by
  // manifest key; else the manifest's own, kept for later begins when `tensors` says so.
  static kj::Promise<void> Plan(DaemonState* state, BeginContext context, absl::Time requested, uint64_t key,
                                std::shared_ptr<DirectPause> early, ManifestTensors tensors,
                                std::shared_ptr<const std::vector<TensorDesc>> kept) {
    if (early != nullptr) state->node.EndEarlyWindow();
    // The GPU wakes while the begin is planned (after the early pause's request went out).
    state->node.WarmConverter();
    const auto reader = context.getParams().getManifest();
    kj::Maybe<kj::ForkedPromise<void>> early_paused;
    if (early != nullptr) early_paused = SettleEarlyPause(state, early).fork();
    absl::StatusOr<Manifest> manifest = wire::FromWire(reader);
    TracePoint("daemon.manifest_read");
    if (manifest.ok() && kept != nullptr) {
      manifest->tensors = *kept;
    } else if (manifest.ok() && tensors.keepable) {
      state->KeepTensors(tensors.key, std::make_shared<const std::vector<TensorDesc>>(manifest->tensors));
    }
    if (manifest.ok() && (kept != nullptr || tensors.keepable)) context.getResults().setManifestKey(tensors.key);
    // A tensor list of a key (kept, or keepable: no supplied amax) may take the planner's last
    // check and plans of the same list (Node::Begin).
    const uint64_t tensors_key = kept != nullptr || tensors.keepable ? tensors.key : 0;
    absl::StatusOr<BeginResult> begun =
        manifest.ok() ? state->node.Begin(*manifest, requested, tensors_key, context.getParams().getSessionId())
                      : absl::StatusOr<BeginResult>(manifest.status());
    if (early != nullptr && (!begun.ok() || !begun->pause_first)) {
      // Not taken: the engine resumes (unless it was dirty), a daemon task; a refused begin is
      // answered after it, a staged session's commit waits for it (commit).
      KJ_IF_MAYBE(paused, early_paused) {
        auto undone = UndoEarlyPause(state, early, paused->addBranch(),
                                     begun.ok() ? std::string("nothing to convert in place")
                                                : std::string(begun.status().message()))
                          .fork();
        state->tasks.add(undone.addBranch());
        if (!begun.ok()) {
          return undone.addBranch().then([context, status = begun.status()]() mutable { return Answer(context, status); });
        }
        return Begun(state, context, *manifest, *begun, nullptr, nullptr);
      }
    }
    if (!begun.ok()) return Answer(context, begun.status());
    TracePoint("daemon.planned");
    if (begun->pause_first) state->node.NotePlacing(key);
    kj::Promise<void> paused = nullptr;
    KJ_IF_MAYBE(p, early_paused) { paused = p->addBranch(); }
    return Begun(state, context, *manifest, *begun, std::move(early), kj::mv(paused));
  }

  // The rest of a begin that Node::Begin accepted. `early`/`paused`: the early pause and its
  // DirectPause::Run (staging: direct), or nullptr.
  static kj::Promise<void> Begun(DaemonState* state, BeginContext context, const Manifest& m,
                                 const BeginResult& begun_result, std::shared_ptr<DirectPause> early,
                                 kj::Promise<void> paused) {
    const Manifest* manifest = &m;
    const BeginResult* begun = &begun_result;
    const uint64_t id = begun->session_id;
    LogEvent(LogLevel::kInfo, "session_begin")
        .Add("session", id)
        .Add("tensors", manifest->tensors.size())
        .Add("partial", manifest->partial)
        .Add("tag", manifest->tag)
        .Add("stage_only", manifest->stage_only)
        .Add("wire_format", WireFormatName(manifest->wire_format))
        .Add("trainer_converts", begun->wire != nullptr ? begun->wire->entries().size() : 0)
        .Add("manifest_by_key", BeginsByKey(context.getParams()));
    // The deadline, and a session that fails on its own threads (a corrupt or short bucket, a
    // dead data-plane peer, staging exhausted), end the session at once, not when its trainer
    // next calls: a trainer blocked in a data-plane send may never call again.
    state->tasks.add(Watch(state, id));
    auto results = context.getResults();
    auto session_impl = kj::heap<SessionImpl>(*state, id);
    SessionImpl& session_ref = *session_impl;
    proto::Session::Client session = kj::mv(session_impl);
    results.setSession(session);
    results.setSessionId(id);
    results.setSeqBase(::refit::Session::SeqBase(0));
    results.setOwnSeqs(true);
    results.setDataEndpoint(state->receiver->Endpoint());
    results.setBucketBytes(state->config.limits.bucket_bytes);
    if (begun->wire != nullptr) wire::ToWire(begun->wire->plan(), results.initWirePlan());
    if (!begun->pause_first) return kj::READY_NOW;
    // staging: direct: the engine pauses before the trainer is answered (its buckets are then
    // converted into the engine's memory). A daemon task, so that the pause's outcome is always
    // settled (FinishDirectPause) even if the trainer goes away meanwhile.
    std::shared_ptr<DirectPause> adopted = early;
    absl::StatusOr<std::shared_ptr<DirectPause>> pause = state->node.StartDirectPause(id, std::move(early));
    if (!pause.ok()) {
      if (adopted != nullptr) {
        // The early pause is settled all the same (its DirectPause::Run must finish first).
        state->tasks.add(UndoEarlyPause(state, adopted, kj::mv(paused), std::string(pause.status().message())));
      }
      return Answer(context, pause.status());
    }
    std::shared_ptr<DirectPause> p = *pause;
    auto status = std::make_shared<absl::Status>();
    const bool early_pause = adopted != nullptr;
    kj::Promise<void> run = early_pause ? kj::mv(paused) : state->blocking.Run([p] { p->Run(); });
    auto done = run.then([state, p, status, id, early_pause] {
                      TracePoint("daemon.engine_paused");
                      *status = state->node.FinishDirectPause(p);
                      LogEvent(status->ok() ? LogLevel::kInfo : LogLevel::kWarn, "engine_paused_for_direct")
                          .Add("session", id)
                          .Add("early", early_pause)
                          .Add("status", status->ok() ? std::string("ok") : std::string(status->message()));
                    })
                    .fork();
    state->tasks.add(done.addBranch());
    // The session is the trainer's now, before its begin is answered: announces it sent ahead
    // (promise pipelining) are taken while the engine pauses; the session receives their
    // buckets and converts them once the engine has paused (Session::Options::await_placement).
    // A commit waits for the pause's outcome.
    TracePoint("daemon.begun");
    session_ref.CommitAfter(done.addBranch());
    capnp::PipelineBuilder<proto::Daemon::BeginResults> pipeline;
    pipeline.setSession(kj::mv(session));
    context.setPipeline(pipeline.build());
    return done.addBranch().then([status, context]() mutable {
      if (!status->ok()) return Answer(context, *status);
      return kj::Promise<void>(kj::READY_NOW);
    });
  }

  kj::Promise<void> join(JoinContext context) override {
    const uint64_t id = context.getParams().getSessionId();
    absl::StatusOr<uint32_t> joined = state_.node.Join(id);
    if (!joined.ok()) return Answer(context, joined.status());
    LogEvent(LogLevel::kInfo, "session_join").Add("session", id).Add("rank", *joined);
    auto results = context.getResults();
    results.setSession(kj::heap<SessionImpl>(state_, id, /*member=*/true, *joined));
    results.setSeqBase(::refit::Session::SeqBase(*joined));
    results.setOwnSeqs(true);
    results.setDataEndpoint(state_.receiver->Endpoint());
    results.setBucketBytes(state_.config.limits.bucket_bytes);
    if (std::shared_ptr<const WireTable> plan = state_.node.wire(); plan != nullptr) {
      wire::ToWire(plan->plan(), results.initWirePlan());
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> registerEngine(RegisterEngineContext context) override {
    auto params = context.getParams();
    RankPlacement placement;
    placement.tp_rank = params.getTpRank();
    placement.tp_size = params.getTpSize();
    placement.ep_rank = params.getEpRank();
    placement.ep_size = params.getEpSize();
    placement.device = params.getDevice();
    placement.model = wire::Str(params.getModel());
    if (state_.node.ranked()) return RegisterRank(context, std::move(placement));
    if (const EngineRecord* live = state_.node.engine(); live != nullptr && !live->gone) {
      // Checked before anything is mapped: a refused registration costs nothing.
      return Answer(context, absl::UnavailableError(absl::StrCat(
                                 "an engine is already registered (engine ", live->id,
                                 "); it must drop its registration or disconnect before another engine registers")));
    }
    EngineSetup setup;
    absl::StatusOr<std::unique_ptr<storage::EngineStorage>> storage = OpenStorage(params.getParams());
    if (!storage.ok()) return Answer(context, storage.status());
    setup.storage = std::move(*storage);
    absl::StatusOr<Planner> planner = Planner::Create(state_.spec, setup.storage->params());
    if (!planner.ok()) return Answer(context, planner.status());
    setup.planner = std::make_unique<Planner>(std::move(*planner));
    absl::Status staged = MakeStaging(state_.config, setup);
    if (!staged.ok()) return Answer(context, staged);
    setup.control = std::make_unique<RpcEngineControl>(params.getControl(), state_.timer);
    setup.version = params.getVersion();
    setup.dirty = params.getDirty();
    setup.tag = wire::Str(params.getTag());
    setup.placement = std::move(placement);
    if (absl::Status tag = CheckTag(setup.tag); !tag.ok()) {
      return Answer(context, absl::InvalidArgumentError(absl::StrCat("registration tag: ", tag.message())));
    }
    const size_t nparams = setup.storage->params().size();
    absl::StatusOr<uint64_t> id = state_.node.RegisterEngine(std::move(setup));
    if (!id.ok()) return Answer(context, id.status());
    const EngineRecord& e = *state_.node.engine();
    LogEvent(e.dirty ? LogLevel::kWarn : LogLevel::kInfo, "engine_registered")
        .Add("engine", *id)
        .Add("params", nparams)
        .Add("bytes", e.bytes)
        .Add("version", e.version)
        .Add("dirty", e.dirty)
        .Add("tag", e.tag);
    context.getResults().setRegistration(kj::heap<RegistrationImpl>(state_, *id));
    context.getResults().setVersion(e.version);
    return kj::READY_NOW;
  }

  // One rank of an engine of several ranks: its storage and control; the node builds the engine
  // (planner, staging, converter) over every rank once all are in.
  kj::Promise<void> RegisterRank(RegisterEngineContext context, RankPlacement placement) {
    auto params = context.getParams();
    EngineSetup setup;
    setup.tag = wire::Str(params.getTag());
    if (absl::Status tag = CheckTag(setup.tag); !tag.ok()) {
      return Answer(context, absl::InvalidArgumentError(absl::StrCat("registration tag: ", tag.message())));
    }
    absl::StatusOr<std::unique_ptr<storage::EngineStorage>> storage = OpenStorage(params.getParams());
    if (!storage.ok()) return Answer(context, storage.status());
    setup.storage = std::move(*storage);
    setup.control = std::make_unique<RpcEngineControl>(params.getControl(), state_.timer);
    setup.version = params.getVersion();
    setup.dirty = params.getDirty();
    setup.placement = placement;
    const size_t nparams = setup.storage->params().size();
    absl::StatusOr<uint64_t> id = state_.node.RegisterEngine(std::move(setup));
    if (!id.ok()) return Answer(context, id.status());
    const EngineRecord* group = state_.node.engine();
    LogEvent(params.getDirty() ? LogLevel::kWarn : LogLevel::kInfo, "engine_rank_registered")
        .Add("engine", *id)
        .Add("tp_rank", placement.tp_rank)
        .Add("ep_rank", placement.ep_rank)
        .Add("device", placement.device)
        .Add("params", nparams)
        .Add("version", params.getVersion())
        .Add("dirty", params.getDirty())
        .Add("all_ranks_in", group != nullptr);
    context.getResults().setRegistration(kj::heap<RegistrationImpl>(state_, *id));
    context.getResults().setVersion(group != nullptr ? group->version : params.getVersion());
    return kj::READY_NOW;
  }

  kj::Promise<void> status(StatusContext context) override {
    const Node& node = state_.node;
    auto s = context.getResults().initStatus();
    s.setModel(state_.spec.model);
    const EngineRecord* e = node.engine();
    s.setEngineRegistered(e != nullptr);
    if (e != nullptr) {
      s.setEngineParams(static_cast<uint32_t>(e->storage->params().size()));
      s.setEngineBytes(e->bytes);
      s.setEngineDirty(e->dirty);
      s.setEngineResponsive(e->control->Responsive());
      s.setEngineAsleep(e->asleep);
    }
    s.setAwaitingWake(node.awaiting_wake_session());
    s.setVersion(node.version());
    s.setTag(wire::Text(node.tag()));
    s.setVerifyAfterCommit(state_.config.verify_after_commit);
    s.setVerifyMismatches(node.verify_mismatches());
    if (node.ranked()) {
      std::vector<RankStatus> ranks = node.Ranks();
      auto list = s.initRanks(static_cast<unsigned>(ranks.size()));
      for (size_t i = 0; i < ranks.size(); ++i) {
        auto b = list[static_cast<unsigned>(i)];
        const RankStatus& r = ranks[i];
        b.setTpRank(r.tp_rank);
        b.setRegistered(r.registered);
        b.setEpRank(r.placement.ep_rank);
        b.setDevice(r.placement.device);
        b.setVersion(r.version);
        b.setTag(wire::Text(r.tag));
        b.setDirty(r.dirty);
        b.setLeftDirty(r.left_dirty);
        b.setResponsive(r.responsive);
        b.setParams(r.params);
        b.setBytes(r.bytes);
        b.setAsleep(r.asleep);
      }
    }
    s.setActiveSession(node.active_session_id());
    s.setStagingBytes(node.staging_bytes());
    s.setStagingLimitBytes(state_.config.limits.staging_bytes);
    s.setRingBytes(state_.ring->total_bytes());
    s.setRingOnDevice(state_.ring->kind() == storage::MemoryKind::kDevice);
    wire::ToWire(node.last_report(), s.initLastReport());
    s.setCommitted(node.committed());
    s.setRefused(node.refused());
    s.setAborted(node.aborted());
    s.setDataEndpoint(state_.receiver->Endpoint());
    s.setDaemonVersion(kVersion);
    s.setDaemonCommit(kGitCommit);
    return kj::READY_NOW;
  }

  kj::Promise<void> checksums(ChecksumsContext context) override {
    absl::StatusOr<std::vector<Node::ParamChecksum>> sums = state_.node.Checksums();
    if (!sums.ok()) return Answer(context, sums.status());
    auto results = context.getResults();
    results.setVersion(state_.node.version());
    auto list = results.initParams(static_cast<unsigned>(sums->size()));
    for (size_t i = 0; i < sums->size(); ++i) {
      auto b = list[static_cast<unsigned>(i)];
      b.setName((*sums)[i].name);
      b.setChecksum((*sums)[i].checksum);
      b.setNbytes((*sums)[i].nbytes);
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> commitVersion(CommitVersionContext context) override {
    const std::string tag = wire::Str(context.getParams().getTag());
    absl::StatusOr<std::shared_ptr<Commit>> started = state_.node.StartVersionCommit(tag);
    if (!started.ok()) return Answer(context, started.status());
    LogEvent(LogLevel::kInfo, "commit_version").Add("tag", tag);
    return RunCommitTask(state_, *started, kj::mv(context));
  }

  kj::Promise<void> rollback(RollbackContext context) override {
    absl::StatusOr<std::shared_ptr<Commit>> started = state_.node.StartRollback();
    if (!started.ok()) return Answer(context, started.status());
    LogEvent(LogLevel::kInfo, "rollback");
    return RunCommitTask(state_, *started, kj::mv(context));
  }

  kj::Promise<void> versions(VersionsContext context) override {
    std::vector<VersionInfo> versions = state_.node.Versions();
    auto results = context.getResults();
    results.setHoldLimit(state_.config.hold);
    results.setStagingLimitBytes(state_.config.limits.staging_bytes);
    auto list = results.initVersions(static_cast<unsigned>(versions.size()));
    for (size_t i = 0; i < versions.size(); ++i) {
      auto b = list[static_cast<unsigned>(i)];
      b.setTag(wire::Text(versions[i].tag));
      b.setState(versions[i].state);
      b.setVersion(versions[i].version);
      b.setBytes(versions[i].bytes);
      b.setChecksum(versions[i].checksum);
      b.setSessionId(versions[i].session_id);
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> abortActive(AbortActiveContext context) override {
    std::string reason = absl::StrCat("operator abort: ", wire::Str(context.getParams().getReason()));
    context.getResults().setAborted(state_.node.AbortActive(reason));
    state_.Changed();
    return kj::READY_NOW;
  }

 private:
  static kj::Promise<void> Watch(DaemonState* state, uint64_t id) {
    return state->timer.afterDelay(50 * kj::MILLISECONDS).then([state, id]() -> kj::Promise<void> {
      if (!state->node.Poll(id)) return kj::READY_NOW;
      return Watch(state, id);
    });
  }

  DaemonState& state_;
};

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
      tasks(error_handler_) {}

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
  // timeouts: a stuck engine cannot hold the shutdown forever.
  const absl::Time until = absl::Now() + absl::Milliseconds(config.pause_timeout_ms) +
                           absl::Milliseconds(config.resume_timeout_ms) + absl::Seconds(30);
  while (node.committing() && absl::Now() < until) timer.afterDelay(10 * kj::MILLISECONDS).wait(wait_scope);
  return !node.committing();
}

void DaemonState::ErrorHandler::taskFailed(kj::Exception&& e) {
  LogEvent(LogLevel::kError, "task_failed").Add("error", e.getDescription().cStr());
}

proto::Daemon::Client MakeDaemon(DaemonState& state) { return kj::heap<DaemonImpl>(state); }

}  // namespace refit::server
