#include "server/daemon_service.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "kj/debug.h"
#include "common/checksum.h"
#include "proto/wire.h"
#include "refit/committer.h"
#include "refit/cpu_converter.h"
#include "server/blocking.h"
#include "server/log.h"
#include "storage/shm_storage.h"
#if REFIT_HAVE_CUDA
#include "refit/gpu/gpu_converter.h"
#include "storage/cuda_ipc_storage.h"
#endif
#include <cstring>

namespace refit::server {
namespace {

// Errors cross the wire as exception descriptions; clients print them as they are.
kj::Exception Failure(absl::string_view message) {
  return kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__, kj::heapString(message.data(), message.size()));
}
[[noreturn]] void Throw(absl::string_view message) { kj::throwFatalException(Failure(message)); }

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

std::string ReportLine(const RefitReport& r) {
  return absl::StrCat("event=refit session=", r.session_id, " outcome=", r.outcome, " version=", r.version,
                      " bytes_in=", r.bytes_in, " bytes_out=", r.bytes_out, " buckets=", r.buckets,
                      " tensors=", r.tensors, " receive_ms=", r.times.receive_ms, " convert_ms=", r.times.convert_ms,
                      " validate_ms=", r.times.validate_ms, " commit_ms=", r.times.commit_ms,
                      " pause_ms=", r.times.pause_ms, " total_ms=", r.times.total_ms, " plan_ms=", r.times.plan_ms,
                      " finish_ms=", r.times.finish_ms, " prepare_ms=", r.times.prepare_ms,
                      r.reason.empty() ? "" : absl::StrCat(" reason=\"", r.reason, "\""));
}

class SessionImpl;

class RegistrationImpl final : public proto::Registration::Server {
 public:
  RegistrationImpl(DaemonState& state, uint64_t engine_id) : state_(state), engine_id_(engine_id) {}
  ~RegistrationImpl() {
    if (!state_.engine || state_.engine->id != engine_id_) return;
    Log(LogLevel::kInfo, absl::StrCat("event=engine_unregistered engine=", engine_id_));
    if (state_.active) state_.active->session->Abort("engine unregistered");
    if (state_.active && !state_.active->committing) {
      RefitReport r = state_.active->session->Report();
      r.outcome = "aborted";
      r.reason = "engine unregistered";
      state_.EndSession(r);
    }
    state_.engine.reset();
    if (state_.hooks.on_engine) state_.hooks.on_engine(false);
  }

 protected:
  kj::Promise<void> version(VersionContext context) override {
    context.getResults().setVersion(state_.version);
    return kj::READY_NOW;
  }

 private:
  DaemonState& state_;
  uint64_t engine_id_;
};

// One commit, run as a daemon task so that a trainer disconnecting mid-commit cannot cancel
// the swap halfway: the commit window always runs to the engine's resume.
struct CommitRun {
  DaemonState& state;
  uint64_t id;
  double validate_ms = 0, copy_ms = 0, pause_ms = 0, finish_ms = 0, prepare_ms = 0;
  absl::Status finished;
  absl::StatusOr<CommitStats> copied = absl::UnknownError("not run");

  CommitRun(DaemonState& s, uint64_t i) : state(s), id(i) {}
  bool IsActive() const { return state.active && state.active->session->id() == id; }

  void End(const std::string& outcome, const std::string& reason, uint64_t version = 0) {
    RefitReport r = state.active->session->Report();
    r.outcome = outcome;
    r.reason = reason;
    r.version = version;
    r.times.validate_ms = validate_ms;
    r.times.finish_ms = finish_ms;
    r.times.prepare_ms = prepare_ms;
    r.times.commit_ms = copy_ms;
    r.times.pause_ms = pause_ms;
    r.times.total_ms = Ms(absl::Now() - state.active->begun);
    state.EndSession(r);
  }
};

kj::Promise<void> RunCommit(std::shared_ptr<CommitRun> run) {
  Session* sp = run->state.active->session.get();
  return RunBlocking(
             run->state.io,
             [sp, run] {
               absl::Time t0 = absl::Now();
               run->finished = sp->Finish();
               run->finish_ms = Ms(absl::Now() - t0);
             },
             [sp] { sp->Abort("commit cancelled"); })
      .then([run]() -> kj::Promise<void> {
        if (!run->IsActive()) Throw("session ended");
        if (!run->finished.ok()) {
          std::string reason(run->finished.message());
          run->End(run->finished.code() == absl::StatusCode::kResourceExhausted ? "failed" : "aborted", reason);
          Throw(reason);
        }
        Session& s = *run->state.active->session;
        absl::Time t0 = absl::Now();
        absl::Status valid = s.Validate();
        if (valid.ok() && run->state.engine->dirty && s.partial()) {
          valid = absl::FailedPreconditionError(
              "refit refused: the engine's weights are dirty after a failed commit; a full refit must land first");
        }
        run->validate_ms = Ms(absl::Now() - t0);
        if (!valid.ok()) {
          std::string reason(valid.message());
          run->End("refused", reason);
          Throw(reason);
        }
        // Build every engine parameter (assembly, layout steps, derived state) before pausing,
        // then the commit window: pause, copy the prepared bytes in place, resume.
        auto* engine = &*run->state.engine;
        const Session* sp = &s;
        auto prepared = std::make_shared<absl::StatusOr<PreparedCommit>>(absl::UnknownError("not run"));
        return RunBlocking(run->state.io,
                           [sp, engine, prepared, run, fp = run->state.failpoints.get()] {
                             absl::Time t0 = absl::Now();
                             *prepared = PrepareCommit(*engine->planner, sp->staging(), sp->ledger().Produced());
                             if (prepared->ok()) {
                               absl::Status st = PrepareStorageWrites(**prepared, *engine->storage);
                               if (!st.ok()) *prepared = st;
                             }
                             run->prepare_ms = Ms(absl::Now() - t0);
                             absl::Status hit = REFIT_FAILPOINT(fp, failpoints::kBeforeCommit);
                             if (prepared->ok() && !hit.ok()) *prepared = hit;
                           })
            .then([run, engine, prepared]() -> kj::Promise<void> {
              if (!prepared->ok()) {
                std::string reason = absl::StrCat("refit refused: ", prepared->status().message());
                run->End("refused", reason);
                Throw(reason);
              }
              absl::Time pause_start = absl::Now();
              Log(LogLevel::kDebug, absl::StrCat("event=commit_window session=", run->id, " phase=pausing"));
              return engine->control.pauseRequest()
                  .send()
                  .then(
                      [run, engine, prepared](auto&&) {
                        return RunBlocking(run->state.io, [engine, prepared, run] {
                          absl::Time t0 = absl::Now();
                          const FailpointSet* fp = run->state.failpoints.get();
                          absl::Status hit = REFIT_FAILPOINT(fp, failpoints::kMidCommit);
                          run->copied = hit.ok() ? WritePrepared(*engine->planner, **prepared, *engine->storage)
                                                 : absl::StatusOr<CommitStats>(hit);
                          if (run->copied.ok()) {
                            // Copied but not resumed: an error here is treated like a failed copy.
                            hit = REFIT_FAILPOINT(fp, failpoints::kAfterCopy);
                            if (!hit.ok()) run->copied = hit;
                          }
                          run->copy_ms = Ms(absl::Now() - t0);
                        });
                      },
                      [run](kj::Exception&& e) -> kj::Promise<void> {
                        std::string reason = absl::StrCat("engine did not pause: ", e.getDescription().cStr());
                        run->End("failed", reason);
                        Throw(reason);
                      })
                  .then([run, engine]() -> kj::Promise<void> {
              if (!run->copied.ok()) {
                engine->dirty = true;  // a partial copy: the engine must not serve until a full refit lands
                std::string reason =
                    absl::StrCat("commit failed, engine left paused and dirty: ", run->copied.status().message());
                run->End("failed", reason);
                Throw(reason);
              }
              uint64_t version = ++run->state.version;
              engine->dirty = false;
              auto req = engine->control.resumeRequest();
              req.setVersion(version);
              return req.send().ignoreResult();
            })
                  .then([run, pause_start]() {
                    run->pause_ms = Ms(absl::Now() - pause_start);
                    run->End("committed", "", run->state.version);
                    // The engine serves the new version; the trainer has not been answered yet.
                    absl::Status hit = REFIT_FAILPOINT(run->state.failpoints.get(), failpoints::kAfterCommit);
                    if (!hit.ok()) Throw(hit.message());
                  });
            });
      });
}

class SessionImpl final : public proto::Session::Server {
 public:
  // `member`: a trainer rank that joined the session (Daemon.join) rather than began it; it
  // announces, then detaches (or aborts the refit); only the rank that began it commits.
  SessionImpl(DaemonState& state, uint64_t id, bool member = false) : state_(state), id_(id), member_(member) {}

  ~SessionImpl() {
    // The trainer dropped its session (disconnect or done). An uncommitted session is aborted;
    // a commit in progress runs to its end on its own. A joined rank that detached is done.
    if (detached_ || !IsActive() || state_.active->committing) return;
    std::string reason = member_ ? "a joined trainer rank disconnected before detaching" : "trainer disconnected";
    state_.active->session->Abort(reason);
    End("aborted", reason);
  }

 protected:
  kj::Promise<void> announce(AnnounceContext context) override {
    Session& s = Active();
    if (detached_) Throw("this trainer rank has detached from the session");
    absl::StatusOr<BucketHeader> header = wire::FromWire(context.getParams().getHeader());
    uint32_t seq = 0;
    absl::Status status = header.ok() ? s.Announce(std::move(*header), &seq) : header.status();
    if (!status.ok()) {
      s.Abort(std::string(status.message()));
      if (!state_.active->committing) End("aborted", std::string(status.message()));
      Throw(status.message());
    }
    context.getResults().setSeq(seq);
    return kj::READY_NOW;
  }

  kj::Promise<void> detach(DetachContext context) override {
    Active();
    if (!member_) Throw("the rank that began the session commits or aborts it; detach is for joined ranks");
    detached_ = true;
    return kj::READY_NOW;
  }

  kj::Promise<void> abort(AbortContext context) override {
    Session& s = Active();
    std::string reason = absl::StrCat("trainer aborted: ", context.getParams().getReason().cStr());
    s.Abort(reason);
    if (!state_.active->committing) End("aborted", reason);
    return kj::READY_NOW;
  }

  kj::Promise<void> commit(CommitContext context) override {
    Active();
    if (member_) Throw("only the rank that began the session commits it; joined ranks detach");
    if (state_.active->committing) Throw("commit already in progress");
    state_.active->committing = true;
    auto run = std::make_shared<CommitRun>(state_, id_);
    auto forked = RunCommit(run).fork();
    state_.tasks.add(forked.addBranch().catch_([](kj::Exception&&) {}));
    DaemonState* state = &state_;
    return forked.addBranch().then([state, context]() mutable {
      wire::ToWire(state->last_report, context.getResults().initReport());
    });
  }

 private:
  bool IsActive() const { return state_.active && state_.active->session->id() == id_; }

  Session& Active() {
    if (!IsActive()) {
      Throw(absl::StrCat("session ", id_, " is not active (last outcome: ", state_.last_report.outcome,
                         state_.last_report.reason.empty() ? "" : ": ", state_.last_report.reason, ")"));
    }
    return *state_.active->session;
  }

  void End(const std::string& outcome, const std::string& reason) {
    RefitReport r = state_.active->session->Report();
    r.outcome = outcome;
    r.reason = reason;
    r.times.total_ms = Ms(absl::Now() - state_.active->begun);
    state_.EndSession(r);
  }

  DaemonState& state_;
  const uint64_t id_;
  const bool member_;
  bool detached_ = false;
};

// Maps the engine's registered parameters: all in POSIX shm, or all in GPU memory (CUDA IPC).
absl::StatusOr<std::unique_ptr<storage::EngineStorage>> OpenStorage(capnp::List<proto::EngineParam>::Reader list) {
  std::vector<storage::ShmParam> shm;
#if REFIT_HAVE_CUDA
  std::vector<storage::CudaIpcParam> cuda;
#endif
  for (auto p : list) {
    std::string name = p.getName().cStr();
    absl::StatusOr<DType> dtype = ParseDType(p.getDtype().cStr());
    if (!dtype.ok()) return absl::InvalidArgumentError(absl::StrCat("engine parameter '", name, "': ", dtype.status().message()));
    Shape shape;
    for (int64_t d : p.getShape()) shape.push_back(d);
    storage::ParamInfo info{name, *dtype, shape, p.getNbytes()};
    if (p.getStorage().isShm()) {
      shm.push_back({std::move(info), p.getStorage().getShm().getName().cStr(), p.getStorage().getShm().getOffset()});
      continue;
    }
#if REFIT_HAVE_CUDA
    auto c = p.getStorage().getCudaIpc();
    storage::CudaIpcParam cp{std::move(info), {}, c.getOffset(), c.getDevice()};
    if (c.getHandle().size() != cp.handle.size()) {
      return absl::InvalidArgumentError(absl::StrCat("engine parameter '", name, "': CUDA IPC handle of ",
                                                     c.getHandle().size(), " bytes (expected ", cp.handle.size(), ")"));
    }
    std::memcpy(cp.handle.data(), c.getHandle().begin(), cp.handle.size());
    cuda.push_back(std::move(cp));
#else
    return absl::InvalidArgumentError(
        absl::StrCat("engine parameter '", name, "' is in GPU memory, but this refitd was built without CUDA"));
#endif
  }
#if REFIT_HAVE_CUDA
  if (!cuda.empty()) {
    if (!shm.empty()) return absl::InvalidArgumentError("an engine registers all parameters in shm or all on the GPU");
    absl::StatusOr<std::unique_ptr<storage::CudaIpcEngineStorage>> s = storage::CudaIpcEngineStorage::Open(std::move(cuda));
    if (!s.ok()) return s.status();
    return std::unique_ptr<storage::EngineStorage>(std::move(*s));
  }
#endif
  absl::StatusOr<std::unique_ptr<storage::ShmEngineStorage>> s = storage::ShmEngineStorage::Open(std::move(shm));
  if (!s.ok()) return s.status();
  return std::unique_ptr<storage::EngineStorage>(std::move(*s));
}

// Staging memory and converter for a registered engine: host staging and the CPU converter, or,
// with `staging: device` and an engine on the GPU, device staging and the GPU converter.
absl::StatusOr<std::pair<std::unique_ptr<StagingPool>, std::unique_ptr<Converter>>> MakeStaging(
    const Config& config, const storage::EngineStorage& storage) {
  if (config.staging == "device") {
    if (!storage.on_device()) {
      return absl::InvalidArgumentError("config says staging: device, but the engine registered host (shm) parameters");
    }
#if REFIT_HAVE_CUDA
    absl::StatusOr<std::unique_ptr<storage::Memory>> memory = storage::NewDeviceMemory(storage.device());
    if (!memory.ok()) return memory.status();
    absl::StatusOr<std::unique_ptr<Converter>> converter = NewGpuConverter(storage.device());
    if (!converter.ok()) return converter.status();
    return std::make_pair(std::make_unique<StagingPool>(std::move(*memory)), std::move(*converter));
#endif
  }
  // Host staging: pinned when the engine is on the GPU, so the commit copy is a fast H2D copy.
  std::unique_ptr<storage::Memory> memory = storage.on_device() ? storage::NewPinnedHostMemory() : storage::NewHostMemory();
  return std::make_pair(std::make_unique<StagingPool>(std::move(memory)),
                        std::unique_ptr<Converter>(std::make_unique<CpuConverter>()));
}

class DaemonImpl final : public proto::Daemon::Server {
 public:
  explicit DaemonImpl(DaemonState& state) : state_(state) {}

 private:
  kj::Promise<void> WatchForFailure(uint64_t id) {
    return state_.timer.afterDelay(50 * kj::MILLISECONDS).then([this, id]() -> kj::Promise<void> {
      if (!state_.active || state_.active->session->id() != id) return kj::READY_NOW;
      if (!state_.active->committing) {
        absl::Status failure = state_.active->session->failure();
        if (!failure.ok()) {
          RefitReport r = state_.active->session->Report();
          r.outcome = failure.code() == absl::StatusCode::kResourceExhausted ? "failed" : "aborted";
          r.reason = std::string(failure.message());
          r.times.total_ms = Ms(absl::Now() - state_.active->begun);
          state_.EndSession(r);
          return kj::READY_NOW;
        }
      }
      return WatchForFailure(id);
    });
  }

 public:

 protected:
  kj::Promise<void> begin(BeginContext context) override {
    const absl::Time requested = absl::Now();  // total_ms counts the manifest's planning too
    if (!state_.engine) Throw("no engine is registered");
    if (state_.active) Throw(absl::StrCat("busy: session ", state_.active->session->id(), " is active"));
    absl::StatusOr<Manifest> manifest = wire::FromWire(context.getParams().getManifest());
    if (!manifest.ok()) Throw(manifest.status().message());
    if (manifest->model != state_.spec.model) {
      Throw(absl::StrCat("manifest is for model '", manifest->model, "' but this daemon serves '", state_.spec.model, "'"));
    }
    if (state_.engine->dirty && manifest->partial) {
      Throw("partial refit refused: the engine's weights are dirty after an interrupted commit; a full refit must land first");
    }
    const SessionLimits& limits = state_.config.limits;
    if (manifest->tensors.size() > limits.max_tensors) {
      Throw(absl::StrCat("manifest lists ", manifest->tensors.size(), " tensors (limit ", limits.max_tensors, ")"));
    }
    // Fail fast on what the manifest already gets wrong; commit re-checks what actually arrives.
    std::vector<std::string> problems;
    for (const TensorDesc& t : manifest->tensors) {
      absl::StatusOr<TensorPlan> plan = state_.engine->planner->Plan(t.name, t.dtype, t.shape);
      if (!plan.ok()) problems.push_back(std::string(plan.status().message()));
    }
    if (!problems.empty()) {
      size_t n = problems.size();
      if (problems.size() > 64) problems.resize(64);
      Throw(absl::StrCat("manifest refused (", n, " problem", n == 1 ? "" : "s", "): ", absl::StrJoin(problems, "; ")));
    }
    uint32_t deadline_ms = manifest->deadline_ms != 0 ? std::min(manifest->deadline_ms, limits.deadline_ms)
                                                      : limits.deadline_ms;
    Session::Options options;
    options.id = state_.NewSessionId();
    options.partial = manifest->partial;
    options.deadline = absl::Now() + absl::Milliseconds(deadline_ms);
    options.limits = limits;
    options.failpoints = state_.failpoints.get();
    state_.active = DaemonState::Active{
        std::make_unique<Session>(*state_.engine->planner, *state_.receiver, *state_.ring, *state_.engine->converter,
                                  *state_.engine->pool, options),
        requested, false, Ms(absl::Now() - requested)};
    uint64_t id = options.id;
    Log(LogLevel::kInfo, absl::StrCat("event=session_begin session=", id, " tensors=", manifest->tensors.size(),
                                      " partial=", manifest->partial ? "true" : "false"));
    state_.NotifySession();
    // The deadline also ends a session whose trainer went quiet without committing.
    state_.tasks.add(state_.timer.afterDelay(deadline_ms * kj::MILLISECONDS).then([this, id] {
      if (!state_.active || state_.active->session->id() != id) return;
      state_.active->session->Abort("session deadline passed");
      if (!state_.active->committing) {
        RefitReport r = state_.active->session->Report();
        r.outcome = "aborted";
        r.reason = "session deadline passed";
        r.times.total_ms = Ms(absl::Now() - state_.active->begun);
        state_.EndSession(r);
      }
    }));
    // A session that fails on its own threads (a corrupt or short bucket, a dead data-plane
    // peer, staging exhausted) is ended at once, not when its trainer next calls: a trainer
    // blocked in a data-plane send may never call again.
    state_.tasks.add(WatchForFailure(id));
    auto results = context.getResults();
    results.setSession(kj::heap<SessionImpl>(state_, id));
    results.setSessionId(id);
    results.setDataEndpoint(state_.receiver->Endpoint());
    results.setBucketBytes(limits.bucket_bytes);
    return kj::READY_NOW;
  }

  kj::Promise<void> join(JoinContext context) override {
    const uint64_t id = context.getParams().getSessionId();
    if (!state_.active || state_.active->session->id() != id) {
      Throw(absl::StrCat("session ", id, " is not active", state_.active ? "" : " (no session is)"));
    }
    if (state_.active->committing) Throw(absl::StrCat("session ", id, " is committing; too late to join"));
    Log(LogLevel::kInfo, absl::StrCat("event=session_join session=", id));
    auto results = context.getResults();
    results.setSession(kj::heap<SessionImpl>(state_, id, /*member=*/true));
    results.setDataEndpoint(state_.receiver->Endpoint());
    results.setBucketBytes(state_.config.limits.bucket_bytes);
    return kj::READY_NOW;
  }

  kj::Promise<void> registerEngine(RegisterEngineContext context) override {
    auto params = context.getParams();
    absl::StatusOr<std::unique_ptr<storage::EngineStorage>> storage = OpenStorage(params.getParams());
    if (!storage.ok()) Throw(storage.status().message());
    absl::StatusOr<Planner> planner = Planner::Create(state_.spec, (*storage)->params());
    if (!planner.ok()) Throw(planner.status().message());
    if (state_.active) {
      state_.active->session->Abort("engine re-registered");
      if (!state_.active->committing) {
        RefitReport r = state_.active->session->Report();
        r.outcome = "aborted";
        r.reason = "engine re-registered";
        state_.EndSession(r);
      }
    }
    absl::StatusOr<std::pair<std::unique_ptr<StagingPool>, std::unique_ptr<Converter>>> staging =
        MakeStaging(state_.config, **storage);
    if (!staging.ok()) Throw(staging.status().message());
    uint64_t bytes = 0;
    for (const auto& p : (*storage)->params()) bytes += p.nbytes;
    uint64_t id = state_.next_engine_id++;
    state_.engine = DaemonState::Engine{id,
                                        std::make_unique<Planner>(std::move(*planner)),
                                        std::move(*storage),
                                        std::move(staging->first),
                                        std::move(staging->second),
                                        params.getControl(),
                                        bytes,
                                        params.getDirty()};
    state_.version = params.getVersion();
    Log(params.getDirty() ? LogLevel::kWarn : LogLevel::kInfo,
        absl::StrCat("event=engine_registered engine=", id, " params=", state_.engine->storage->params().size(),
                     " bytes=", bytes, " version=", state_.version, " dirty=", params.getDirty() ? "true" : "false"));
    if (state_.hooks.on_engine) state_.hooks.on_engine(true);
    context.getResults().setRegistration(kj::heap<RegistrationImpl>(state_, id));
    context.getResults().setVersion(state_.version);
    return kj::READY_NOW;
  }

  kj::Promise<void> status(StatusContext context) override {
    auto s = context.getResults().initStatus();
    s.setModel(state_.spec.model);
    s.setEngineRegistered(state_.engine.has_value());
    if (state_.engine) {
      s.setEngineParams(static_cast<uint32_t>(state_.engine->storage->params().size()));
      s.setEngineBytes(state_.engine->bytes);
    }
    s.setVersion(state_.version);
    s.setActiveSession(state_.active ? state_.active->session->id() : 0);
    s.setStagingBytes(state_.active ? state_.active->session->staging().bytes() : 0);
    s.setStagingLimitBytes(state_.config.limits.staging_bytes);
    s.setRingBytes(state_.ring->total_bytes());
    s.setRingOnDevice(state_.ring->kind() == storage::MemoryKind::kDevice);
    wire::ToWire(state_.last_report, s.initLastReport());
    s.setCommitted(state_.committed);
    s.setRefused(state_.refused);
    s.setAborted(state_.aborted);
    s.setDataEndpoint(state_.receiver->Endpoint());
    s.setEngineDirty(state_.engine && state_.engine->dirty);
    return kj::READY_NOW;
  }

  kj::Promise<void> checksums(ChecksumsContext context) override {
    if (!state_.engine) Throw("no engine is registered");
    if (state_.active && state_.active->committing) Throw("busy: a commit is in progress");
    const auto& params = state_.engine->storage->params();
    auto results = context.getResults();
    results.setVersion(state_.version);
    auto list = results.initParams(static_cast<unsigned>(params.size()));
    std::vector<uint8_t> buf;
    for (size_t i = 0; i < params.size(); ++i) {
      buf.resize(params[i].nbytes);
      absl::Status st = state_.engine->storage->ReadToHost(i, buf.data());
      if (!st.ok()) Throw(st.message());
      list[static_cast<unsigned>(i)].setName(params[i].name);
      list[static_cast<unsigned>(i)].setChecksum(Checksum64(buf.data(), buf.size()));
      list[static_cast<unsigned>(i)].setNbytes(params[i].nbytes);
    }
    return kj::READY_NOW;
  }

  kj::Promise<void> abortActive(AbortActiveContext context) override {
    if (!state_.active) {
      context.getResults().setAborted(false);
      return kj::READY_NOW;
    }
    std::string reason = absl::StrCat("operator abort: ", context.getParams().getReason().cStr());
    state_.active->session->Abort(reason);
    if (!state_.active->committing) {
      RefitReport r = state_.active->session->Report();
      r.outcome = "aborted";
      r.reason = reason;
      r.times.total_ms = Ms(absl::Now() - state_.active->begun);
      state_.EndSession(r);
    }
    context.getResults().setAborted(true);
    return kj::READY_NOW;
  }

 private:
  DaemonState& state_;
};

}  // namespace

DaemonState::DaemonState(Config config_in, spec::ModelSpec spec_in, std::unique_ptr<transport::Receiver> receiver_in,
                         std::unique_ptr<BucketRing> ring_in, kj::LowLevelAsyncIoProvider& io_in, kj::Timer& timer_in,
                         DaemonHooks hooks_in)
    : config(std::move(config_in)),
      spec(std::move(spec_in)),
      receiver(std::move(receiver_in)),
      ring(std::move(ring_in)),
      io(io_in),
      timer(timer_in),
      hooks(std::move(hooks_in)),
      tasks(error_handler_) {}

DaemonState::~DaemonState() {
  if (active) active->session->Abort("daemon shutting down");
}

void DaemonState::ErrorHandler::taskFailed(kj::Exception&& e) {
  Log(LogLevel::kError, absl::StrCat("event=task_failed error=\"", e.getDescription().cStr(), "\""));
}

void DaemonState::EndSession(RefitReport report) {
  if (active) report.times.plan_ms = active->plan_ms;
  if (report.outcome == "committed") {
    ++committed;
  } else if (report.outcome == "refused") {
    ++refused;
  } else {
    ++aborted;
  }
  last_report = report;
  Log(report.outcome == "committed" ? LogLevel::kInfo : LogLevel::kWarn, ReportLine(report));
  if ((report.outcome == "aborted" || report.outcome == "failed") && report.reason.rfind("trainer ", 0) != 0) {
    // Ended by refitd (deadline, a corrupt bucket, engine gone, operator): a trainer of this
    // session may be blocked sending a bucket nobody will receive. Its connection is dropped so
    // the send fails; it reconnects for its next session.
    receiver->DisconnectPeers();
  }
  if (hooks.on_report) hooks.on_report(report);
  active.reset();
  NotifySession();
}

uint64_t DaemonState::NewSessionId() {
  uint64_t id = 0;
  while (id == 0 || id == last_session_id) id = entropy();  // random_device yields 32 bits
  last_session_id = id;
  return id;
}

void DaemonState::NotifySession() {
  if (hooks.on_session) hooks.on_session(active ? active->session->staging().bytes() : 0, active.has_value());
}

proto::Daemon::Client MakeDaemon(DaemonState& state) { return kj::heap<DaemonImpl>(state); }

}  // namespace refit::server
