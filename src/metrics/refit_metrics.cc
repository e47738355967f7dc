#include "metrics/refit_metrics.h"

#include "common/status_macros.h"

namespace refit::metrics {

std::string_view LabelValue(SessionOutcome outcome) {
  switch (outcome) {
    case SessionOutcome::kCommitted:
      return "committed";
    case SessionOutcome::kAborted:
      return "aborted";
    case SessionOutcome::kFailed:
      return "failed";
    case SessionOutcome::kStaged:
      return "staged";
  }
  return "unknown";
}

std::string_view LabelValue(SessionFailureReason reason) {
  switch (reason) {
    case SessionFailureReason::kNone:
      return "none";
    case SessionFailureReason::kClientAbort:
      return "client_abort";
    case SessionFailureReason::kDeadlineExceeded:
      return "deadline_exceeded";
    case SessionFailureReason::kDisconnected:
      return "disconnected";
    case SessionFailureReason::kInvalidInput:
      return "invalid_input";
    case SessionFailureReason::kIncomplete:
      return "incomplete";
    case SessionFailureReason::kOverloaded:
      return "overloaded";
    case SessionFailureReason::kEngineError:
      return "engine_error";
    case SessionFailureReason::kInternal:
      return "internal";
    case SessionFailureReason::kVerifyMismatch:
      return "verify_mismatch";
  }
  return "unknown";
}

std::string_view LabelValue(RefitPhase phase) {
  switch (phase) {
    case RefitPhase::kReceive:
      return "receive";
    case RefitPhase::kConvert:
      return "convert";
    case RefitPhase::kValidate:
      return "validate";
    case RefitPhase::kCommit:
      return "commit";
  }
  return "unknown";
}

std::vector<double> PhaseDurationBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
          1,     2.5,    5,     10,   25,    50,   100, 250};
}

std::vector<double> CommitPauseBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};
}

absl::StatusOr<RefitMetrics> RefitMetrics::Register(Registry& registry, const BuildInfo& build) {
  RefitMetrics m;
  REFIT_ASSIGN_OR_RETURN(
      m.sessions_total,
      registry.AddCounter("refit_sessions_total",
                          "Refit sessions that ended, by outcome and failure reason.",
                          {"outcome", "reason"}));
  REFIT_ASSIGN_OR_RETURN(
      m.received_bytes_total,
      registry.AddCounter("refit_received_bytes_total",
                          "Tensor bytes received from trainers, by transport.", {"transport"}));
  REFIT_ASSIGN_OR_RETURN(
      m.converted_bytes_total,
      registry.AddCounter("refit_converted_bytes_total",
                          "Checkpoint-format bytes produced by conversion, by output format.",
                          {"format"}));
  REFIT_ASSIGN_OR_RETURN(
      m.phase_duration_seconds,
      registry.AddHistogram("refit_phase_duration_seconds",
                            "Time a session spent in each phase.", PhaseDurationBuckets(),
                            {"phase"}));
  REFIT_ASSIGN_OR_RETURN(
      HistogramFamily * pause,
      registry.AddHistogram("refit_commit_pause_seconds",
                            "Time the engine was paused for a commit (pause to resume).",
                            CommitPauseBuckets()));
  m.commit_pause_seconds = &pause->Labels({});
  REFIT_ASSIGN_OR_RETURN(
      GaugeFamily * version,
      registry.AddGauge("refit_committed_version", "Weight version the engine last resumed with."));
  m.committed_version = &version->Labels({});
  REFIT_ASSIGN_OR_RETURN(
      GaugeFamily * version_time,
      registry.AddGauge("refit_committed_version_timestamp_seconds",
                        "Unix time at which the committed version was resumed."));
  m.committed_version_timestamp_seconds = &version_time->Labels({});
  REFIT_ASSIGN_OR_RETURN(
      m.committed_version_info,
      registry.AddGauge("refit_committed_version_info",
                        "The trainer's tag of the version the engine serves (\"\" when none); the value is always 1.",
                        {"tag"}));
  REFIT_ASSIGN_OR_RETURN(
      CounterFamily * mismatches,
      registry.AddCounter("refit_verify_mismatches_total",
                          "Commits whose engine bytes, checksummed after the copy (engine.verify_after_commit), "
                          "did not match the staged bytes."));
  m.verify_mismatches_total = &mismatches->Labels({});
  REFIT_ASSIGN_OR_RETURN(
      CounterFamily * in_place,
      registry.AddCounter("refit_converted_in_place_bytes_total",
                          "Output bytes converted straight into the engine's memory (staging: direct), counted at "
                          "each session's end."));
  m.converted_in_place_bytes_total = &in_place->Labels({});
  REFIT_ASSIGN_OR_RETURN(
      m.kept_versions,
      registry.AddGauge("refit_kept_versions",
                        "Versions kept in staging (hold: K), by state: held, current, previous.", {"state"}));
  for (const char* state : {"held", "current", "previous"}) m.kept_versions->Labels({state}).Set(0);
  REFIT_ASSIGN_OR_RETURN(
      GaugeFamily * staging,
      registry.AddGauge("refit_staging_bytes", "Bytes held in staging buffers."));
  m.staging_bytes = &staging->Labels({});
  REFIT_ASSIGN_OR_RETURN(
      GaugeFamily * active,
      registry.AddGauge("refit_active_sessions", "Sessions begun and not yet ended."));
  m.active_sessions = &active->Labels({});
  REFIT_ASSIGN_OR_RETURN(
      GaugeFamily * engine,
      registry.AddGauge("refit_engine_registered", "1 while an engine is registered, else 0."));
  m.engine_registered = &engine->Labels({});
  REFIT_ASSIGN_OR_RETURN(
      m.engine_rank_registered,
      registry.AddGauge("refit_engine_rank_registered",
                        "Engine ranks: 1 while the rank is registered, else 0 (every declared rank).", {"rank"}));
  REFIT_ASSIGN_OR_RETURN(
      m.engine_rank_dirty,
      registry.AddGauge("refit_engine_rank_dirty",
                        "Engine ranks: 1 while the rank's weights may be mixed (a commit failed on it), else 0.",
                        {"rank"}));
  REFIT_ASSIGN_OR_RETURN(
      m.engine_rank_version,
      registry.AddGauge("refit_engine_rank_version", "Engine ranks: the version the rank holds.", {"rank"}));
  REFIT_ASSIGN_OR_RETURN(m.group_member_info,
                         registry.AddGauge("refit_group_member_info",
                                           "Engine groups: 1 for this daemon's group, its member index and the "
                                           "group's member count (one series of empty labels, 0, outside a group).",
                                           {"group", "member", "members"}));
  // Outside a group: one series with empty labels, 0 (a member replaces it by its own, 1).
  m.group_member_info->Only({"", "", ""}).Set(0);
  REFIT_ASSIGN_OR_RETURN(m.group_phase,
                         registry.AddGauge("refit_group_phase",
                                           "Engine groups: 1 for the member's phase now (joining, idle, copying, "
                                           "copied, resuming, restoring), else 0.",
                                           {"phase"}));
  for (const char* phase : {"joining", "idle", "copying", "copied", "resuming", "restoring"}) {
    m.group_phase->Labels({phase}).Set(0);
  }
  REFIT_ASSIGN_OR_RETURN(
      GaugeFamily * group_dirty,
      registry.AddGauge("refit_group_dirty",
                        "Engine groups: 1 while the group may be mixed here (only a group refit clears it), else 0."));
  m.group_dirty = &group_dirty->Labels({});
  REFIT_ASSIGN_OR_RETURN(m.group_versions,
                         registry.AddGauge("refit_group_versions",
                                           "Engine groups: group versions this member committed or aborted since it "
                                           "started, by outcome.",
                                           {"outcome"}));
  for (const char* outcome : {"committed", "aborted"}) m.group_versions->Labels({outcome}).Set(0);
  REFIT_ASSIGN_OR_RETURN(
      GaugeFamily * expiries,
      registry.AddGauge("refit_group_deadline_expiries",
                        "Engine groups: group versions this member, copied, restored alone at its deadline."));
  m.group_deadline_expiries = &expiries->Labels({});
  REFIT_ASSIGN_OR_RETURN(
      m.build_info,
      registry.AddGauge("refit_build_info", "Build of the running refitd; the value is always 1.",
                        {"version", "git_commit", "build_type", "cuda"}));

  m.build_info
      ->Labels({build.version, build.git_commit, build.build_type, build.cuda ? "true" : "false"})
      .Set(1);
  // Series that dashboards and alerts expect from the first scrape on.
  m.sessions_total->Labels({LabelValue(SessionOutcome::kCommitted),
                            LabelValue(SessionFailureReason::kNone)});
  for (RefitPhase phase : {RefitPhase::kReceive, RefitPhase::kConvert, RefitPhase::kValidate,
                           RefitPhase::kCommit}) {
    m.phase_duration_seconds->Labels({LabelValue(phase)});
  }
  return m;
}

void RefitMetrics::RecordSession(SessionOutcome outcome, SessionFailureReason reason) const {
  sessions_total->Labels({LabelValue(outcome), LabelValue(reason)}).Inc();
}

void RefitMetrics::ObservePhase(RefitPhase phase, absl::Duration duration) const {
  phase_duration_seconds->Labels({LabelValue(phase)}).Observe(absl::ToDoubleSeconds(duration));
}

void RefitMetrics::SetCommittedTag(const std::string& tag) const {
  committed_version_info->Only({tag}).Set(1);
}

void RefitMetrics::RecordCommit(uint64_t version, absl::Time committed_at,
                                absl::Duration pause) const {
  committed_version->Set(static_cast<double>(version));
  committed_version_timestamp_seconds->Set(absl::ToDoubleSeconds(committed_at -
                                                                 absl::UnixEpoch()));
  commit_pause_seconds->Observe(absl::ToDoubleSeconds(pause));
}

}  // namespace refit::metrics
