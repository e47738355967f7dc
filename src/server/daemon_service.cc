#include "server/daemon_service.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/trace.h"
#include "common/version.h"
#include "kj/debug.h"
#include "proto/wire.h"
#include "server/commit_task.h"
#include "server/early_pause.h"
#include "server/engine_setup.h"
#include "server/group_join.h"
#include "server/group_task.h"
#include "server/log.h"
#include "server/manifest_cache.h"
#include "server/registration_service.h"
#include "server/rpc_answer.h"
#include "server/rpc_engine_control.h"
#include "server/session_service.h"
#include "server/status_causes.h"

namespace refit::server {
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
      kept = state_.manifests.KeptTensors(by_key);
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
      state->manifests.KeepTensors(tensors.key, std::make_shared<const std::vector<TensorDesc>>(manifest->tensors));
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
    results.setParallelChecksum(true);
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
    results.setParallelChecksum(true);
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
    if (state_.node.RanksFor(placement)) return RegisterRank(context, std::move(placement));
    // Checked before anything is mapped or planned: a refused registration costs nothing.
    if (absl::Status placed = state_.node.CheckPlacement(placement); !placed.ok()) return Answer(context, placed);
    if (const EngineRecord* live = state_.node.engine(); live != nullptr && !live->gone) {
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
    setup.control = NewRpcEngineControl(params.getControl(), state_.timer);
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
    context.getResults().setRegistration(MakeRegistration(state_, *id));
    context.getResults().setVersion(e.version);
    return JoinOnRegister(*id);
  }

  // A joining member of an engine group answers a registration once its peers said which version
  // the group serves and an engine (rank) that runs another one was paused (group_join.h), by this
  // registration's ask or a concurrent one: the engine never serves a step of it.
  kj::Promise<void> JoinOnRegister(uint64_t engine) {
    const GroupMember& group = state_.node.group();
    if (!group.enabled() || group.phase() != GroupPhase::kJoining) return kj::READY_NOW;
    return JoinGroup(&state_, engine);
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
    setup.control = NewRpcEngineControl(params.getControl(), state_.timer);
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
    context.getResults().setRegistration(MakeRegistration(state_, *id));
    context.getResults().setVersion(group != nullptr ? group->version : params.getVersion());
    return JoinOnRegister(*id);
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
    if (const GroupMember& group = node.group(); group.enabled()) {
      auto g = s.initGroup();
      g.setName(group.options().name);
      g.setMembers(group.options().members);
      g.setMember(group.options().member);
      g.setPhase(GroupPhaseName(group.phase()));
      g.setTag(wire::Text(group.tag()));
      g.setPendingTag(wire::Text(group.pending_tag()));
      g.setDirty(group.dirty());
      g.setReason(wire::Text(group.reason()));
      g.setDeadlineLeftMs(static_cast<uint64_t>(absl::ToInt64Milliseconds(group.DeadlineLeft())));
      g.setGroupCommits(group.commits());
      g.setGroupAborts(group.aborts());
      g.setDeadlineExpiries(group.expiries());
      g.setGroupVersion(wire::Text(group.group_version()));
    }
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

  kj::Promise<void> groupCommit(GroupCommitContext context) override {
    const std::string tag = wire::Str(context.getParams().getTag());
    const absl::Duration deadline = absl::Milliseconds(context.getParams().getDeadlineMs());
    absl::StatusOr<std::shared_ptr<Commit>> started = state_.node.StartGroupCommit(tag, deadline);
    if (!started.ok()) return Answer(context, started.status());
    LogEvent(LogLevel::kInfo, "group_commit").Add("tag", tag);
    return RunGroupCopy(state_, *started, kj::mv(context));
  }

  kj::Promise<void> groupResume(GroupResumeContext context) override {
    const std::string tag = wire::Str(context.getParams().getTag());
    absl::StatusOr<std::shared_ptr<Commit>> started = state_.node.StartGroupResume(tag);
    if (!started.ok()) return Answer(context, started.status());
    // Test builds: the member dies (or stalls) with the coordinator's resume in hand.
    if (absl::Status hit = REFIT_FAILPOINT(state_.failpoints.get(), failpoints::kGroupResume); !hit.ok()) {
      LogEvent(LogLevel::kWarn, "group_resume_failpoint").Add("tag", tag);
    }
    return RunGroupResume(state_, *started, kj::mv(context));
  }

  kj::Promise<void> groupAbort(GroupAbortContext context) override {
    const std::string tag = wire::Str(context.getParams().getTag());
    const std::string reason = wire::Str(context.getParams().getReason());
    return RunGroupAbort(state_, tag, reason.empty() ? "the coordinator aborted it" : reason, kj::mv(context));
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

proto::Daemon::Client MakeDaemon(DaemonState& state) { return kj::heap<DaemonImpl>(state); }

}  // namespace refit::server
