#include "refit/node.h"

#include <algorithm>
#include <span>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/checksum.h"
#include "common/trace.h"
#include "refit/commit_verify.h"
#include "refit/committer.h"
#include "refit/manifest_check.h"
#include "refit/megatron_source.h"
#include "storage/engine_storage.h"

namespace refit {
namespace {

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

std::string Seconds(absl::Duration d) { return absl::StrCat(absl::ToDoubleSeconds(d), " s"); }

// The refusal for what the engine's own audit (answered with its pause) found stale.
absl::Status EngineStaleError(const std::vector<std::string>& stale) {
  std::vector<std::string> names;
  for (const std::string& n : stale) names.push_back(PrintableName(n));
  return storage::StaleError(names, "the engine reports they are no longer where it registered them");
}

// staging: direct, a session ended before its commit settled the engine (paused since begin).
// Once nothing of the session runs, the engine holds a mix of versions (it stays paused and
// dirty: `dirty` set) or nothing new (resumed at `version`, when `may_resume`, within
// `resume_timeout`; zero: sent, not awaited). Returns what the session's reason adds.
std::string SettleDirectSession(Session& session, EngineControl& control, bool may_resume, uint64_t version,
                                const std::string& tag, absl::Duration resume_timeout, bool& dirty) {
  session.Stop();
  if (session.in_place_bytes() > 0) {
    dirty = true;
    return "; the engine was written in place (staging: direct): it stays paused and dirty until a full refit lands";
  }
  if (!may_resume) return "";
  absl::Status resumed = control.Resume(version, tag, resume_timeout);
  if (resumed.ok() || resume_timeout == absl::ZeroDuration()) return "; nothing was written in place: the engine was resumed";
  return absl::StrCat("; nothing was written in place, but the engine did not resume: ", resumed.message());
}

}  // namespace

Node::Node(NodeOptions options, transport::Receiver& receiver, BucketRing& ring, NodeHooks hooks)
    : options_(std::move(options)),
      system_clock_(options_.clock == nullptr ? NewSystemClock() : nullptr),
      clock_(options_.clock != nullptr ? options_.clock : system_clock_.get()),
      receiver_(receiver),
      ring_(ring),
      hooks_(std::move(hooks)) {
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
  versions_.clear();  // kept versions were converted for this registration's parameters
  spare_pool_.reset();
  engine_.reset();
  if (hooks_.on_engine) hooks_.on_engine(false);
  if (hooks_.on_ranks) hooks_.on_ranks(Ranks());
  return true;
}

absl::Status Node::Ready() const {
  if (!engine_) return absl::UnavailableError(ranked_ ? MissingRanks() : "no engine registered");
  if (engine_->dirty) return absl::UnavailableError("engine weights dirty after a failed commit");
  if (!engine_->control->Responsive()) return absl::UnavailableError("engine did not answer a pause or resume");
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
  // Engine ranks: refused before anything is received or written unless every rank is in.
  if (!engine_) return absl::UnavailableError(ranked_ ? MissingRanks() : "no engine is registered");
  if (active_ && active_->awaiting_wake) {
    return absl::UnavailableError(absl::StrCat("busy: session ", active_->session->id(),
                                               " is staged, waiting for the engine to wake"));
  }
  if (active_) return absl::UnavailableError(absl::StrCat("busy: session ", active_->session->id(), " is active"));
  if (early_undoing_ > 0) {
    return absl::UnavailableError("busy: the engine is being resumed after a refused begin (staging: direct); begin again");
  }
  if (early_window_) return absl::UnavailableError("busy: another begin is being planned");
  if (!engine_->control->Responsive()) {
    return absl::UnavailableError(absl::StrCat("engine ", engine_->id,
                                               " did not answer a pause or resume in time; refits are refused until "
                                               "it answers or registers again"));
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
    return absl::FailedPreconditionError(
        "partial refit refused: the engine's weights are dirty after an interrupted commit; a full refit must land "
        "first");
  }
  if (absl::Status tag = CheckTag(manifest.tag); !tag.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("manifest tag '", PrintableName(manifest.tag), "': ", tag.message()));
  }
  const SessionLimits& limits = options_.limits;
  // staging: direct, for an awake engine whose storage refitd maps in the staging pool's memory:
  // the manifest's plans say where each tensor goes in the engine (PlanPlacement).
  const bool direct = !manifest.stage_only && DirectPossible();
  std::vector<std::shared_ptr<const TensorPlan>> plans;
  // The tensor list this planner accepted last (the same key): its checks passed and its plans
  // are known.
  EngineRecord::BeginMemo& memo = engine_->begin_memo;
  const bool known = tensors_key != 0 && memo.tensors_key == tensors_key;
  if (known && direct) plans = memo.plans;
  // Count and names first: nothing below plans, logs or echoes a name this refuses.
  if (absl::Status checked = known ? absl::OkStatus() : CheckManifest(manifest, limits); !checked.ok()) return checked;
  // Fail fast on what the manifest already gets wrong; commit re-checks what actually arrives.
  std::vector<std::string> problems;
  size_t count = 0;
  const std::optional<spec::MegatronSource>& source = engine_->planner->spec().source;
  const bool keep_plans = direct || tensors_key != 0;
  for (const TensorDesc& entry : known ? std::span<const TensorDesc>() : std::span<const TensorDesc>(manifest.tensors)) {
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
  if (!known && tensors_key != 0) memo = {tensors_key, plans};
  if (!direct) plans.clear();
  if (manifest.stage_only) {
    if (options_.hold == 0) {
      return absl::FailedPreconditionError("stage-only refit refused: this daemon holds no versions (config hold: 0)");
    }
    if (manifest.tag.empty()) return absl::InvalidArgumentError("stage-only refit refused: it needs a tag");
    if (manifest.partial) return absl::InvalidArgumentError("stage-only refit refused: a held version is a full refit");
    for (const auto& v : versions_) {
      if (v->state == StagedVersion::State::kHeld && v->tag == manifest.tag) {
        return absl::AlreadyExistsError(absl::StrCat("stage-only refit refused: a version tagged '", manifest.tag,
                                                     "' is already held"));
      }
    }
    std::vector<std::string> held;
    for (const auto& v : versions_) {
      if (v->state == StagedVersion::State::kHeld) held.push_back(v->tag);
    }
    if (held.size() >= options_.hold) {
      return absl::ResourceExhaustedError(absl::StrCat("stage-only refit refused: ", held.size(), " of hold: ",
                                                       options_.hold, " versions are held (",
                                                       absl::StrJoin(held, ", "), "); commit one first"));
    }
  }
  SessionLimits session_limits = limits;
  if (options_.hold > 0) {
    // Room for one more version of this engine: retained committed versions give way (the
    // previous, then the current one); held versions never do.
    const uint64_t need = engine_->bytes;
    for (StagedVersion::State state : {StagedVersion::State::kPrevious, StagedVersion::State::kCurrent}) {
      if (limits.staging_bytes - std::min(limits.staging_bytes, versions_bytes()) >= need) break;
      if (std::shared_ptr<StagedVersion> v = Find(state)) Drop(v);
    }
    const uint64_t free = limits.staging_bytes - std::min(limits.staging_bytes, versions_bytes());
    if (free < need) {
      std::vector<std::string> held;
      for (const auto& v : versions_) held.push_back(absl::StrCat(v->tag.empty() ? "(untagged)" : v->tag, " ",
                                                                 v->bytes, " bytes"));
      return absl::ResourceExhaustedError(absl::StrCat(
          "staging cannot hold another version: limits.staging_bytes is ", limits.staging_bytes, ", ",
          versions_bytes(), " bytes are held by ", versions_.size(), " version", versions_.size() == 1 ? "" : "s",
          " (", absl::StrJoin(held, ", "), "), and a refit of this engine needs about ", need,
          " bytes; commit a held version or raise the limit"));
    }
    session_limits.staging_bytes = free;
  }
  const uint32_t deadline_ms =
      manifest.deadline_ms != 0 ? std::min(manifest.deadline_ms, limits.deadline_ms) : limits.deadline_ms;
  Session::Options so;
  absl::StatusOr<uint64_t> id = TakeSessionId(session_id);
  if (!id.ok()) return id.status();
  so.id = *id;
  so.partial = manifest.partial;
  // The session's blocking waits (buckets, receives) run on the real clock; the node ends the
  // session at its deadline by its own clock (Poll).
  so.deadline = absl::Now() + absl::Milliseconds(deadline_ms);
  so.limits = session_limits;
  so.failpoints = options_.failpoints;
  for (const TensorDesc& t : manifest.tensors) {
    if (t.amax && !t.slice.present()) so.supplied_amax.emplace_back(t.name, *t.amax);
  }
  so.on_received = hooks_.on_received;
  so.on_converted = hooks_.on_converted;
  absl::StatusOr<std::shared_ptr<const WireTable>> wire = WireTable::Create(*engine_->planner, manifest);
  if (!wire.ok()) return wire.status();
  so.wire = *wire;
  Active a;
  if (direct) {
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
    if (!memo.placement->empty()) a.placement = memo.placement;
  }
  // Converts nothing before the engine paused (its begin may be answered early: the trainer's
  // announces then arrive while it pauses).
  so.await_placement = a.placement != nullptr;
  so.threads = &session_threads_;
  a.wire = *wire;
  a.engine = engine_;
  a.stage_only = manifest.stage_only;
  if (options_.hold > 0) a.own_pool = spare_pool_ != nullptr ? std::move(spare_pool_) : engine_->new_pool();
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

bool Node::DirectPossible() const {
  return options_.direct && engine_ && !engine_->asleep && engine_->ranks.empty() &&
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
  // refitd's own registration audit first, as RunDirectPause does: nothing is paused if stale
  // (the begin's own pause then refuses it). Then the request goes out now, from this thread,
  // to travel while the manifest is decoded and planned here.
  if (!engine_->storage->Audit().ok()) return nullptr;
  engine_->control->StartPause(p->pause_timeout_);
  p->pause_sent_ = true;
  early_window_ = true;
  return p;
}

void Node::WhenEarlyPauseAnswered(DirectPause& p, std::function<void()> then) {
  p.engine_->control->WhenPauseAnswered(std::move(then));
}

bool Node::TakeAnsweredEarlyPause(DirectPause& p) {
  if (!p.pause_sent_ || !p.engine_->control->TakeAnsweredPause()) return false;
  p.paused_at_ = absl::Now();
  return true;
}

void Node::RunUndoEarlyPause(DirectPause& p) {
  // A pause that failed or was refused settled the engine already (RunDirectPause); a dirty engine
  // stays paused, as it was.
  if (p.status_.ok() && !p.dirty_at_start_) (void)p.engine_->control->Resume(p.from_version_, p.from_tag_, p.resume_timeout_);
}

absl::StatusOr<std::shared_ptr<DirectPause>> Node::StartDirectPause(uint64_t session_id,
                                                                    std::shared_ptr<DirectPause> early) {
  absl::Status active = CheckActive(session_id);
  if (!active.ok()) return active;
  if (active_->placement == nullptr || active_->direct_paused) {
    return absl::FailedPreconditionError(absl::StrCat("session ", session_id, " has no direct pause to take"));
  }
  if (early != nullptr) {
    // Begun for this request, on this engine registration (Begin ran since, on the same thread).
    if (early->engine_ != active_->engine || early->generation_ != active_->engine->generation) {
      return absl::InternalError("the early pause is of another engine registration");
    }
    early->session_id_ = session_id;
    return early;
  }
  std::shared_ptr<DirectPause> p = NewDirectPause(active_->engine);
  p->session_id_ = session_id;
  return p;
}

std::shared_ptr<DirectPause> Node::NewDirectPause(std::shared_ptr<EngineRecord> engine) const {
  auto p = std::make_shared<DirectPause>();
  p->pause_timeout_ = options_.pause_timeout;
  p->resume_timeout_ = options_.resume_timeout;
  p->from_version_ = engine->version;
  p->from_tag_ = engine->tag;
  p->dirty_at_start_ = engine->dirty;
  p->generation_ = engine->generation;
  p->engine_ = std::move(engine);
  return p;
}

void Node::RunDirectPause(DirectPause& p) {
  EngineRecord& engine = *p.engine_;
  // refitd's own mappings first (the registration audit's part 1): nothing is paused if stale. An
  // early pause was audited before its request went out (StartEarlyPause).
  absl::Status audited = p.pause_sent_ ? absl::OkStatus() : engine.storage->Audit();
  if (!audited.ok()) {
    p.refused_ = true;
    p.status_ = absl::FailedPreconditionError(absl::StrCat("refit refused: ", audited.message(), "; the engine is untouched"));
    return;
  }
  absl::Status paused = engine.control->Pause(p.pause_timeout_);
  if (!paused.ok()) {
    if (paused.code() == absl::StatusCode::kDeadlineExceeded && !p.dirty_at_start_) {
      // It may pause later: the resume queued behind the pause lets it serve what it has.
      (void)engine.control->Resume(p.from_version_, p.from_tag_, absl::ZeroDuration());
    }
    p.status_ = absl::UnavailableError(absl::StrCat("staging: direct: the engine did not pause: ", paused.message(),
                                                    "; its weights are untouched"));
    return;
  }
  p.paused_at_ = absl::Now();
  // The registration audit, part 2: the engine's, answered with its pause.
  if (std::vector<std::string> stale = engine.control->PausedStale(); !stale.empty()) {
    absl::Status refusal = EngineStaleError(stale);
    if (!p.dirty_at_start_) (void)engine.control->Resume(p.from_version_, p.from_tag_, p.resume_timeout_);
    p.refused_ = true;
    p.status_ = absl::FailedPreconditionError(absl::StrCat("refit refused: ", refusal.message(), "; nothing was written"));
  }
}

absl::Status Node::FinishDirectPause(DirectPause& p) {
  const bool current = active_ && active_->session->id() == p.session_id_ && !active_->committing &&
                       p.engine_->generation == p.generation_ && !p.engine_->gone;
  if (!current) {
    // The session ended (or the engine changed) while the engine paused: nothing was written.
    if (p.status_.ok() && !p.dirty_at_start_ && !p.engine_->gone) {
      (void)p.engine_->control->Resume(p.from_version_, p.from_tag_, absl::ZeroDuration());
    }
    if (active_ && active_->session->id() == p.session_id_ && !active_->committing) {
      End(Outcome::kAborted, EndCause::kEngineError, "the engine's registration changed while it paused");
    }
    return absl::AbortedError(absl::StrCat("session ", p.session_id_, " ended while its engine paused (staging: direct)",
                                           last_report_.session_id == p.session_id_ ? ": " + last_report_.reason : ""));
  }
  if (!p.status_.ok()) {
    End(p.refused_ ? Outcome::kRefused : Outcome::kFailed, EndCause::kEngineError, std::string(p.status_.message()));
    return p.status_;
  }
  active_->direct_paused = true;
  active_->direct_since = p.paused_at_;
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
  if (active_->direct_paused) {
    // staging: direct, ended before its commit settled the engine (the commit clears this): once
    // nothing of the session runs, the engine either holds a mix of versions (it stays paused and
    // dirty until a full refit lands) or is untouched (resumed at what it holds).
    active_->direct_paused = false;
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
    KeepActive(StagedVersion::State::kHeld, staged_checksum);
  } else if (outcome == Outcome::kCommitted && options_.hold > 0) {
    // The committed version stays staged for rollback: current becomes previous. After a partial
    // refit the engine holds current + the partial: no whole staged version equals it, but the
    // old current is still a whole earlier state to roll back to.
    if (std::shared_ptr<StagedVersion> old = Find(StagedVersion::State::kPrevious)) Drop(old);
    if (std::shared_ptr<StagedVersion> cur = Find(StagedVersion::State::kCurrent)) {
      cur->state = StagedVersion::State::kPrevious;
    }
    if (!active_->session->partial()) {
      KeepActive(StagedVersion::State::kCurrent, staged_checksum);
      versions_.back()->version = r.version;
    }
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
  if (active_->own_pool != nullptr && spare_pool_ == nullptr) spare_pool_ = std::move(active_->own_pool);
  ReleaseEnded();
  if (outcome == Outcome::kCommitted) ended_ = std::move(active_);
  active_.reset();
  NotifySession();
}

void Node::NotifySession() {
  if (hooks_.on_session) hooks_.on_session(staging_bytes(), active_.has_value());
  if (hooks_.on_versions) {
    uint32_t n[3] = {0, 0, 0};
    for (const auto& v : versions_) ++n[static_cast<int>(v->state)];
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
  if (active_->engine->gone) return absl::UnavailableError("the engine unregistered");
  if (version_commit_ != nullptr && !active_->stage_only) {
    return absl::UnavailableError(absl::StrCat("busy: the kept version '", version_commit_->held_->tag,
                                               "' is being committed; commit again when it is done"));
  }
  if (!active_->engine->control->Responsive()) {
    return absl::UnavailableError("the engine did not answer a pause or resume in time");
  }
  active_->committing = true;
  return NewSessionCommit();
}

std::shared_ptr<Commit> Node::NewSessionCommit() {
  auto commit = std::make_shared<Commit>();
  commit->session_id_ = active_->session->id();
  commit->session_ = active_->session.get();
  commit->engine_ = active_->engine;
  commit->failpoints_ = options_.failpoints;
  commit->hooks_ = &hooks_;
  commit->pause_timeout_ = options_.pause_timeout;
  commit->resume_timeout_ = options_.resume_timeout;
  commit->resume_on_loop_ = options_.resume_on_loop;
  commit->from_version_ = active_->engine->version;
  commit->from_tag_ = active_->engine->tag;
  commit->to_tag_ = active_->tag;
  commit->dirty_at_start_ = active_->engine->dirty;
  commit->verify_ = options_.verify_after_commit;
  commit->stage_only_ = active_->stage_only;
  commit->keep_ = options_.hold > 0 && !active_->session->partial();
  commit->generation_ = active_->engine->generation;
  commit->asleep_ = active_->engine->asleep;
  commit->refuse_asleep_ = options_.refuse_while_asleep;
  commit->direct_ = active_->direct_paused;
  commit->direct_since_ = active_->direct_since;
  return commit;
}

// ---- sleep and wake ----

absl::Status Node::Sleep(uint64_t engine_id) {
  ReleaseEnded();
  if (ranked_) {
    return absl::UnimplementedError("sleep: an engine of several ranks cannot sleep yet (each rank's weights stay mapped)");
  }
  if (!engine_ || engine_->id != engine_id || engine_->gone) {
    return absl::FailedPreconditionError("this registration is not the registered engine");
  }
  if (engine_->asleep) return absl::OkStatus();
  if (committing()) return absl::UnavailableError("busy: a commit is in flight; sleep once it has ended");
  if (active_ && active_->placement != nullptr) {
    return absl::UnavailableError(absl::StrCat("busy: session ", active_->session->id(),
                                               " converts into the engine's memory (staging: direct); sleep once it "
                                               "has ended"));
  }
  // Drops every mapping (shm regions unmapped, CUDA IPC handles closed) with the storage.
  const bool on_device = engine_->storage->on_device();
  const int device = engine_->storage->device();
  std::vector<storage::ParamInfo> params = engine_->storage->params();
  engine_->storage = std::make_unique<storage::ReleasedEngineStorage>(std::move(params), on_device, device);
  engine_->asleep = true;
  ++engine_->generation;
  if (hooks_.on_engine) hooks_.on_engine(true);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Commit>> Node::Wake(uint64_t engine_id, std::unique_ptr<storage::EngineStorage> storage) {
  ReleaseEnded();
  if (ranked_) {
    return absl::UnimplementedError("wake: an engine of several ranks cannot sleep yet (each rank's weights stay mapped)");
  }
  if (!engine_ || engine_->id != engine_id || engine_->gone) {
    return absl::FailedPreconditionError("this registration is not the registered engine");
  }
  if (!engine_->asleep) return absl::FailedPreconditionError("the engine is not asleep");
  if (committing()) return absl::UnavailableError("busy: a commit is in flight; wake once it has ended");
  const std::vector<storage::ParamInfo>& had = engine_->storage->params();
  const std::vector<storage::ParamInfo>& has = storage->params();
  if (had.size() != has.size()) {
    return absl::InvalidArgumentError(absl::StrCat("wake: the engine registered ", has.size(),
                                                   " parameters; it slept with ", had.size()));
  }
  for (size_t i = 0; i < had.size(); ++i) {
    if (had[i].name != has[i].name || had[i].dtype != has[i].dtype || had[i].shape != has[i].shape ||
        had[i].nbytes != has[i].nbytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "wake: parameter ", i, " is '", PrintableName(has[i].name), "' ", DTypeName(has[i].dtype),
          ShapeString(has[i].shape), "; the engine slept with '", had[i].name, "' ", DTypeName(had[i].dtype),
          ShapeString(had[i].shape), " (a wake registers the same parameters, at the same or new addresses)"));
    }
  }
  if (storage->on_device() != engine_->storage->on_device() || storage->device() != engine_->storage->device()) {
    return absl::InvalidArgumentError(absl::StrCat("wake: the parameters are on ",
                                                   storage->on_device() ? "GPU " : "the host", storage->on_device()
                                                       ? std::to_string(storage->device()) : std::string(),
                                                   "; the engine slept with them on ",
                                                   engine_->storage->on_device() ? "GPU " : "the host",
                                                   engine_->storage->on_device()
                                                       ? std::to_string(engine_->storage->device()) : std::string()));
  }
  engine_->storage = std::move(storage);
  engine_->asleep = false;
  ++engine_->generation;
  if (hooks_.on_engine) hooks_.on_engine(true);
  if (!active_ || !active_->awaiting_wake || active_->engine.get() != engine_.get()) return nullptr;
  active_->awaiting_wake = false;
  active_->committing = true;
  std::shared_ptr<Commit> commit = NewSessionCommit();
  commit->woken_ = true;
  commit->times_ = active_->staged_times;
  commit->staged_checksum_ = active_->staged_checksum;
  return commit;
}

void Node::RunCommit(Commit& c) {
  EngineRecord& engine = *c.engine_;
  auto phase = [&c](const char* name) {
    if (c.hooks_->on_commit_phase) c.hooks_->on_commit_phase(c.session_id_, name);
  };
  auto end = [&c](Outcome outcome, EndCause cause, std::string reason) {
    if (c.direct_ && outcome != Outcome::kCommitted && !c.engine_dirty_ && !c.engine_version_set_) {
      // staging: direct: the engine is paused since the session began.
      absl::StrAppend(&reason, SettleDirectSession(*c.session_, *c.engine_->control, !c.dirty_at_start_, c.from_version_,
                                                   c.from_tag_, c.resume_timeout_, c.engine_dirty_));
      c.times_.pause_ms = Ms(absl::Now() - c.direct_since_);
    }
    c.outcome_ = outcome;
    c.cause_ = cause;
    c.reason_ = std::move(reason);
  };

  absl::Time t0 = absl::Now();
  const Staging* staging = nullptr;
  std::vector<size_t> produced;
  std::optional<PreparedCommit> early_prepared;  // the live session's, prepared before its last conversions ended
  if (c.held_ == nullptr && c.woken_) {
    // Staged while the engine slept: received, converted and validated then.
    staging = &c.session_->staging();
    produced = c.session_->ledger().Produced();
  } else if (c.held_ == nullptr) {
    Session& s = *c.session_;
    // Complete before commit: validated once every tensor has arrived, while the last bucket's
    // conversions may still run on the GPU; again after them only if the ledger changed since
    // (a conversion failed).
    std::optional<absl::Status> valid;
    uint64_t validated_changes = 0;
    if (s.WaitIssued().ok()) {
      const absl::Time v0 = absl::Now();
      validated_changes = s.ledger().changes();
      valid = s.Validate();
      c.times_.validate_ms = Ms(absl::Now() - v0);
      TracePoint("daemon.validated");
      if (valid->ok() && !c.stage_only_ && !c.asleep_) {
        // A commit that builds nothing is prepared now, while the last conversions run; used
        // below unless the ledger changes meanwhile (a conversion failed).
        const absl::Time p0 = absl::Now();
        PrepareOptions early;
        early.pieces_in_place = !c.verify_;
        early.only_placement = true;
        absl::StatusOr<PreparedCommit> prepared =
            PrepareCommit(*engine.planner, s.staging(), s.ledger().Produced(), nullptr, early);
        if (prepared.ok() && PrepareStorageWrites(*prepared, *engine.storage).ok()) {
          early_prepared = std::move(*prepared);
          TracePoint("daemon.prepared_early");
        }
        c.times_.prepare_ms = Ms(absl::Now() - p0);
      }
    }
    // Every announced bucket received and converted.
    absl::Status finished = s.Finish();
    TracePoint("daemon.drained");
    c.times_.finish_ms = Ms(absl::Now() - t0) - c.times_.validate_ms - c.times_.prepare_ms;  // the early prepare's
    if (!finished.ok()) {
      return end(finished.code() == absl::StatusCode::kResourceExhausted ? Outcome::kFailed : Outcome::kAborted,
                 CauseOfSessionFailure(finished), std::string(finished.message()));
    }
    t0 = absl::Now();
    if (!valid || s.ledger().changes() != validated_changes) {
      early_prepared.reset();
      valid = s.Validate();
      c.times_.validate_ms += Ms(absl::Now() - t0);
      TracePoint("daemon.validated_again");
    }
    if (valid->ok() && c.dirty_at_start_ && s.partial()) {
      valid = absl::FailedPreconditionError(
          "refit refused: the engine's weights are dirty after a failed commit; a full refit must land first");
    }
    if (!valid->ok()) return end(Outcome::kRefused, EndCause::kIncomplete, std::string(valid->message()));
    staging = &s.staging();
    produced = s.ledger().Produced();
    if (c.keep_) {
      // hold > 0: the version's checksum, for `refitctl versions` (before any pause).
      absl::StatusOr<uint64_t> sum = StagingChecksum(*staging);
      if (!sum.ok()) {
        return end(Outcome::kFailed, EndCause::kInternal,
                   absl::StrCat("checksumming the staged version failed: ", sum.status().message()));
      }
      c.staged_checksum_ = *sum;
    }
    if (c.stage_only_) return end(Outcome::kStaged, EndCause::kNone, "");
    if (c.asleep_) {
      if (c.refuse_asleep_) {
        return end(Outcome::kRefused, EndCause::kEngineError,
                   "refit refused: the engine is asleep and this daemon refuses refits while it sleeps "
                   "(engine.asleep_refits: refuse); the engine is untouched");
      }
      return end(Outcome::kStaged, EndCause::kNone, std::string(kStagedForWake));
    }
  } else {
    // A kept version: received, converted and validated when it was staged.
    staging = c.held_->staging.get();
    produced = c.held_->produced;
  }

  // Every engine parameter built (assembly, layout steps, derived state) before the pause.
  t0 = absl::Now();
  // The live session's commit builds layout steps and derived parameters on the converter's GPU
  // (its converter thread is idle now); a kept version's, which another session's conversion may
  // overlap, builds them on the host.
  DeviceOps* device_ops = c.held_ == nullptr && engine.converter ? engine.converter->device_ops() : nullptr;
  // Pieces of fused and stacked parameters go from staging to their place in the engine's
  // parameter in the window (no assembly copy first), unless verify_after_commit checksums whole
  // parameters.
  PrepareOptions prepare_options;
  prepare_options.pieces_in_place = !c.verify_;
  absl::StatusOr<PreparedCommit> prepared = absl::UnknownError("not prepared");
  if (early_prepared) {
    prepared = std::move(*early_prepared);
  } else {
    prepared = PrepareCommit(*engine.planner, *staging, produced, device_ops, prepare_options);
    if (prepared.ok()) {
      absl::Status st = PrepareStorageWrites(*prepared, *engine.storage);
      if (!st.ok()) prepared = st;
    }
  }
  c.times_.prepare_ms += Ms(absl::Now() - t0);
  TracePoint("daemon.prepared");
  if (prepared.ok()) {
    absl::Status hit = REFIT_FAILPOINT(c.failpoints_, failpoints::kBeforeCommit);
    if (!hit.ok()) prepared = hit;
  }
  if (!prepared.ok()) {
    const bool exhausted = prepared.status().code() == absl::StatusCode::kResourceExhausted;
    return end(exhausted ? Outcome::kFailed : Outcome::kRefused,
               exhausted ? EndCause::kOverloaded : EndCause::kInvalidInput,
               absl::StrCat("refit refused: ", prepared.status().message()));
  }

  // The registration audit, part 1, before the pause: refitd's own mappings (generation, the shm
  // object or CUDA allocation behind each). Part 2 is the engine's, answered with its pause.
  absl::Status audited = AuditRegistration(c);
  TracePoint("daemon.audited");
  if (!audited.ok()) {
    return end(Outcome::kRefused, EndCause::kEngineError,
               absl::StrCat("refit refused: ", audited.message(), c.direct_ ? "" : "; the engine is untouched"));
  }

  // verify_after_commit: the checksum of every write's staged bytes, before the pause.
  std::vector<uint64_t> expected;
  if (c.verify_) {
    t0 = absl::Now();
    absl::StatusOr<std::vector<uint64_t>> sums = StagedChecksums(*engine.planner, *prepared, staging->pool().memory());
    c.times_.verify_ms = Ms(absl::Now() - t0);
    if (!sums.ok()) {
      return end(Outcome::kFailed, EndCause::kInternal,
                 absl::StrCat("verify_after_commit: checksumming the staged bytes failed: ", sums.status().message(),
                              c.direct_ ? "" : "; the engine is untouched"));
    }
    expected = std::move(*sums);
  }

  // The window: pause, copy in place, (verify,) resume. staging: direct paused the engine when
  // the session began (and audited it then): its window is the whole session.
  phase("pausing");
  const absl::Time pause_start = c.direct_ ? c.direct_since_ : absl::Now();
  absl::Status paused = c.direct_ ? absl::OkStatus() : engine.control->Pause(c.pause_timeout_);
  if (!paused.ok()) {
    c.times_.pause_ms = Ms(absl::Now() - pause_start);
    if (paused.code() == absl::StatusCode::kDeadlineExceeded) {
      if (c.dirty_at_start_) {
        // A dirty engine is paused already (an earlier commit was interrupted): it must go on
        // waiting for a full refit, so no resume is queued behind the late pause.
        return end(Outcome::kFailed, EndCause::kEngineError,
                   absl::StrCat("engine did not pause within ", Seconds(c.pause_timeout_),
                                "; it stays paused and dirty until a full refit lands, and refits are refused "
                                "until it answers or registers again"));
      }
      // The engine may still pause later: the resume queued behind the pause (calls reach the
      // engine in order) lets it serve the version it has, which nothing touched.
      // Sent, not awaited: the engine stays unresponsive until it answers.
      absl::Status resumed = engine.control->Resume(c.from_version_, c.from_tag_, absl::ZeroDuration());
      (void)resumed;
      return end(Outcome::kFailed, EndCause::kEngineError,
                 absl::StrCat("engine did not pause within ", Seconds(c.pause_timeout_),
                              "; its weights are untouched (version ", c.from_version_,
                              "), and refits are refused until it answers or registers again"));
    }
    return end(Outcome::kFailed, EndCause::kEngineError,
               absl::StrCat("engine did not pause: ", paused.message(), "; its weights are untouched"));
  }
  // The registration audit, part 2: what the engine found stale once paused. Nothing is written;
  // the engine is resumed at the version it holds.
  if (std::vector<std::string> stale = c.direct_ ? std::vector<std::string>{} : engine.control->PausedStale();
      !stale.empty()) {
    absl::Status refusal = EngineStaleError(stale);
    absl::Status resumed = engine.control->Resume(c.from_version_, c.from_tag_, c.resume_timeout_);
    c.times_.pause_ms = Ms(absl::Now() - pause_start);
    if (!resumed.ok()) {
      return end(Outcome::kFailed, EndCause::kEngineError,
                 absl::StrCat("refit refused: ", refusal.message(), "; nothing was written, but the engine did not "
                              "resume: ", resumed.message()));
    }
    return end(Outcome::kRefused, EndCause::kEngineError,
               absl::StrCat("refit refused: ", refusal.message(), "; nothing was written (the engine was resumed at "
                            "version ", c.from_version_, ")"));
  }
  phase("copying");
  TracePoint("daemon.copying");
  t0 = absl::Now();
  absl::Status hit = REFIT_FAILPOINT(c.failpoints_, failpoints::kMidCommit);
  absl::StatusOr<CommitStats> copied =
      hit.ok() ? WritePrepared(*engine.planner, *prepared, *engine.storage) : absl::StatusOr<CommitStats>(hit);
  if (copied.ok()) {
    // Copied but not resumed: an error here is treated like a failed copy.
    hit = REFIT_FAILPOINT(c.failpoints_, failpoints::kAfterCopy);
    if (!hit.ok()) copied = hit;
  }
  c.times_.commit_ms = Ms(absl::Now() - t0);
  TracePoint("daemon.copied");
  if (!copied.ok()) {
    c.times_.pause_ms = Ms(absl::Now() - pause_start);
    c.engine_dirty_ = true;  // a partial copy: the engine must not serve until a full refit lands
    return end(Outcome::kFailed, EndCause::kEngineError,
               absl::StrCat("commit failed, engine left paused and dirty: ", copied.status().message()));
  }
  if (!REFIT_FAILPOINT(c.failpoints_, failpoints::kCorruptCopy).ok()) {
    // Test builds: one byte of the copy goes wrong, as a faulty copy path would make it.
    absl::Status corrupted = CorruptOneByte(*prepared, *engine.storage);
    (void)corrupted;
  }
  if (c.verify_) {
    // Inside the window: an engine whose bytes differ from the staged ones never serves them.
    t0 = absl::Now();
    absl::StatusOr<std::vector<std::string>> mismatched = VerifyWrites(*engine.planner, *prepared, expected,
                                                                       *engine.storage);
    c.times_.verify_ms += Ms(absl::Now() - t0);
    if (!mismatched.ok() || !mismatched->empty()) {
      c.times_.pause_ms = Ms(absl::Now() - pause_start);
      c.engine_dirty_ = true;
      if (!mismatched.ok()) {
        return end(Outcome::kFailed, EndCause::kInternal,
                   absl::StrCat("verify_after_commit: reading the engine's checksums failed: ",
                                mismatched.status().message(), "; engine left paused and dirty"));
      }
      c.verify_mismatch_ = true;
      const size_t n = mismatched->size();
      if (n > 16) mismatched->resize(16);
      return end(Outcome::kFailed, EndCause::kVerifyMismatch,
                 absl::StrCat("verify_after_commit: ", n, " engine parameter", n == 1 ? "" : "s",
                              " differ from the staged bytes after the copy (", absl::StrJoin(*mismatched, ", "),
                              n > 16 ? ", ..." : "", "); engine left paused and dirty, a full refit must land"));
    }
  }
  c.engine_version_set_ = true;  // the engine's memory holds from_version_ + 1 from here on
  phase("resuming");
  c.pause_start_ = pause_start;
  if (c.resume_on_loop_) {
    c.resume_pending_ = true;  // StartLoopResume or RunResume
    return;
  }
  RunResume(c);
}

void Node::RunResume(Commit& c) {
  TracePoint("daemon.resume_sent");
  absl::Status resumed = c.engine_->control->Resume(c.from_version_ + 1, c.to_tag_, c.resume_timeout_);
  FinishResume(c, resumed);
}

bool Node::StartLoopResume(const std::shared_ptr<Commit>& commit, std::function<void()> done) {
  Commit& c = *commit;
  const bool sent = c.engine_->control->StartResume(c.from_version_ + 1, c.to_tag_, c.resume_timeout_,
                                                    [commit, done = std::move(done)](absl::Status resumed) {
                                                      FinishResume(*commit, resumed);
                                                      done();
                                                    });
  if (sent) TracePoint("daemon.resume_sent");  // else RunResume sends it (and traces it)
  return sent;
}

void Node::FinishResume(Commit& c, const absl::Status& resumed) {
  c.resume_pending_ = false;
  const uint64_t to_version = c.from_version_ + 1;
  TracePoint("daemon.resumed");
  c.times_.pause_ms = Ms(absl::Now() - c.pause_start_);
  auto end = [&c](Outcome outcome, EndCause cause, std::string reason) {
    c.outcome_ = outcome;
    c.cause_ = cause;
    c.reason_ = std::move(reason);
  };
  if (!resumed.ok()) {
    if (resumed.code() == absl::StatusCode::kDeadlineExceeded) {
      return end(Outcome::kFailed, EndCause::kEngineError,
                 absl::StrCat("engine did not answer resume(", to_version, ") within ", Seconds(c.resume_timeout_),
                              "; its memory holds version ", to_version,
                              " whole, and refits are refused until it answers or registers again"));
    }
    return end(Outcome::kFailed, EndCause::kEngineError,
               absl::StrCat("engine did not resume: ", resumed.message(), "; its memory holds version ", to_version,
                            " whole"));
  }
  end(Outcome::kCommitted, EndCause::kNone, "");
}

absl::Status Node::AuditRegistration(const Commit& c) {
  const EngineRecord& engine = *c.engine_;
  if (engine.generation != c.generation_ || engine.asleep) {
    // Sleep and wake are refused while a commit runs; this guards the invariant.
    return absl::FailedPreconditionError(absl::StrCat("stale registration: the engine's storage changed (generation ",
                                                      c.generation_, " -> ", engine.generation,
                                                      engine.asleep ? ", asleep" : "", ") since the commit started"));
  }
  return engine.storage->Audit();
}

void Node::ApplyCommitOutcome(Commit& c) {
  EngineRecord& engine = *c.engine_;
  if (c.engine_dirty_) engine.dirty = true;
  if (c.engine_version_set_) {
    engine.version = c.from_version_ + 1;
    engine.tag = c.to_tag_;
    engine.dirty = false;
  }
  if (c.verify_mismatch_) ++verify_mismatches_;
  if (engine.ranks.empty()) {
    if (hooks_.on_ranks) hooks_.on_ranks(Ranks());
    return;
  }
  // Engine ranks: every rank holds what the group holds, except a rank the pause or resume failed
  // on (it left, or did not answer): that rank is dirty, and with it the group.
  std::vector<size_t> failed;
  if (c.outcome_ != Outcome::kCommitted && engine.group_control != nullptr) failed = engine.group_control->failed_ranks();
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
  if (c.held_ != nullptr) return FinishVersionCommit(c);
  ApplyCommitOutcome(c);
  if (!active_ || active_->session->id() != c.session_id_) return last_report_;  // cannot happen: committing
  active_->direct_paused = false;  // the commit settled the engine (resumed, or paused and dirty)
  if (c.asleep_ && !c.stage_only_ && c.outcome_ == Outcome::kStaged && !active_->ended_by && !c.engine_->gone) {
    // Validated while the engine sleeps: the session stays, waiting for the wake to commit it.
    active_->committing = false;
    active_->awaiting_wake = true;
    active_->staged_times = c.times_;
    active_->staged_checksum = c.staged_checksum_;
    RefitReport r = active_->session->Report();
    r.times.validate_ms = c.times_.validate_ms;
    r.times.finish_ms = c.times_.finish_ms;
    r.times.plan_ms = active_->plan_ms;
    r.times.total_ms = Ms(absl::Now() - active_->begun);
    r.outcome = Outcome::kStaged;
    r.cause = EndCause::kNone;
    r.reason = c.reason_;
    r.tag = active_->tag;
    last_report_ = r;
    if (hooks_.on_log) hooks_.on_log(r);
    NotifySession();
    return last_report_;
  }
  Outcome outcome = c.outcome_;
  EndCause cause = c.cause_;
  std::string reason = c.reason_;
  if (c.asleep_ && !c.stage_only_ && outcome == Outcome::kStaged) {
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
  End(outcome, cause, std::move(reason), &c.times_, c.staged_checksum_);
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
