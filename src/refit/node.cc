#include "refit/node.h"

#include <algorithm>
#include <span>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/checksum.h"
#include "common/status_macros.h"
#include "common/trace.h"
#include "refit/commit_verify.h"
#include "refit/committer.h"
#include "refit/manifest_check.h"
#include "refit/megatron_source.h"
#include "storage/engine_storage.h"

namespace refit {
namespace {

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

}  // namespace

Node::Node(NodeOptions options, transport::Receiver& receiver, BucketRing& ring, NodeHooks hooks)
    : options_(std::move(options)),
      system_clock_(options_.clock == nullptr ? NewSystemClock() : nullptr),
      clock_(options_.clock != nullptr ? options_.clock : system_clock_.get()),
      receiver_(receiver),
      ring_(ring),
      hooks_(std::move(hooks)),
      versions_(options_.hold),
      group_(options_.group, clock_) {
  const spec::ModelSpec* spec = options_.spec;
  ranked_ = spec != nullptr && spec->tp_size > 1 && !spec->tp_rank_given;
  if (ranked_) {
    for (int r = 0; r < spec->tp_size; ++r) {
      absl::StatusOr<spec::ModelSpec> rank_spec = spec::ForRank(*spec, r);  // r < tp_size: cannot fail
      rank_specs_.push_back(std::make_shared<const spec::ModelSpec>(std::move(*rank_spec)));
    }
    ranks_.resize(static_cast<size_t>(spec->tp_size));
    left_dirty_.assign(static_cast<size_t>(spec->tp_size), false);
  }
  if (hooks_.on_ranks) hooks_.on_ranks(Ranks());
}

Node::~Node() {
  if (active_) active_->session->Abort("daemon shutting down");
}

// ---- engines ----

absl::StatusOr<uint64_t> Node::RegisterEngine(EngineSetup setup) {
  ReleaseEnded();
  if (ranked_) return RegisterRank(std::move(setup));
  if (absl::Status placed = CheckRank(setup); !placed.ok()) return placed;
  if (engine_ && !engine_->gone) {
    return absl::UnavailableError(absl::StrCat(
        "an engine is already registered (engine ", engine_->id,
        "); it must drop its registration or disconnect before another engine registers"));
  }
  auto record = std::make_shared<EngineRecord>();
  record->id = next_engine_id_++;
  record->planner = std::move(setup.planner);
  record->storage = std::move(setup.storage);
  if (options_.hold > 0 && !setup.new_pool) {
    return absl::InternalError("hold > 0 needs EngineSetup::new_pool (a pool per kept version)");
  }
  record->pool = std::move(setup.pool);
  record->new_pool = std::move(setup.new_pool);
  record->converter = std::move(setup.converter);
  record->control = std::move(setup.control);
  for (const auto& p : record->storage->params()) record->bytes += p.nbytes;
  record->version = setup.version;
  record->tag = std::move(setup.tag);
  record->dirty = setup.dirty;
  group_.EngineRegistered(record->tag, record->dirty);
  GroupChanged();
  engine_ = std::move(record);
  if (hooks_.on_engine) hooks_.on_engine(true);
  if (hooks_.on_ranks) hooks_.on_ranks(Ranks());
  return engine_->id;
}

bool Node::UnregisterEngine(uint64_t engine_id) {
  ReleaseEnded();
  if (ranked_) {
    auto it = std::find_if(ranks_.begin(), ranks_.end(),
                           [engine_id](const std::shared_ptr<RankRecord>& r) { return r && r->id == engine_id; });
    if (it == ranks_.end()) return false;
    (*it)->gone = true;
    // A rank a failed commit left dirty is named until it registers again.
    if ((*it)->dirty) left_dirty_[static_cast<size_t>(it - ranks_.begin())] = true;
    it->reset();  // the group engine (and a commit in flight) still hold it
    if (hooks_.on_ranks) hooks_.on_ranks(Ranks());
  }
  if (!engine_ || (!ranked_ && engine_->id != engine_id)) return ranked_;
  engine_->gone = true;
  if (active_ && active_->engine.get() == engine_.get()) AbortWith(EndCause::kEngineError, "engine unregistered");
  versions_.Clear();  // kept versions were converted for this registration's parameters
  engine_.reset();
  if (hooks_.on_engine) hooks_.on_engine(false);
  if (hooks_.on_ranks) hooks_.on_ranks(Ranks());
  return true;
}

absl::Status Node::Ready() const {
  if (!engine_) return absl::UnavailableError(ranked_ ? MissingRanks() : "no engine registered");
  // A joining member's engine may be dirty because it is held paused (GroupJoinHolds): the
  // group's reason says why.
  if (group_.phase() == GroupPhase::kJoining) {
    if (absl::Status grouped = group_.Ready(); !grouped.ok()) return grouped;
  }
  if (engine_->dirty) return absl::UnavailableError("engine weights dirty after a failed commit");
  if (!engine_->control->Responsive()) return absl::UnavailableError("engine did not answer a pause or resume");
  if (absl::Status grouped = group_.Ready(); !grouped.ok()) return grouped;
  return absl::OkStatus();
}

uint64_t Node::version() const { return engine_ ? engine_->version : last_report_.version; }

const std::string& Node::tag() const {
  if (engine_) return engine_->tag;
  static const std::string kNone;
  return last_report_.outcome == Outcome::kCommitted ? last_report_.tag : kNone;
}

// ---- sessions ----

absl::StatusOr<BeginResult> Node::Begin(const Manifest& manifest, absl::Time requested, uint64_t tensors_key,
                                        uint64_t session_id) {
  ReleaseEnded();
  if (absl::Status may = MayBegin(manifest); !may.ok()) return may;
  // staging: direct, for an awake engine whose storage refitd maps in the staging pool's memory:
  // the manifest's plans say where each tensor goes in the engine (PlanPlacement).
  const bool direct = !manifest.stage_only && DirectPossible();
  absl::StatusOr<std::vector<std::shared_ptr<const TensorPlan>>> plans = PlanManifest(manifest, tensors_key, direct);
  if (!plans.ok()) return plans.status();
  if (manifest.stage_only) {
    if (absl::Status held = versions_.CheckStageOnly(manifest.tag, manifest.partial); !held.ok()) return held;
  }
  const SessionLimits& limits = options_.limits;
  SessionLimits session_limits = limits;
  if (options_.hold > 0) {
    // Room for one more version of this engine.
    absl::StatusOr<uint64_t> room = versions_.MakeRoom(engine_->bytes, limits.staging_bytes);
    NotifySession();
    if (!room.ok()) return room.status();
    session_limits.staging_bytes = *room;
  }
  const uint32_t deadline_ms =
      manifest.deadline_ms != 0 ? std::min(manifest.deadline_ms, limits.deadline_ms) : limits.deadline_ms;
  absl::StatusOr<uint64_t> id = TakeSessionId(session_id);
  if (!id.ok()) return id.status();
  absl::StatusOr<std::shared_ptr<const WireTable>> wire = WireTable::Create(*engine_->planner, manifest);
  if (!wire.ok()) return wire.status();
  Active a;
  if (direct) a.placement = PlaceDirect(*std::move(plans));
  Session::Options so = SessionOptions(manifest, *id, deadline_ms, session_limits);
  so.wire = *wire;
  // Converts nothing before the engine paused (its begin may be answered early: the trainer's
  // announces then arrive while it pauses).
  so.await_placement = a.placement != nullptr;
  a.wire = *wire;
  a.engine = engine_;
  a.stage_only = manifest.stage_only;
  if (options_.hold > 0) {
    a.own_pool = versions_.TakeSparePool();
    if (a.own_pool == nullptr) a.own_pool = engine_->new_pool();
  }
  StagingPool& pool = a.own_pool ? *a.own_pool : *engine_->pool;
  TracePoint("daemon.session_starting");
  a.session = std::make_unique<Session>(*engine_->planner, receiver_, ring_, *engine_->converter, pool, so);
  TracePoint("daemon.session_started");
  a.begun = requested;
  a.deadline = clock_->Now() + absl::Milliseconds(deadline_ms);
  a.plan_ms = Ms(absl::Now() - requested);
  a.tag = manifest.tag;
  const bool pause_first = a.placement != nullptr;
  active_ = std::move(a);
  NotifySession();
  return BeginResult{so.id, deadline_ms, so.wire, pause_first};
}

absl::Status Node::MayBegin(const Manifest& manifest) const {
  // Each refusal carries the cause a trainer acts on (WithCause): busy (begin again soon), the
  // engine missing or not answering, the engine dirty (only a full refit lands).
  auto busy = [](std::string why) { return WithCause(absl::UnavailableError("busy: " + why), EndCause::kBusy); };
  // Engine ranks: refused before anything is received or written unless every rank is in.
  if (!engine_) {
    return WithCause(absl::UnavailableError(ranked_ ? MissingRanks() : "no engine is registered"), EndCause::kEngineError);
  }
  if (active_ && active_->awaiting_wake) {
    return busy(absl::StrCat("session ", active_->session->id(), " is staged, waiting for the engine to wake"));
  }
  if (active_) return busy(absl::StrCat("session ", active_->session->id(), " is active"));
  if (group_.enabled() && !manifest.stage_only) {
    // A member's own commit would switch its ranks alone (docs/architecture.md "Engine groups").
    return absl::FailedPreconditionError(
        absl::StrCat("this daemon serves part of engine group '", group_.options().name,
                     "': refits are stage-only (prepare), and the group's coordinator commits them on every member"));
  }
  if (early_undoing_ > 0) {
    return busy("the engine is being resumed after a refused begin (staging: direct); begin again");
  }
  if (early_window_) return busy("another begin is being planned");
  if (!engine_->control->Responsive()) {
    return WithCause(absl::UnavailableError(absl::StrCat("engine ", engine_->id,
                                                         " did not answer a pause or resume in time; refits are "
                                                         "refused until it answers or registers again")),
                     EndCause::kEngineError);
  }
  if (engine_->asleep && options_.refuse_while_asleep) {
    return absl::FailedPreconditionError(
        "refit refused: the engine is asleep and this daemon refuses refits while it sleeps "
        "(engine.asleep_refits: refuse); refit after it wakes");
  }
  if (manifest.model != options_.model) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest is for model '", PrintableName(manifest.model), "' but this daemon serves '",
                     options_.model, "'"));
  }
  if (engine_->dirty && manifest.partial) {
    return WithCause(absl::FailedPreconditionError("partial refit refused: the engine's weights are dirty after an "
                                                   "interrupted commit; a full refit must land first"),
                     EndCause::kEngineDirty);
  }
  if (absl::Status tag = CheckTag(manifest.tag); !tag.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("manifest tag '", PrintableName(manifest.tag), "': ", tag.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::shared_ptr<const TensorPlan>>> Node::PlanManifest(const Manifest& manifest,
                                                                                  uint64_t tensors_key, bool direct) {
  std::vector<std::shared_ptr<const TensorPlan>> plans;
  // The tensor list this planner accepted last (the same key): its checks passed and its plans
  // are known.
  EngineRecord::BeginMemo& memo = engine_->begin_memo;
  const bool known = tensors_key != 0 && memo.tensors_key == tensors_key;
  if (known) return direct ? memo.plans : plans;
  // Count and names first: nothing below plans, logs or echoes a name this refuses.
  if (absl::Status checked = CheckManifest(manifest, options_.limits); !checked.ok()) return checked;
  // Fail fast on what the manifest already gets wrong; commit re-checks what actually arrives.
  std::vector<std::string> problems;
  size_t count = 0;
  const std::optional<spec::MegatronSource>& source = engine_->planner->spec().source;
  const bool keep_plans = direct || tensors_key != 0;
  for (const TensorDesc& entry : manifest.tensors) {
    // A Megatron-core name (spec `source`) stands for the checkpoint tensors it holds parts of.
    std::vector<TensorDesc> tensors{entry};
    if (source) {
      absl::StatusOr<std::vector<TensorDesc>> mapped = MapMegatronManifest(*source, entry);
      if (!mapped.ok()) {
        if (++count <= 64) problems.push_back(std::string(mapped.status().message()));
        continue;
      }
      tensors = std::move(*mapped);
    }
    for (const TensorDesc& t : tensors) {
      // The planner's memoized plan, not a copy of it (a Llama-8B manifest: 291 plans).
      absl::StatusOr<std::shared_ptr<const TensorPlan>> plan = engine_->planner->SharedPlan(t.name, t.dtype, t.shape);
      if (plan.ok()) {
        if (keep_plans) plans.push_back(std::move(*plan));
        continue;
      }
      if (++count <= 64) problems.push_back(std::string(plan.status().message()));
    }
  }
  if (count != 0) {
    return absl::FailedPreconditionError(absl::StrCat("manifest refused (", count, " problem", count == 1 ? "" : "s",
                                                   "): ", absl::StrJoin(problems, "; ")));
  }
  if (tensors_key != 0) memo = {tensors_key, plans};
  if (!direct) plans.clear();
  return plans;
}

std::shared_ptr<const Placement> Node::PlaceDirect(std::vector<std::shared_ptr<const TensorPlan>> plans) {
  EngineRecord::PlacementMemo& memo = engine_->placement_memo;
  if (memo.placement != nullptr && memo.generation != engine_->generation && memo.plans == plans) {
    // The engine slept and woke since (the same parameters, Wake checked them; new mappings):
    // the same places at its new mappings.
    memo.placement = RebasePlacement(*memo.placement, *engine_->storage);
    memo.generation = engine_->generation;
  }
  if (memo.placement == nullptr || memo.generation != engine_->generation || memo.plans != plans) {
    memo.placement = PlanPlacement(*engine_->planner, *engine_->storage, plans);
    memo.generation = engine_->generation;
    memo.plans = std::move(plans);
  }
  return memo.placement->empty() ? nullptr : memo.placement;
}

Session::Options Node::SessionOptions(const Manifest& manifest, uint64_t id, uint32_t deadline_ms,
                                      const SessionLimits& limits) {
  Session::Options so;
  so.id = id;
  so.partial = manifest.partial;
  // The session's blocking waits (buckets, receives) run on the real clock; the node ends the
  // session at its deadline by its own clock (Poll).
  so.deadline = absl::Now() + absl::Milliseconds(deadline_ms);
  so.limits = limits;
  so.failpoints = options_.failpoints;
  for (const TensorDesc& t : manifest.tensors) {
    if (t.amax && !t.slice.present()) so.supplied_amax.emplace_back(t.name, *t.amax);
  }
  so.on_received = hooks_.on_received;
  so.on_converted = hooks_.on_converted;
  so.threads = &session_threads_;
  return so;
}

bool Node::DirectPossible() const {
  return options_.direct && engine_ && !engine_->asleep &&
         engine_->storage->on_device() == (engine_->pool->kind() == storage::MemoryKind::kDevice) &&
         !engine_->storage->params().empty() && engine_->storage->MappedAddress(0) != nullptr;
}

void Node::NotePlacing(uint64_t manifest_key) {
  if (engine_) placing_ = std::make_pair(manifest_key, engine_->id);
}

void Node::WarmConverter() {
  if (engine_ && engine_->converter) engine_->converter->Warm();
}

std::shared_ptr<DirectPause> Node::StartEarlyPause(uint64_t manifest_key) {
  if (!placing_ || active_ || early_undoing_ > 0 || early_window_ || version_commit_ != nullptr || !DirectPossible() ||
      *placing_ != std::make_pair(manifest_key, engine_->id) ||
      !engine_->control->Responsive()) {
    return nullptr;
  }
  std::shared_ptr<DirectPause> p = NewDirectPause(engine_);
  // refitd's own registration audit first: nothing is paused if stale (the begin's own pause then
  // refuses it). Then the request goes out now, from this thread, to travel while the manifest is
  // decoded and planned here.
  if (!p->pause().Request()) return nullptr;
  early_window_ = true;
  return p;
}

absl::StatusOr<std::shared_ptr<DirectPause>> Node::StartDirectPause(uint64_t session_id,
                                                                    std::shared_ptr<DirectPause> early) {
  absl::Status active = CheckActive(session_id);
  if (!active.ok()) return active;
  if (active_->placement == nullptr || active_->direct_pause != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("session ", session_id, " has no direct pause to take"));
  }
  if (early != nullptr) {
    // Begun for this request, on this engine registration (Begin ran since, on the same thread).
    if (early->pause().engine() != active_->engine ||
        early->pause().from().generation != active_->engine->generation) {
      return absl::InternalError("the early pause is of another engine registration");
    }
    early->set_session_id(session_id);
    return early;
  }
  std::shared_ptr<DirectPause> p = NewDirectPause(active_->engine);
  p->set_session_id(session_id);
  return p;
}

std::shared_ptr<DirectPause> Node::NewDirectPause(std::shared_ptr<EngineRecord> engine) const {
  return std::make_shared<DirectPause>(EnginePause(std::move(engine), options_.pause_timeout, options_.resume_timeout));
}

absl::Status Node::FinishDirectPause(const std::shared_ptr<DirectPause>& direct) {
  DirectPause& p = *direct;
  const EnginePause& pause = p.pause();
  const bool current = active_ && active_->session->id() == p.session_id() && !active_->committing &&
                       pause.engine()->generation == pause.from().generation && !pause.engine()->gone;
  if (!current) {
    // The session ended (or the engine changed) while the engine paused: nothing was written.
    if (!pause.engine()->gone) p.pause().Undo(/*await=*/false);
    if (active_ && active_->session->id() == p.session_id() && !active_->committing) {
      End(Outcome::kAborted, EndCause::kEngineError, "the engine's registration changed while it paused");
    }
    return absl::AbortedError(absl::StrCat("session ", p.session_id(), " ended while its engine paused (staging: direct)",
                                           last_report_.session_id == p.session_id() ? ": " + last_report_.reason : ""));
  }
  if (!p.status().ok()) {
    End(p.refused() ? Outcome::kRefused : Outcome::kFailed, EndCause::kEngineError, std::string(p.status().message()));
    return p.status();
  }
  active_->direct_pause = direct;
  active_->session->UsePlacement(active_->placement);
  return absl::OkStatus();
}

absl::Status Node::CheckActive(uint64_t session_id) const {
  if (active_ && active_->session->id() == session_id) return absl::OkStatus();
  if (active_) {
    return absl::FailedPreconditionError(absl::StrCat("session ", session_id, " is not active (session ",
                                                      active_->session->id(), " is)"));
  }
  if (last_report_.session_id == session_id) {
    return absl::FailedPreconditionError(absl::StrCat("session ", session_id, " is not active (it ended ",
                                                      OutcomeName(last_report_.outcome),
                                                      last_report_.reason.empty() ? "" : ": ", last_report_.reason,
                                                      ")"));
  }
  return absl::FailedPreconditionError(absl::StrCat("session ", session_id, " is not active (no session is)"));
}

absl::StatusOr<uint32_t> Node::Join(uint64_t session_id) {
  absl::Status active = CheckActive(session_id);
  if (!active.ok()) return active;
  if (active_->committing) {
    return absl::FailedPreconditionError(absl::StrCat("session ", session_id, " is committing; too late to join"));
  }
  if (active_->joined >= Session::kMaxRanks) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session ", session_id, " has ", active_->joined, " joined trainer ranks, the most it takes"));
  }
  ++active_->open_members;
  return ++active_->joined;
}

absl::Status Node::Detach(uint64_t session_id) {
  absl::Status active = CheckActive(session_id);
  if (!active.ok()) return active;
  if (active_->open_members == 0) {
    return absl::FailedPreconditionError(absl::StrCat("session ", session_id, " has no joined rank left to detach"));
  }
  --active_->open_members;
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> Node::Announce(uint64_t session_id, BucketHeader header, uint32_t rank) {
  absl::Status active = CheckActive(session_id);
  if (!active.ok()) return active;
  uint32_t seq = 0;
  absl::Status status = active_->session->Announce(std::move(header), &seq, rank);
  if (!status.ok()) {
    if (!active_->committing) {
      End(Outcome::kAborted, status.code() == absl::StatusCode::kFailedPrecondition ? EndCause::kInvalidInput
                                                                                    : CauseOfSessionFailure(status),
          std::string(status.message()));
    }
    return status;
  }
  return seq;
}

void Node::EndByTrainer(uint64_t session_id, EndCause cause, const std::string& reason) {
  // A refit staged for the engine's wake no longer needs its trainer.
  if (!active_ || active_->session->id() != session_id || active_->committing || active_->awaiting_wake) return;
  End(Outcome::kAborted, cause, reason);
}

bool Node::AbortActive(const std::string& reason) {
  if (!active_) return false;
  AbortWith(EndCause::kClientAbort, reason);
  return true;
}

void Node::AbortWith(EndCause cause, const std::string& reason) {
  if (!active_) return;
  if (active_->committing) {
    // The commit's Finish returns at once (still receiving) or the commit runs to its end in
    // the window; either way it ends the session, with this cause if it did not commit.
    active_->session->Abort(reason);
    if (!active_->ended_by) active_->ended_by.emplace(cause, reason);
    return;
  }
  End(Outcome::kAborted, cause, reason);
}

bool Node::Poll(uint64_t session_id) {
  if (!active_ || active_->session->id() != session_id) return false;
  if (active_->committing) return true;  // the commit ends it
  if (active_->awaiting_wake) return false;  // validated and received: the wake commits it
  absl::Status failure = active_->session->failure();
  if (!failure.ok()) {
    End(failure.code() == absl::StatusCode::kResourceExhausted ? Outcome::kFailed : Outcome::kAborted,
        CauseOfSessionFailure(failure), std::string(failure.message()));
    return false;
  }
  if (clock_->Now() >= active_->deadline) {
    End(Outcome::kAborted, EndCause::kDeadlineExceeded, "session deadline passed");
    return false;
  }
  return true;
}

bool Node::Shutdown() {
  ReleaseEnded();
  AbortWith(EndCause::kDisconnected, "daemon shutting down");
  return committing();
}

void Node::End(Outcome outcome, EndCause cause, std::string reason, const PhaseTimes* times,
               uint64_t staged_checksum) {
  if (!active_) return;
  const bool sealed = active_->session->sealed();
  const bool ended_well = outcome == Outcome::kCommitted || outcome == Outcome::kStaged;
  if (!ended_well) active_->session->Abort(reason);
  if (active_->direct_pause != nullptr) {
    // staging: direct, ended before its commit settled the engine (the commit clears this): once
    // nothing of the session runs, the engine either holds a mix of versions (it stays paused and
    // dirty until a full refit lands) or is untouched (resumed at what it holds).
    active_->direct_pause.reset();
    EngineRecord& engine = *active_->engine;
    const bool was_dirty = engine.dirty;
    absl::StrAppend(&reason, SettleDirectSession(*active_->session, *engine.control, !engine.gone && !engine.dirty,
                                                 engine.version, engine.tag, absl::ZeroDuration(), engine.dirty));
    if (engine.dirty != was_dirty && hooks_.on_ranks) hooks_.on_ranks(Ranks());
  }
  RefitReport r = active_->session->Report();
  if (times != nullptr) {
    r.times.validate_ms = times->validate_ms;
    r.times.finish_ms = times->finish_ms;
    r.times.prepare_ms = times->prepare_ms;
    r.times.commit_ms = times->commit_ms;
    r.times.pause_ms = times->pause_ms;
    r.times.verify_ms = times->verify_ms;
  }
  r.times.plan_ms = active_->plan_ms;
  r.times.total_ms = Ms(absl::Now() - active_->begun);
  r.outcome = outcome;
  r.cause = outcome == Outcome::kCommitted ? EndCause::kNone : cause;
  r.reason = std::move(reason);
  r.version = outcome == Outcome::kCommitted ? active_->engine->version : 0;
  r.tag = active_->tag;
  switch (outcome) {
    case Outcome::kCommitted: ++committed_; break;
    case Outcome::kRefused: ++refused_; break;
    case Outcome::kStaged: ++staged_; break;
    default: ++aborted_; break;
  }
  if (outcome == Outcome::kStaged) {
    versions_.Keep(TakeActiveStaging(StagedVersion::State::kHeld, staged_checksum));
  } else if (outcome == Outcome::kCommitted && options_.hold > 0) {
    // The committed version stays staged for rollback (a partial refit's does not: no whole
    // staged version equals what the engine holds then).
    std::shared_ptr<StagedVersion> committed;
    if (!active_->session->partial()) {
      committed = TakeActiveStaging(StagedVersion::State::kCurrent, staged_checksum);
      committed->version = r.version;
    }
    versions_.SessionCommitted(std::move(committed));
  }
  last_report_ = r;
  if (hooks_.on_log) hooks_.on_log(r);
  if (!ended_well && r.cause != EndCause::kClientAbort && !sealed) {
    // Ended by refitd before every bucket was in (deadline, a corrupt bucket, engine gone,
    // shutdown): a trainer of this session may be blocked sending a bucket nobody will receive.
    // Its connection is dropped so the send fails; it reconnects for its next session. A session
    // refused or failed after its buckets were all received (validation, commit) blocks nobody:
    // its trainers keep their connections.
    receiver_.DisconnectPeers();
  }
  if (hooks_.on_report) hooks_.on_report(r);
  // A session's pool that no version kept (aborted, refused, partial) serves the next session.
  versions_.GiveBackPool(std::move(active_->own_pool));
  ReleaseEnded();
  if (outcome == Outcome::kCommitted) ended_ = std::move(active_);
  active_.reset();
  NotifySession();
}

void Node::NotifySession() {
  if (hooks_.on_session) hooks_.on_session(staging_bytes(), active_.has_value());
  if (hooks_.on_versions) {
    const std::array<uint32_t, 3> n = versions_.Counts();
    hooks_.on_versions(n[0], n[1], n[2]);
  }
}

uint64_t Node::NewSessionId() {
  // A random nonzero 32-bit nonce: data-plane tags are (id << 32) | seq and ids are handed out
  // only over the control plane, so a data-plane peer cannot address a live session without it.
  while (true) {
    const uint64_t id = entropy_();
    if (id == 0) continue;
    if (absl::StatusOr<uint64_t> taken = TakeSessionId(id); taken.ok()) return *taken;  // not a recent one
  }
}

absl::StatusOr<uint64_t> Node::TakeSessionId(uint64_t proposed) {
  if (proposed == 0) return NewSessionId();
  // A trainer's choice is as secret as the node's: it goes over the control plane only.
  if (proposed >> 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("session id ", proposed,
                                                   ": a trainer's choice must be below 2^32 (data-plane tags are "
                                                   "(id << 32) | seq)"));
  }
  if (std::find(recent_session_ids_.begin(), recent_session_ids_.end(), proposed) != recent_session_ids_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("session id ", proposed, " was one of this daemon's recent sessions; choose another"));
  }
  recent_session_ids_.push_back(proposed);
  if (recent_session_ids_.size() > kRecentSessionIds) recent_session_ids_.pop_front();
  return proposed;
}

// ---- the commit protocol ----

absl::StatusOr<std::shared_ptr<Commit>> Node::StartCommit(uint64_t session_id) {
  absl::Status active = CheckActive(session_id);
  if (!active.ok()) return active;
  if (active_->committing) return absl::FailedPreconditionError("commit already in progress");
  if (active_->engine->gone) return WithCause(absl::UnavailableError("the engine unregistered"), EndCause::kEngineError);
  if (version_commit_ != nullptr && !active_->stage_only) {
    return WithCause(absl::UnavailableError(absl::StrCat("busy: the kept version '", version_commit_->setup().held->tag,
                                                         "' is being committed; commit again when it is done")),
                     EndCause::kBusy);
  }
  if (!active_->engine->control->Responsive()) {
    return absl::UnavailableError("the engine did not answer a pause or resume in time");
  }
  active_->committing = true;
  return std::make_shared<Commit>(SessionCommitSetup());
}

CommitSetup Node::CommitBase(std::shared_ptr<EngineRecord> engine) const {
  CommitSetup c;
  c.engine = std::move(engine);
  c.failpoints = options_.failpoints;
  c.on_phase = hooks_.on_commit_phase;
  c.pause_timeout = options_.pause_timeout;
  c.resume_timeout = options_.resume_timeout;
  c.resume_on_loop = options_.resume_on_loop;
  c.verify = options_.verify_after_commit;
  return c;
}

CommitSetup Node::SessionCommitSetup() const {
  CommitSetup c = CommitBase(active_->engine);
  c.session_id = active_->session->id();
  c.session = active_->session.get();
  c.to_tag = active_->tag;
  c.stage_only = active_->stage_only;
  c.keep = options_.hold > 0 && !active_->session->partial();
  c.asleep = active_->engine->asleep;
  c.refuse_asleep = options_.refuse_while_asleep;
  c.direct = active_->direct_pause;
  return c;
}

// ---- sleep and wake ----

absl::Status Node::Sleep(uint64_t engine_id) {
  ReleaseEnded();
  if (ranked_) return SleepRank(engine_id);
  if (!engine_ || engine_->id != engine_id || engine_->gone) {
    return absl::FailedPreconditionError("this registration is not the registered engine");
  }
  if (engine_->asleep) return absl::OkStatus();
  REFIT_RETURN_IF_ERROR(MaySleep());
  // Drops every mapping (shm regions unmapped, CUDA IPC handles closed) with the storage.
  const storage::EngineStorage& had = *engine_->storage;
  engine_->storage = std::make_unique<storage::ReleasedEngineStorage>(had.params(), had.on_device(), had.device());
  engine_->asleep = true;
  ++engine_->generation;
  if (hooks_.on_engine) hooks_.on_engine(true);
  if (hooks_.on_ranks) hooks_.on_ranks(Ranks());
  return absl::OkStatus();
}

absl::Status Node::MaySleep() const {
  if (committing()) {
    return WithCause(absl::UnavailableError("busy: a commit is in flight; sleep once it has ended"), EndCause::kBusy);
  }
  if (active_ && active_->placement != nullptr) {
    return absl::UnavailableError(absl::StrCat("busy: session ", active_->session->id(),
                                               " converts into the engine's memory (staging: direct); sleep once it "
                                               "has ended"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Commit>> Node::Wake(uint64_t engine_id, std::unique_ptr<storage::EngineStorage> storage) {
  ReleaseEnded();
  if (ranked_) return WakeRank(engine_id, std::move(storage));
  if (!engine_ || engine_->id != engine_id || engine_->gone) {
    return absl::FailedPreconditionError("this registration is not the registered engine");
  }
  if (!engine_->asleep) return absl::FailedPreconditionError("the engine is not asleep");
  if (committing()) {
    return WithCause(absl::UnavailableError("busy: a commit is in flight; wake once it has ended"), EndCause::kBusy);
  }
  REFIT_RETURN_IF_ERROR(CheckWoken("the engine", *engine_->storage, *storage));
  engine_->storage = std::move(storage);
  engine_->asleep = false;
  ++engine_->generation;
  if (hooks_.on_engine) hooks_.on_engine(true);
  if (hooks_.on_ranks) hooks_.on_ranks(Ranks());
  return WokenCommit();
}

absl::Status Node::CheckWoken(const std::string& who, const storage::EngineStorage& slept,
                              const storage::EngineStorage& woken) {
  const std::vector<storage::ParamInfo>& had = slept.params();
  const std::vector<storage::ParamInfo>& has = woken.params();
  if (had.size() != has.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("wake: ", who, " registered ", has.size(), " parameters; it slept with ", had.size()));
  }
  for (size_t i = 0; i < had.size(); ++i) {
    if (had[i].name != has[i].name || had[i].dtype != has[i].dtype || had[i].shape != has[i].shape ||
        had[i].nbytes != has[i].nbytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "wake: parameter ", i, " is '", PrintableName(has[i].name), "' ", DTypeName(has[i].dtype),
          ShapeString(has[i].shape), "; ", who, " slept with '", had[i].name, "' ", DTypeName(had[i].dtype),
          ShapeString(had[i].shape), " (a wake registers the same parameters, at the same or new addresses)"));
    }
  }
  if (woken.on_device() != slept.on_device() || woken.device() != slept.device()) {
    auto where = [](const storage::EngineStorage& s) {
      return s.on_device() ? absl::StrCat("GPU ", s.device()) : std::string("the host");
    };
    return absl::InvalidArgumentError(
        absl::StrCat("wake: the parameters are on ", where(woken), "; ", who, " slept with them on ", where(slept)));
  }
  return absl::OkStatus();
}

std::shared_ptr<Commit> Node::WokenCommit() {
  if (!engine_ || engine_->asleep || !active_ || !active_->awaiting_wake || active_->engine.get() != engine_.get()) {
    return nullptr;
  }
  active_->awaiting_wake = false;
  active_->committing = true;
  CommitSetup setup = SessionCommitSetup();
  setup.woken = true;
  setup.times = active_->staged_times;
  setup.staged_checksum = active_->staged_checksum;
  return std::make_shared<Commit>(std::move(setup));
}

void Node::ApplyCommitOutcome(const Commit& c) {
  const CommitResult& result = c.result();
  EngineRecord& engine = *c.setup().engine;
  if (result.engine_dirty) engine.dirty = true;
  if (result.engine_version_set) {
    engine.version = c.from().version + 1;
    engine.tag = c.setup().to_tag;
    engine.dirty = false;
  }
  if (result.verify_mismatch) ++verify_mismatches_;
  if (engine.ranks.empty()) {
    if (hooks_.on_ranks) hooks_.on_ranks(Ranks());
    return;
  }
  // Engine ranks: every rank holds what the group holds, except a rank the pause or resume failed
  // on (it left, or did not answer): that rank is dirty, and with it the group.
  std::vector<size_t> failed;
  if (result.outcome != Outcome::kCommitted && engine.group_control != nullptr) {
    failed = engine.group_control->failed_ranks();
  }
  for (size_t r = 0; r < engine.ranks.size(); ++r) {
    RankRecord& rank = *engine.ranks[r];
    rank.version = engine.version;
    rank.tag = engine.tag;
    rank.dirty = engine.dirty;
  }
  for (size_t r : failed) {
    RankRecord& rank = *engine.ranks[r];
    rank.dirty = true;
    engine.dirty = true;
    const size_t tp = static_cast<size_t>(rank.placement.tp_rank);
    if (rank.gone && tp < left_dirty_.size() && ranks_[tp] == nullptr) left_dirty_[tp] = true;
  }
  if (hooks_.on_ranks) hooks_.on_ranks(Ranks());
}

const RefitReport& Node::FinishCommit(Commit& c) {
  if (c.setup().held != nullptr) return FinishVersionCommit(c);
  ApplyCommitOutcome(c);
  if (!active_ || active_->session->id() != c.session_id()) return last_report_;  // cannot happen: committing
  active_->direct_pause.reset();  // the commit settled the engine (resumed, or paused and dirty)
  const CommitSetup& setup = c.setup();
  const CommitResult& result = c.result();
  const bool staged_for_wake = setup.asleep && !setup.stage_only && result.outcome == Outcome::kStaged;
  if (staged_for_wake && !active_->ended_by && !setup.engine->gone) return AwaitWake(result);
  Outcome outcome = result.outcome;
  EndCause cause = result.cause;
  std::string reason = result.reason;
  if (staged_for_wake) {
    // Validated for the wake, but the session was ended meanwhile (operator, shutdown, engine gone).
    outcome = Outcome::kAborted;
    cause = EndCause::kEngineError;
    reason = "the engine unregistered while its refit was staged for the wake";
  }
  if (outcome == Outcome::kAborted && active_->ended_by) {
    // The node ended the session while its commit was still receiving (engine gone, operator,
    // shutdown): that is why it ended.
    cause = active_->ended_by->first;
    reason = active_->ended_by->second;
  }
  End(outcome, cause, std::move(reason), &result.times, result.staged_checksum);
  return last_report_;
}

const RefitReport& Node::AwaitWake(const CommitResult& result) {
  // Validated while the engine sleeps: the session stays, waiting for the wake to commit it.
  active_->committing = false;
  active_->awaiting_wake = true;
  active_->staged_times = result.times;
  active_->staged_checksum = result.staged_checksum;
  RefitReport r = active_->session->Report();
  r.times.validate_ms = result.times.validate_ms;
  r.times.finish_ms = result.times.finish_ms;
  r.times.plan_ms = active_->plan_ms;
  r.times.total_ms = Ms(absl::Now() - active_->begun);
  r.outcome = Outcome::kStaged;
  r.cause = EndCause::kNone;
  r.reason = result.reason;
  r.tag = active_->tag;
  last_report_ = r;
  if (hooks_.on_log) hooks_.on_log(r);
  NotifySession();
  return last_report_;
}

absl::StatusOr<std::vector<Node::ParamChecksum>> Node::Checksums() const {
  if (!engine_) return absl::UnavailableError("no engine is registered");
  if (engine_->asleep) return absl::FailedPreconditionError("the engine is asleep: its parameters are not mapped");
  if (committing()) return absl::UnavailableError("busy: a commit is in progress");
  const auto& params = engine_->storage->params();
  std::vector<ParamChecksum> out;
  out.reserve(params.size());
  std::vector<uint8_t> buf;
  for (size_t i = 0; i < params.size(); ++i) {
    buf.resize(params[i].nbytes);
    absl::Status st = engine_->storage->ReadToHost(i, buf.data());
    if (!st.ok()) return st;
    out.push_back({params[i].name, Checksum64(buf.data(), buf.size()), params[i].nbytes});
  }
  return out;
}

}  // namespace refit
