#include "refit/node.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/checksum.h"
#include "refit/committer.h"
#include "refit/manifest_check.h"

namespace refit {
namespace {

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

std::string Seconds(absl::Duration d) { return absl::StrCat(absl::ToDoubleSeconds(d), " s"); }

}  // namespace

Node::Node(NodeOptions options, transport::Receiver& receiver, BucketRing& ring, NodeHooks hooks)
    : options_(std::move(options)),
      system_clock_(options_.clock == nullptr ? NewSystemClock() : nullptr),
      clock_(options_.clock != nullptr ? options_.clock : system_clock_.get()),
      receiver_(receiver),
      ring_(ring),
      hooks_(std::move(hooks)) {}

Node::~Node() {
  if (active_) active_->session->Abort("daemon shutting down");
}

// ---- engines ----

absl::StatusOr<uint64_t> Node::RegisterEngine(EngineSetup setup) {
  if (engine_ && !engine_->gone) {
    return absl::UnavailableError(absl::StrCat(
        "an engine is already registered (engine ", engine_->id,
        "); it must drop its registration or disconnect before another engine registers"));
  }
  auto record = std::make_shared<EngineRecord>();
  record->id = next_engine_id_++;
  record->planner = std::move(setup.planner);
  record->storage = std::move(setup.storage);
  record->pool = std::move(setup.pool);
  record->converter = std::move(setup.converter);
  record->control = std::move(setup.control);
  for (const auto& p : record->storage->params()) record->bytes += p.nbytes;
  record->version = setup.version;
  record->dirty = setup.dirty;
  engine_ = std::move(record);
  if (hooks_.on_engine) hooks_.on_engine(true);
  return engine_->id;
}

void Node::UnregisterEngine(uint64_t engine_id) {
  if (!engine_ || engine_->id != engine_id) return;
  engine_->gone = true;
  if (active_ && active_->engine.get() == engine_.get()) AbortWith(EndCause::kEngineError, "engine unregistered");
  engine_.reset();
  if (hooks_.on_engine) hooks_.on_engine(false);
}

absl::Status Node::Ready() const {
  if (!engine_) return absl::UnavailableError("no engine registered");
  if (engine_->dirty) return absl::UnavailableError("engine weights dirty after a failed commit");
  if (!engine_->control->Responsive()) return absl::UnavailableError("engine did not answer a pause or resume");
  return absl::OkStatus();
}

uint64_t Node::version() const { return engine_ ? engine_->version : last_report_.version; }

// ---- sessions ----

absl::StatusOr<BeginResult> Node::Begin(const Manifest& manifest, absl::Time requested) {
  if (!engine_) return absl::UnavailableError("no engine is registered");
  if (active_) return absl::UnavailableError(absl::StrCat("busy: session ", active_->session->id(), " is active"));
  if (!engine_->control->Responsive()) {
    return absl::UnavailableError(absl::StrCat("engine ", engine_->id,
                                               " did not answer a pause or resume in time; refits are refused until "
                                               "it answers or registers again"));
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
  const SessionLimits& limits = options_.limits;
  // Count and names first: nothing below plans, logs or echoes a name this refuses.
  if (absl::Status checked = CheckManifest(manifest, limits); !checked.ok()) return checked;
  // Fail fast on what the manifest already gets wrong; commit re-checks what actually arrives.
  std::vector<std::string> problems;
  size_t count = 0;
  for (const TensorDesc& t : manifest.tensors) {
    absl::StatusOr<TensorPlan> plan = engine_->planner->Plan(t.name, t.dtype, t.shape);
    if (plan.ok()) continue;
    if (++count <= 64) problems.push_back(std::string(plan.status().message()));
  }
  if (count != 0) {
    return absl::FailedPreconditionError(absl::StrCat("manifest refused (", count, " problem", count == 1 ? "" : "s",
                                                   "): ", absl::StrJoin(problems, "; ")));
  }
  const uint32_t deadline_ms =
      manifest.deadline_ms != 0 ? std::min(manifest.deadline_ms, limits.deadline_ms) : limits.deadline_ms;
  Session::Options so;
  so.id = NewSessionId();
  so.partial = manifest.partial;
  // The session's blocking waits (buckets, receives) run on the real clock; the node ends the
  // session at its deadline by its own clock (Poll).
  so.deadline = absl::Now() + absl::Milliseconds(deadline_ms);
  so.limits = limits;
  so.failpoints = options_.failpoints;
  so.on_received = hooks_.on_received;
  so.on_converted = hooks_.on_converted;
  Active a;
  a.engine = engine_;
  a.session = std::make_unique<Session>(*engine_->planner, receiver_, ring_, *engine_->converter, *engine_->pool, so);
  a.begun = requested;
  a.deadline = clock_->Now() + absl::Milliseconds(deadline_ms);
  a.plan_ms = Ms(absl::Now() - requested);
  active_ = std::move(a);
  NotifySession();
  return BeginResult{so.id, deadline_ms};
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

absl::Status Node::Join(uint64_t session_id) {
  absl::Status active = CheckActive(session_id);
  if (!active.ok()) return active;
  if (active_->committing) {
    return absl::FailedPreconditionError(absl::StrCat("session ", session_id, " is committing; too late to join"));
  }
  ++active_->open_members;
  return absl::OkStatus();
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

absl::StatusOr<uint32_t> Node::Announce(uint64_t session_id, BucketHeader header) {
  absl::Status active = CheckActive(session_id);
  if (!active.ok()) return active;
  uint32_t seq = 0;
  absl::Status status = active_->session->Announce(std::move(header), &seq);
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
  if (!active_ || active_->session->id() != session_id || active_->committing) return;
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
  AbortWith(EndCause::kDisconnected, "daemon shutting down");
  return committing();
}

void Node::End(Outcome outcome, EndCause cause, std::string reason, const PhaseTimes* times) {
  if (!active_) return;
  const bool sealed = active_->session->sealed();
  if (outcome != Outcome::kCommitted) active_->session->Abort(reason);
  RefitReport r = active_->session->Report();
  if (times != nullptr) {
    r.times.validate_ms = times->validate_ms;
    r.times.finish_ms = times->finish_ms;
    r.times.prepare_ms = times->prepare_ms;
    r.times.commit_ms = times->commit_ms;
    r.times.pause_ms = times->pause_ms;
  }
  r.times.plan_ms = active_->plan_ms;
  r.times.total_ms = Ms(absl::Now() - active_->begun);
  r.outcome = outcome;
  r.cause = outcome == Outcome::kCommitted ? EndCause::kNone : cause;
  r.reason = std::move(reason);
  r.version = outcome == Outcome::kCommitted ? active_->engine->version : 0;
  switch (outcome) {
    case Outcome::kCommitted: ++committed_; break;
    case Outcome::kRefused: ++refused_; break;
    default: ++aborted_; break;
  }
  last_report_ = r;
  if (hooks_.on_log) hooks_.on_log(r);
  if (outcome != Outcome::kCommitted && r.cause != EndCause::kClientAbort && !sealed) {
    // Ended by refitd before every bucket was in (deadline, a corrupt bucket, engine gone,
    // shutdown): a trainer of this session may be blocked sending a bucket nobody will receive.
    // Its connection is dropped so the send fails; it reconnects for its next session. A session
    // refused or failed after its buckets were all received (validation, commit) blocks nobody:
    // its trainers keep their connections.
    receiver_.DisconnectPeers();
  }
  if (hooks_.on_report) hooks_.on_report(r);
  active_.reset();
  NotifySession();
}

void Node::NotifySession() {
  if (hooks_.on_session) hooks_.on_session(staging_bytes(), active_.has_value());
}

uint64_t Node::NewSessionId() {
  // A random nonzero 32-bit nonce: data-plane tags are (id << 32) | seq and ids are handed out
  // only over the control plane, so a data-plane peer cannot address a live session without it.
  uint64_t id = 0;
  while (id == 0 || id == last_session_id_) id = entropy_();
  last_session_id_ = id;
  return id;
}

// ---- the commit protocol ----

absl::StatusOr<std::shared_ptr<Commit>> Node::StartCommit(uint64_t session_id) {
  absl::Status active = CheckActive(session_id);
  if (!active.ok()) return active;
  if (active_->committing) return absl::FailedPreconditionError("commit already in progress");
  if (active_->engine->gone) return absl::UnavailableError("the engine unregistered");
  if (!active_->engine->control->Responsive()) {
    return absl::UnavailableError("the engine did not answer a pause or resume in time");
  }
  active_->committing = true;
  auto commit = std::make_shared<Commit>();
  commit->session_id_ = session_id;
  commit->session_ = active_->session.get();
  commit->engine_ = active_->engine;
  commit->failpoints_ = options_.failpoints;
  commit->hooks_ = &hooks_;
  commit->pause_timeout_ = options_.pause_timeout;
  commit->resume_timeout_ = options_.resume_timeout;
  commit->from_version_ = active_->engine->version;
  commit->dirty_at_start_ = active_->engine->dirty;
  return commit;
}

void Node::RunCommit(Commit& c) {
  Session& s = *c.session_;
  EngineRecord& engine = *c.engine_;
  auto phase = [&c](const char* name) {
    if (c.hooks_->on_commit_phase) c.hooks_->on_commit_phase(c.session_id_, name);
  };
  auto end = [&c](Outcome outcome, EndCause cause, std::string reason) {
    c.outcome_ = outcome;
    c.cause_ = cause;
    c.reason_ = std::move(reason);
  };

  // Every announced bucket received and converted.
  absl::Time t0 = absl::Now();
  absl::Status finished = s.Finish();
  c.times_.finish_ms = Ms(absl::Now() - t0);
  if (!finished.ok()) {
    return end(finished.code() == absl::StatusCode::kResourceExhausted ? Outcome::kFailed : Outcome::kAborted,
               CauseOfSessionFailure(finished), std::string(finished.message()));
  }

  // Complete before commit.
  t0 = absl::Now();
  absl::Status valid = s.Validate();
  if (valid.ok() && c.dirty_at_start_ && s.partial()) {
    valid = absl::FailedPreconditionError(
        "refit refused: the engine's weights are dirty after a failed commit; a full refit must land first");
  }
  c.times_.validate_ms = Ms(absl::Now() - t0);
  if (!valid.ok()) return end(Outcome::kRefused, EndCause::kIncomplete, std::string(valid.message()));

  // Every engine parameter built (assembly, layout steps, derived state) before the pause.
  t0 = absl::Now();
  absl::StatusOr<PreparedCommit> prepared = PrepareCommit(*engine.planner, s.staging(), s.ledger().Produced());
  if (prepared.ok()) {
    absl::Status st = PrepareStorageWrites(*prepared, *engine.storage);
    if (!st.ok()) prepared = st;
  }
  c.times_.prepare_ms = Ms(absl::Now() - t0);
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

  // The window: pause, copy in place, resume.
  phase("pausing");
  const absl::Time pause_start = absl::Now();
  absl::Status paused = engine.control->Pause(c.pause_timeout_);
  if (!paused.ok()) {
    c.times_.pause_ms = Ms(absl::Now() - pause_start);
    if (paused.code() == absl::StatusCode::kDeadlineExceeded) {
      // The engine may still pause later: the resume queued behind the pause (calls reach the
      // engine in order) lets it serve the version it has, which nothing touched.
      // Sent, not awaited: the engine stays unresponsive until it answers.
      absl::Status resumed = engine.control->Resume(c.from_version_, absl::ZeroDuration());
      (void)resumed;
      return end(Outcome::kFailed, EndCause::kEngineError,
                 absl::StrCat("engine did not pause within ", Seconds(c.pause_timeout_),
                              "; its weights are untouched (version ", c.from_version_,
                              "), and refits are refused until it answers or registers again"));
    }
    return end(Outcome::kFailed, EndCause::kEngineError,
               absl::StrCat("engine did not pause: ", paused.message(), "; its weights are untouched"));
  }
  phase("copying");
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
  if (!copied.ok()) {
    c.times_.pause_ms = Ms(absl::Now() - pause_start);
    c.engine_dirty_ = true;  // a partial copy: the engine must not serve until a full refit lands
    return end(Outcome::kFailed, EndCause::kEngineError,
               absl::StrCat("commit failed, engine left paused and dirty: ", copied.status().message()));
  }
  const uint64_t to_version = c.from_version_ + 1;
  c.engine_version_set_ = true;  // the engine's memory holds to_version from here on
  phase("resuming");
  absl::Status resumed = engine.control->Resume(to_version, c.resume_timeout_);
  c.times_.pause_ms = Ms(absl::Now() - pause_start);
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

const RefitReport& Node::FinishCommit(Commit& c) {
  EngineRecord& engine = *c.engine_;
  if (c.engine_dirty_) engine.dirty = true;
  if (c.engine_version_set_) {
    engine.version = c.from_version_ + 1;
    engine.dirty = false;
  }
  if (!active_ || active_->session->id() != c.session_id_) return last_report_;  // cannot happen: committing
  Outcome outcome = c.outcome_;
  EndCause cause = c.cause_;
  std::string reason = c.reason_;
  if (outcome == Outcome::kAborted && active_->ended_by) {
    // The node ended the session while its commit was still receiving (engine gone, operator,
    // shutdown): that is why it ended.
    cause = active_->ended_by->first;
    reason = active_->ended_by->second;
  }
  End(outcome, cause, std::move(reason), &c.times_);
  return last_report_;
}

absl::StatusOr<std::vector<Node::ParamChecksum>> Node::Checksums() const {
  if (!engine_) return absl::UnavailableError("no engine is registered");
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
