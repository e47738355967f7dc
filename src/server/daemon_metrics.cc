#include "server/daemon_metrics.h"

#include "absl/time/clock.h"

namespace refit::server {

metrics::SessionOutcome OutcomeOf(const RefitReport& r) {
  if (r.outcome == Outcome::kCommitted) return metrics::SessionOutcome::kCommitted;
  if (r.outcome == Outcome::kAborted) return metrics::SessionOutcome::kAborted;
  if (r.outcome == Outcome::kStaged) return metrics::SessionOutcome::kStaged;
  return metrics::SessionOutcome::kFailed;  // refused or failed: the engine keeps its version
}

// From the report's typed cause: never from the text of its reason.
metrics::SessionFailureReason ReasonOf(const RefitReport& r) {
  using R = metrics::SessionFailureReason;
  if (r.outcome == Outcome::kCommitted || r.outcome == Outcome::kStaged) return R::kNone;
  switch (r.cause) {
    case EndCause::kNone: return r.outcome == Outcome::kRefused ? R::kIncomplete : R::kInternal;
    case EndCause::kClientAbort: return R::kClientAbort;
    case EndCause::kDeadlineExceeded: return R::kDeadlineExceeded;
    case EndCause::kDisconnected: return R::kDisconnected;
    case EndCause::kInvalidInput: return R::kInvalidInput;
    case EndCause::kIncomplete: return R::kIncomplete;
    case EndCause::kOverloaded: return R::kOverloaded;
    case EndCause::kEngineError: return R::kEngineError;
    case EndCause::kInternal: return R::kInternal;
    case EndCause::kVerifyMismatch: return R::kVerifyMismatch;
  }
  return R::kInternal;
}

DaemonHooks MetricsHooks(const metrics::RefitMetrics& m, std::string transport) {
  DaemonHooks h;
  const metrics::RefitMetrics* mp = &m;
  h.on_report = [mp, transport](const RefitReport& r) {
    mp->RecordSession(OutcomeOf(r), ReasonOf(r));
    mp->received_bytes_total->Labels({transport}).Inc(static_cast<double>(r.bytes_in));
    mp->ObservePhase(metrics::RefitPhase::kReceive, absl::Milliseconds(r.times.receive_ms));
    mp->ObservePhase(metrics::RefitPhase::kConvert, absl::Milliseconds(r.times.convert_ms));
    if (r.outcome == Outcome::kCommitted || r.outcome == Outcome::kRefused) {
      mp->ObservePhase(metrics::RefitPhase::kValidate, absl::Milliseconds(r.times.validate_ms));
    }
    if (r.outcome == Outcome::kCommitted) {
      for (const auto& [format, bytes] : r.bytes_out_by_format) {
        mp->converted_bytes_total->Labels({format}).Inc(static_cast<double>(bytes));
      }
      mp->ObservePhase(metrics::RefitPhase::kCommit, absl::Milliseconds(r.times.commit_ms));
      mp->RecordCommit(r.version, absl::Now(), absl::Milliseconds(r.times.pause_ms));
      mp->SetCommittedTag(r.tag);
    }
    if (r.cause == EndCause::kVerifyMismatch) mp->verify_mismatches_total->Inc();
  };
  h.on_versions = [mp](uint32_t held, uint32_t current, uint32_t previous) {
    mp->kept_versions->Labels({"held"}).Set(held);
    mp->kept_versions->Labels({"current"}).Set(current);
    mp->kept_versions->Labels({"previous"}).Set(previous);
  };
  h.on_engine = [mp](bool registered) { mp->engine_registered->Set(registered ? 1 : 0); };
  h.on_session = [mp](uint64_t staging_bytes, bool active) {
    mp->staging_bytes->Set(static_cast<double>(staging_bytes));
    mp->active_sessions->Set(active ? 1 : 0);
  };
  return h;
}

}  // namespace refit::server
