#include "server/daemon_metrics.h"

#include "absl/time/clock.h"

namespace refit::server {
namespace {
bool Has(const std::string& s, std::string_view needle) { return s.find(needle) != std::string::npos; }
}  // namespace

metrics::SessionOutcome OutcomeOf(const RefitReport& r) {
  if (r.outcome == "committed") return metrics::SessionOutcome::kCommitted;
  if (r.outcome == "aborted") return metrics::SessionOutcome::kAborted;
  return metrics::SessionOutcome::kFailed;  // refused or failed: the engine keeps its version
}

metrics::SessionFailureReason ReasonOf(const RefitReport& r) {
  using R = metrics::SessionFailureReason;
  if (r.outcome == "committed") return R::kNone;
  if (r.outcome == "refused") return R::kIncomplete;
  const std::string& m = r.reason;
  if (Has(m, "trainer aborted") || Has(m, "operator abort")) return R::kClientAbort;
  if (Has(m, "deadline")) return R::kDeadlineExceeded;
  if (Has(m, "staging limit") || Has(m, "cannot allocate")) return R::kOverloaded;
  if (Has(m, "engine")) return R::kEngineError;
  if (Has(m, "checksum") || Has(m, "exceeds") || Has(m, "out of order") || Has(m, "lies outside") ||
      Has(m, "declares") || Has(m, "unknown dtype") || Has(m, "rank")) {
    return R::kInvalidInput;
  }
  if (Has(m, "disconnected") || Has(m, "receiving bucket") || Has(m, "shutting down")) return R::kDisconnected;
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
    if (r.outcome == "committed" || r.outcome == "refused") {
      mp->ObservePhase(metrics::RefitPhase::kValidate, absl::Milliseconds(r.times.validate_ms));
    }
    if (r.outcome == "committed") {
      for (const auto& [format, bytes] : r.bytes_out_by_format) {
        mp->converted_bytes_total->Labels({format}).Inc(static_cast<double>(bytes));
      }
      mp->ObservePhase(metrics::RefitPhase::kCommit, absl::Milliseconds(r.times.commit_ms));
      mp->RecordCommit(r.version, absl::Now(), absl::Milliseconds(r.times.pause_ms));
    }
  };
  h.on_engine = [mp](bool registered) { mp->engine_registered->Set(registered ? 1 : 0); };
  h.on_session = [mp](uint64_t staging_bytes, bool active) {
    mp->staging_bytes->Set(static_cast<double>(staging_bytes));
    mp->active_sessions->Set(active ? 1 : 0);
  };
  return h;
}

}  // namespace refit::server
