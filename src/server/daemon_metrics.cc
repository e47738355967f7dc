#include "server/daemon_metrics.h"

#include <atomic>
#include <memory>
#include <string>

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
    // Refusal causes (Status.cause) end no session; counted as the engine's or staging's should one.
    case EndCause::kBusy: return R::kOverloaded;
    case EndCause::kEngineDirty: return R::kEngineError;
  }
  return R::kInternal;
}

DaemonHooks MetricsHooks(const metrics::RefitMetrics& m, std::string transport) {
  DaemonHooks h;
  const metrics::RefitMetrics* mp = &m;
  h.on_report = [mp, transport](const RefitReport& r) {
    mp->RecordSession(OutcomeOf(r), ReasonOf(r));
    mp->ObservePhase(metrics::RefitPhase::kReceive, absl::Milliseconds(r.times.receive_ms));
    mp->ObservePhase(metrics::RefitPhase::kConvert, absl::Milliseconds(r.times.convert_ms));
    if (r.outcome == Outcome::kCommitted || r.outcome == Outcome::kRefused) {
      mp->ObservePhase(metrics::RefitPhase::kValidate, absl::Milliseconds(r.times.validate_ms));
    }
    if (r.outcome == Outcome::kCommitted) {
      mp->ObservePhase(metrics::RefitPhase::kCommit, absl::Milliseconds(r.times.commit_ms));
      mp->RecordCommit(r.version, absl::Now(), absl::Milliseconds(r.times.pause_ms));
      mp->SetCommittedTag(r.tag);
    }
    if (r.cause == EndCause::kVerifyMismatch) mp->verify_mismatches_total->Inc();
    // Written into the engine whatever the outcome (a direct session that fails after writing
    // leaves the engine dirty).
    if (r.bytes_in_place > 0) mp->converted_in_place_bytes_total->Inc(static_cast<double>(r.bytes_in_place));
  };
  h.on_versions = [mp](uint32_t held, uint32_t current, uint32_t previous) {
    mp->kept_versions->Labels({"held"}).Set(held);
    mp->kept_versions->Labels({"current"}).Set(current);
    mp->kept_versions->Labels({"previous"}).Set(previous);
  };
  h.on_group = [mp](const GroupMember& g) {
    mp->group_member_info
        ->Only({g.options().name, std::to_string(g.options().member), std::to_string(g.options().members)})
        .Set(1);
    for (GroupPhase p : {GroupPhase::kJoining, GroupPhase::kIdle, GroupPhase::kCopying, GroupPhase::kCopied,
                         GroupPhase::kResuming, GroupPhase::kRestoring}) {
      mp->group_phase->Labels({GroupPhaseName(p)}).Set(g.phase() == p ? 1 : 0);
    }
    mp->group_dirty->Set(g.dirty() ? 1 : 0);
    mp->group_versions->Labels({"committed"}).Set(static_cast<double>(g.commits()));
    mp->group_versions->Labels({"aborted"}).Set(static_cast<double>(g.aborts()));
    mp->group_deadline_expiries->Set(static_cast<double>(g.expiries()));
  };
  h.on_engine = [mp](bool registered) { mp->engine_registered->Set(registered ? 1 : 0); };
  h.on_ranks = [mp](const std::vector<RankStatus>& ranks) {
    for (const RankStatus& r : ranks) {
      const std::string rank = std::to_string(r.tp_rank);
      mp->engine_rank_registered->Labels({rank}).Set(r.registered ? 1 : 0);
      mp->engine_rank_dirty->Labels({rank}).Set(r.dirty || r.left_dirty ? 1 : 0);
      mp->engine_rank_version->Labels({rank}).Set(static_cast<double>(r.version));
    }
  };
  // Byte counters and the staging gauge move per bucket, on the session's threads, so a scrape
  // during a refit sees its progress (not one step at the session's end).
  metrics::Counter* received = &mp->received_bytes_total->Labels({transport});
  h.on_received = [received](uint64_t bytes) { received->Inc(static_cast<double>(bytes)); };
  // The staging gauge is the versions kept in staging (hold: K; set by the loop at each session's
  // begin and end) plus what the active session has staged so far (set per bucket).
  auto kept = std::make_shared<std::atomic<uint64_t>>(0);
  h.on_converted = [mp, kept](const std::map<std::string, uint64_t>& bytes_by_format, uint64_t staged_bytes) {
    for (const auto& [format, bytes] : bytes_by_format) {
      mp->converted_bytes_total->Labels({format}).Inc(static_cast<double>(bytes));
    }
    mp->staging_bytes->Set(static_cast<double>(kept->load() + staged_bytes));
  };
  h.on_session = [mp, kept](uint64_t staging_bytes, bool active) {
    kept->store(staging_bytes);  // at begin and end the active session has staged nothing of its own
    mp->staging_bytes->Set(static_cast<double>(staging_bytes));
    mp->active_sessions->Set(active ? 1 : 0);
  };
  return h;
}

}  // namespace refit::server
