#include "refit/commit.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/trace.h"
#include "refit/commit_verify.h"

namespace refit {
namespace {

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

std::string Seconds(absl::Duration d) { return absl::StrCat(absl::ToDoubleSeconds(d), " s"); }

}  // namespace

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

Commit::Commit(CommitSetup setup)
    : setup_(std::move(setup)), pause_(setup_.engine, setup_.pause_timeout, setup_.resume_timeout) {
  result_.times = setup_.times;
  result_.staged_checksum = setup_.staged_checksum;
}

void Commit::Phase(const char* name) const {
  if (setup_.on_phase) setup_.on_phase(setup_.session_id, name);
}

void Commit::End(Outcome outcome, EndCause cause, std::string reason) {
  if (direct() && outcome != Outcome::kCommitted && !result_.engine_dirty && !result_.engine_version_set) {
    // staging: direct: the engine is paused since the session began.
    const EnginePause::From& from = pause_.from();
    absl::StrAppend(&reason, SettleDirectSession(*setup_.session, *setup_.engine->control, !from.dirty, from.version,
                                                 from.tag, setup_.resume_timeout, result_.engine_dirty));
    result_.times.pause_ms = Ms(absl::Now() - setup_.direct->pause().paused_at());
  }
  result_.outcome = outcome;
  result_.cause = cause;
  result_.reason = std::move(reason);
}

void Commit::Run() {
  Staged staged;
  if (!Gather(staged)) return;
  std::optional<PreparedCommit> prepared;
  if (!Prepare(staged, prepared)) return;
  if (!Audit()) return;
  std::vector<uint64_t> expected;
  if (!Checksum(staged, *prepared, expected)) return;
  if (!Pause()) return;
  if (!Copy(*prepared)) return;
  if (!Verify(*prepared, expected)) return;
  result_.engine_version_set = true;  // the engine's memory holds to_version() from here on
  if (setup_.group) {
    // An engine group's version: the engine stays paused with it until every member copied.
    Phase("copied");
    resume_pending_ = true;
    return;
  }
  Phase("resuming");
  if (setup_.resume_on_loop) {
    resume_pending_ = true;  // StartLoopResume or RunResume
    return;
  }
  RunResume();
}

bool Commit::Gather(Staged& staged) {
  if (setup_.held != nullptr) {
    // A kept version: received, converted and validated when it was staged.
    staged.staging = setup_.held->staging.get();
    staged.produced = setup_.held->produced;
    return true;
  }
  Session& s = *setup_.session;
  if (setup_.woken) {
    // Staged while the engine slept: received, converted and validated then.
    staged.staging = &s.staging();
    staged.produced = s.ledger().Produced();
    return true;
  }
  if (!DrainAndValidate(s, staged)) return false;
  staged.staging = &s.staging();
  staged.produced = s.ledger().Produced();
  if (setup_.keep) {
    // hold > 0: the version's checksum, for `refitctl versions` (before any pause).
    absl::StatusOr<uint64_t> sum = StagingChecksum(*staged.staging);
    if (!sum.ok()) {
      End(Outcome::kFailed, EndCause::kInternal,
          absl::StrCat("checksumming the staged version failed: ", sum.status().message()));
      return false;
    }
    result_.staged_checksum = *sum;
  }
  if (setup_.stage_only) {
    End(Outcome::kStaged, EndCause::kNone, "");
    return false;
  }
  if (setup_.asleep) {
    if (setup_.refuse_asleep) {
      End(Outcome::kRefused, EndCause::kEngineError,
          "refit refused: the engine is asleep and this daemon refuses refits while it sleeps "
          "(engine.asleep_refits: refuse); the engine is untouched");
    } else {
      End(Outcome::kStaged, EndCause::kNone, std::string(kStagedForWake));
    }
    return false;
  }
  return true;
}

bool Commit::DrainAndValidate(Session& s, Staged& staged) {
  PhaseTimes& times = result_.times;
  absl::Time t0 = absl::Now();
  // Complete before commit: validated once every tensor has arrived, while the last bucket's
  // conversions may still run on the GPU; again after them only if the ledger changed since
  // (a conversion failed).
  std::optional<absl::Status> valid;
  uint64_t validated_changes = 0;
  if (s.WaitIssued().ok()) {
    const absl::Time v0 = absl::Now();
    validated_changes = s.ledger().changes();
    valid = s.Validate();
    times.validate_ms = Ms(absl::Now() - v0);
    TracePoint("daemon.validated");
    if (valid->ok() && !setup_.stage_only && !setup_.asleep) {
      // A commit that builds nothing is prepared now, while the last conversions run; used by
      // Prepare unless the ledger changes meanwhile (a conversion failed).
      const absl::Time p0 = absl::Now();
      PrepareOptions early;
      early.pieces_in_place = !setup_.verify;
      early.only_placement = true;
      const EngineRecord& engine = *setup_.engine;
      absl::StatusOr<PreparedCommit> prepared =
          PrepareCommit(*engine.planner, s.staging(), s.ledger().Produced(), nullptr, early);
      if (prepared.ok() && PrepareStorageWrites(*prepared, *engine.storage).ok()) {
        staged.prepared_early = std::move(*prepared);
        TracePoint("daemon.prepared_early");
      }
      times.prepare_ms = Ms(absl::Now() - p0);
    }
  }
  // Every announced bucket received and converted.
  absl::Status finished = s.Finish();
  TracePoint("daemon.drained");
  times.finish_ms = Ms(absl::Now() - t0) - times.validate_ms - times.prepare_ms;  // the early prepare's
  if (!finished.ok()) {
    End(finished.code() == absl::StatusCode::kResourceExhausted ? Outcome::kFailed : Outcome::kAborted,
        CauseOfSessionFailure(finished), std::string(finished.message()));
    return false;
  }
  t0 = absl::Now();
  if (!valid || s.ledger().changes() != validated_changes) {
    staged.prepared_early.reset();
    valid = s.Validate();
    times.validate_ms += Ms(absl::Now() - t0);
    TracePoint("daemon.validated_again");
  }
  if (valid->ok() && pause_.from().dirty && s.partial()) {
    valid = absl::FailedPreconditionError(
        "refit refused: the engine's weights are dirty after a failed commit; a full refit must land first");
  }
  if (!valid->ok()) {
    End(Outcome::kRefused, EndCause::kIncomplete, std::string(valid->message()));
    return false;
  }
  return true;
}

bool Commit::Prepare(Staged& staged, std::optional<PreparedCommit>& prepared_out) {
  const EngineRecord& engine = *setup_.engine;
  const absl::Time t0 = absl::Now();
  // The live session's commit builds layout steps and derived parameters on the converter's GPU
  // (its converter thread is idle now); a kept version's, which another session's conversion may
  // overlap, builds them on the host.
  DeviceOps* device_ops = setup_.held == nullptr && engine.converter ? engine.converter->device_ops() : nullptr;
  // Pieces of fused and stacked parameters go from staging to their place in the engine's
  // parameter in the window (no assembly copy first), unless verify_after_commit checksums whole
  // parameters.
  PrepareOptions options;
  options.pieces_in_place = !setup_.verify;
  absl::StatusOr<PreparedCommit> prepared = absl::UnknownError("not prepared");
  if (staged.prepared_early) {
    prepared = std::move(*staged.prepared_early);
  } else {
    prepared = PrepareCommit(*engine.planner, *staged.staging, staged.produced, device_ops, options);
    if (prepared.ok()) {
      absl::Status st = PrepareStorageWrites(*prepared, *engine.storage);
      if (!st.ok()) prepared = st;
    }
  }
  result_.times.prepare_ms += Ms(absl::Now() - t0);
  TracePoint("daemon.prepared");
  if (prepared.ok()) {
    absl::Status hit = REFIT_FAILPOINT(setup_.failpoints, failpoints::kBeforeCommit);
    if (!hit.ok()) prepared = hit;
  }
  if (!prepared.ok()) {
    const bool exhausted = prepared.status().code() == absl::StatusCode::kResourceExhausted;
    End(exhausted ? Outcome::kFailed : Outcome::kRefused, exhausted ? EndCause::kOverloaded : EndCause::kInvalidInput,
        absl::StrCat("refit refused: ", prepared.status().message()));
    return false;
  }
  prepared_out = std::move(*prepared);
  return true;
}

bool Commit::Audit() {
  // The registration audit, part 1, before the pause: refitd's own mappings (generation, the shm
  // object or CUDA allocation behind each). Part 2 is the engine's, answered with its pause.
  absl::Status audited = pause_.AuditMappings();
  TracePoint("daemon.audited");
  if (audited.ok()) return true;
  End(Outcome::kRefused, EndCause::kEngineError,
      absl::StrCat("refit refused: ", audited.message(), direct() ? "" : "; the engine is untouched"));
  return false;
}

bool Commit::Checksum(const Staged& staged, const PreparedCommit& prepared, std::vector<uint64_t>& expected) {
  if (!setup_.verify) return true;
  const absl::Time t0 = absl::Now();
  absl::StatusOr<std::vector<uint64_t>> sums =
      StagedChecksums(*setup_.engine->planner, prepared, staged.staging->pool().memory());
  result_.times.verify_ms = Ms(absl::Now() - t0);
  if (!sums.ok()) {
    End(Outcome::kFailed, EndCause::kInternal,
        absl::StrCat("verify_after_commit: checksumming the staged bytes failed: ", sums.status().message(),
                     direct() ? "" : "; the engine is untouched"));
    return false;
  }
  expected = std::move(*sums);
  return true;
}

bool Commit::Pause() {
  // The window: pause, copy in place, (verify,) resume. staging: direct paused the engine when
  // the session began (and audited it then): its window is the whole session.
  Phase("pausing");
  if (direct()) {
    pause_start_ = setup_.direct->pause().paused_at();
    return true;
  }
  pause_start_ = absl::Now();
  const EnginePause::From& from = pause_.from();
  absl::Status paused = pause_.Pause();
  if (pause_.paused()) return true;
  result_.times.pause_ms = Ms(absl::Now() - pause_start_);
  if (pause_.state() == EnginePause::State::kRefused) {
    // The engine's own audit found its registration stale: nothing was written.
    const std::string refusal(pause_.stale_error().message());
    if (from.dirty) {
      End(Outcome::kRefused, EndCause::kEngineError,
          absl::StrCat("refit refused: ", refusal, "; nothing was written (the engine stays paused and dirty)"));
    } else if (!pause_.resume_status().ok()) {
      End(Outcome::kFailed, EndCause::kEngineError,
          absl::StrCat("refit refused: ", refusal, "; nothing was written, but the engine did not resume: ",
                       pause_.resume_status().message()));
    } else {
      End(Outcome::kRefused, EndCause::kEngineError,
          absl::StrCat("refit refused: ", refusal, "; nothing was written (the engine was resumed at version ",
                       from.version, ")"));
    }
    return false;
  }
  if (!pause_.timed_out()) {
    End(Outcome::kFailed, EndCause::kEngineError,
        absl::StrCat("engine did not pause: ", paused.message(), "; its weights are untouched"));
  } else if (from.dirty) {
    // A dirty engine is paused already (an earlier commit was interrupted): it goes on waiting
    // for a full refit, so no resume was queued behind the late pause.
    End(Outcome::kFailed, EndCause::kEngineError,
        absl::StrCat("engine did not pause within ", Seconds(setup_.pause_timeout),
                     "; it stays paused and dirty until a full refit lands, and refits are refused "
                     "until it answers or registers again"));
  } else {
    End(Outcome::kFailed, EndCause::kEngineError,
        absl::StrCat("engine did not pause within ", Seconds(setup_.pause_timeout),
                     "; its weights are untouched (version ", from.version,
                     "), and refits are refused until it answers or registers again"));
  }
  return false;
}

bool Commit::Copy(const PreparedCommit& prepared) {
  Phase("copying");
  TracePoint("daemon.copying");
  const EngineRecord& engine = *setup_.engine;
  const absl::Time t0 = absl::Now();
  absl::Status hit = REFIT_FAILPOINT(setup_.failpoints, failpoints::kMidCommit);
  absl::StatusOr<CommitStats> copied =
      hit.ok() ? WritePrepared(*engine.planner, prepared, *engine.storage) : absl::StatusOr<CommitStats>(hit);
  if (copied.ok()) {
    // Copied but not resumed: an error here is treated like a failed copy.
    hit = REFIT_FAILPOINT(setup_.failpoints, failpoints::kAfterCopy);
    if (!hit.ok()) copied = hit;
  }
  result_.times.commit_ms = Ms(absl::Now() - t0);
  TracePoint("daemon.copied");
  if (!copied.ok()) {
    result_.times.pause_ms = Ms(absl::Now() - pause_start_);
    result_.engine_dirty = true;  // a partial copy: the engine must not serve until a full refit lands
    End(Outcome::kFailed, EndCause::kEngineError,
        absl::StrCat("commit failed, engine left paused and dirty: ", copied.status().message()));
    return false;
  }
  if (!REFIT_FAILPOINT(setup_.failpoints, failpoints::kCorruptCopy).ok()) {
    // Test builds: one byte of the copy goes wrong, as a faulty copy path would make it.
    absl::Status corrupted = CorruptOneByte(prepared, *engine.storage);
    (void)corrupted;
  }
  return true;
}

bool Commit::Verify(const PreparedCommit& prepared, const std::vector<uint64_t>& expected) {
  if (!setup_.verify) return true;
  // Inside the window: an engine whose bytes differ from the staged ones never serves them.
  const EngineRecord& engine = *setup_.engine;
  const absl::Time t0 = absl::Now();
  absl::StatusOr<std::vector<std::string>> mismatched = VerifyWrites(*engine.planner, prepared, expected,
                                                                     *engine.storage);
  result_.times.verify_ms += Ms(absl::Now() - t0);
  if (mismatched.ok() && mismatched->empty()) return true;
  result_.times.pause_ms = Ms(absl::Now() - pause_start_);
  result_.engine_dirty = true;
  if (!mismatched.ok()) {
    End(Outcome::kFailed, EndCause::kInternal,
        absl::StrCat("verify_after_commit: reading the engine's checksums failed: ", mismatched.status().message(),
                     "; engine left paused and dirty"));
    return false;
  }
  result_.verify_mismatch = true;
  const size_t n = mismatched->size();
  if (n > 16) mismatched->resize(16);
  End(Outcome::kFailed, EndCause::kVerifyMismatch,
      absl::StrCat("verify_after_commit: ", n, " engine parameter", n == 1 ? "" : "s",
                   " differ from the staged bytes after the copy (", absl::StrJoin(*mismatched, ", "),
                   n > 16 ? ", ..." : "", "); engine left paused and dirty, a full refit must land"));
  return false;
}

void Commit::RunResume() {
  TracePoint("daemon.resume_sent");
  FinishResume(pause_.Resume(to_version(), setup_.to_tag));
}

bool Commit::StartLoopResume(const std::shared_ptr<Commit>& commit, std::function<void()> done) {
  Commit& c = *commit;
  const bool sent = c.pause_.StartResume(c.to_version(), c.setup_.to_tag,
                                         [commit, done = std::move(done)](absl::Status resumed) {
                                           commit->FinishResume(resumed);
                                           done();
                                         });
  if (sent) TracePoint("daemon.resume_sent");  // else RunResume sends it (and traces it)
  return sent;
}

void Commit::RunRestore(const StagedVersion* before, const std::string& reason) {
  resume_pending_ = false;
  result_.engine_version_set = false;
  const EnginePause::From& from = pause_.from();
  auto dirty = [&](const std::string& why) {
    result_.engine_dirty = true;
    result_.times.pause_ms = Ms(absl::Now() - pause_start_);
    End(Outcome::kFailed, EndCause::kEngineError,
        absl::StrCat(reason, "; ", why, ": the engine stays paused and dirty until a full refit lands"));
  };
  if (before == nullptr || from.dirty) {
    return dirty(from.dirty ? "the engine was dirty before this version"
                            : absl::StrCat("the version it held (", from.version, ") is not kept in staging"));
  }
  Phase("restoring");
  const EngineRecord& engine = *setup_.engine;
  PrepareOptions options;
  options.pieces_in_place = true;
  absl::StatusOr<PreparedCommit> prepared =
      PrepareCommit(*engine.planner, *before->staging, before->produced, nullptr, options);
  if (prepared.ok()) {
    absl::Status st = PrepareStorageWrites(*prepared, *engine.storage);
    if (!st.ok()) prepared = st;
  }
  absl::StatusOr<CommitStats> copied =
      prepared.ok() ? WritePrepared(*engine.planner, *prepared, *engine.storage) : prepared.status();
  if (!copied.ok()) {
    return dirty(absl::StrCat("restoring version ", from.version, " failed: ", copied.status().message()));
  }
  absl::Status resumed = pause_.Resume(from.version, from.tag);
  result_.times.pause_ms = Ms(absl::Now() - pause_start_);
  if (!resumed.ok()) {
    return End(Outcome::kFailed, EndCause::kEngineError,
               absl::StrCat(reason, "; version ", from.version,
                            " was restored but the engine did not resume: ", resumed.message()));
  }
  End(Outcome::kAborted, EndCause::kClientAbort,
      absl::StrCat(reason, "; the engine was restored to version ", from.version,
                   from.tag.empty() ? "" : absl::StrCat(" ('", from.tag, "')"), " and resumed"));
}

void Commit::FinishResume(const absl::Status& resumed) {
  resume_pending_ = false;
  TracePoint("daemon.resumed");
  result_.times.pause_ms = Ms(absl::Now() - pause_start_);
  if (resumed.ok()) return End(Outcome::kCommitted, EndCause::kNone, "");
  if (resumed.code() == absl::StatusCode::kDeadlineExceeded) {
    return End(Outcome::kFailed, EndCause::kEngineError,
               absl::StrCat("engine did not answer resume(", to_version(), ") within ", Seconds(setup_.resume_timeout),
                            "; its memory holds version ", to_version(),
                            " whole, and refits are refused until it answers or registers again"));
  }
  End(Outcome::kFailed, EndCause::kEngineError,
      absl::StrCat("engine did not resume: ", resumed.message(), "; its memory holds version ", to_version(), " whole"));
}

}  // namespace refit
