// Node's begin of a session: the checks that may refuse it, planning its manifest, and for
// staging: direct the placement in the engine's memory and the engine's pause (an early one sent
// while the begin is still decoded). Loop thread only, like the rest of Node.
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/trace.h"
#include "refit/manifest_check.h"
#include "refit/megatron_source.h"
#include "refit/node.h"

namespace refit {

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
  a.plan_ms = absl::ToDoubleMilliseconds(absl::Now() - requested);
  a.tag = manifest.tag;
  const bool pause_first = a.placement != nullptr;
  active_ = std::move(a);
  NotifySession();
  return BeginResult{so.id, deadline_ms, so.wire, pause_first};
}

absl::Status Node::MayBegin(const Manifest& manifest) const {
  // Each refusal carries the cause a trainer acts on (WithCause): busy (begin again soon), the
  // engine missing or not answering, the engine dirty (only a full refit lands).
  auto busy = [](const std::string& why) { return WithCause(absl::UnavailableError("busy: " + why), EndCause::kBusy); };
  // Engine ranks: refused before anything is received or written unless every rank is in.
  if (!engine_) {
    return WithCause(absl::UnavailableError(ranked_ ? MissingRanks() : "no engine is registered"),
                     EndCause::kEngineError);
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
    return absl::InvalidArgumentError(absl::StrCat("manifest is for model '", PrintableName(manifest.model),
                                                   "' but this daemon serves '", options_.model, "'"));
  }
  if (engine_->dirty && manifest.partial) {
    return WithCause(absl::FailedPreconditionError("partial refit refused: the engine's weights are dirty after an "
                                                   "interrupted commit; a full refit must land first"),
                     EndCause::kEngineDirty);
  }
  if (absl::Status tag = CheckTag(manifest.tag); !tag.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest tag '", PrintableName(manifest.tag), "': ", tag.message()));
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
      *placing_ != std::make_pair(manifest_key, engine_->id) || !engine_->control->Responsive()) {
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
    if (early->pause().engine() != active_->engine || early->pause().from().generation != active_->engine->generation) {
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
    return absl::AbortedError(
        absl::StrCat("session ", p.session_id(), " ended while its engine paused (staging: direct)",
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

}  // namespace refit
