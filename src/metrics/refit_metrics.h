// The metric families refitd exports (catalogue and meaning in docs/metrics.md). The daemon
// registers them once on its Registry and keeps the RefitMetrics value; components update the
// families through it. Label values come from the enums below or from fixed small sets
// (transport and format names), so every label stays bounded.
// Threading: Register is called once at startup; every other method is thread-safe and
// lock-free except the first use of a new label tuple (see metrics/family.h).
#ifndef REFIT_METRICS_REFIT_METRICS_H_
#define REFIT_METRICS_REFIT_METRICS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "metrics/family.h"
#include "metrics/registry.h"

namespace refit::metrics {

// How a refit session ended.
enum class SessionOutcome {
  kCommitted,  // the engine runs the new version
  kAborted,    // the trainer aborted it, or it was dropped (deadline, disconnect) before commit
  kFailed,     // refitd refused or could not complete it; the engine keeps its last version
  kStaged,     // a stage-only refit is held in staging under its tag (hold: K)
};

// Why a session did not commit; kNone for committed sessions.
enum class SessionFailureReason {
  kNone,
  kClientAbort,       // the trainer called abort
  kDeadlineExceeded,  // stalled past its deadline
  kDisconnected,      // a peer or transport went away
  kInvalidInput,      // a manifest, tensor name, dtype, shape or size was rejected
  kIncomplete,        // commit refused: missing or duplicate tensors
  kOverloaded,        // no staging memory or session slot; retry later
  kEngineError,       // the engine failed to pause, resume or accept the copy
  kInternal,          // a bug or unexpected device error
  kVerifyMismatch,    // verify_after_commit: the engine's bytes differ from the staged ones
};

enum class RefitPhase { kReceive, kConvert, kValidate, kCommit };

std::string_view LabelValue(SessionOutcome outcome);      // "committed", "aborted", "failed"
std::string_view LabelValue(SessionFailureReason reason);  // "none", "client_abort", ...
std::string_view LabelValue(RefitPhase phase);             // "receive", "convert", ...

// What the build_info series carries.
struct BuildInfo {
  std::string version;     // e.g. "0.1.0"
  std::string git_commit;  // short hash, or "unknown"
  std::string build_type;  // CMAKE_BUILD_TYPE
  bool cuda = false;       // built with the GPU path
};

// Bucket bounds, in seconds.
std::vector<double> PhaseDurationBuckets();  // 1 ms .. 250 s
std::vector<double> CommitPauseBuckets();    // 100 us .. 10 s

struct RefitMetrics {
  // Registers every family below on `registry` and sets refit_build_info. Fails only if one of
  // the names is already registered there.
  static absl::StatusOr<RefitMetrics> Register(Registry& registry, const BuildInfo& build);

  // refit_sessions_total{outcome,reason}
  void RecordSession(SessionOutcome outcome, SessionFailureReason reason) const;
  // refit_phase_duration_seconds{phase}
  void ObservePhase(RefitPhase phase, absl::Duration duration) const;
  // refit_committed_version, refit_committed_version_timestamp_seconds and
  // refit_commit_pause_seconds, after a commit at `committed_at` that paused the engine for
  // `pause`.
  void RecordCommit(uint64_t version, absl::Time committed_at, absl::Duration pause) const;
  // refit_committed_version_info{tag}: the one series of the engine's current trainer tag.
  void SetCommittedTag(const std::string& tag) const;

  // The families, owned by the registry. Labelled ones take Labels({...}) in the order given.
  CounterFamily* sessions_total = nullptr;        // {outcome, reason}
  CounterFamily* received_bytes_total = nullptr;  // {transport}: data_plane.transport: "ucx", "nccl", "cuda_ipc"
  // {format}: output format name, e.g. "nvfp4"; "passthrough" for tensors staged as they came
  CounterFamily* converted_bytes_total = nullptr;
  HistogramFamily* phase_duration_seconds = nullptr;  // {phase}
  Histogram* commit_pause_seconds = nullptr;
  Gauge* committed_version = nullptr;
  Gauge* committed_version_timestamp_seconds = nullptr;
  GaugeFamily* committed_version_info = nullptr;  // {tag}, value 1: only the current tag's series
  Counter* verify_mismatches_total = nullptr;     // commits verify_after_commit failed
  Counter* converted_in_place_bytes_total = nullptr;  // staging: direct: output bytes converted into the engine
  GaugeFamily* kept_versions = nullptr;           // {state}: held, current, previous (hold: K)
  // Engine ranks: {rank} (the tensor-parallel rank), every declared rank.
  GaugeFamily* engine_rank_registered = nullptr;
  GaugeFamily* engine_rank_dirty = nullptr;
  GaugeFamily* engine_rank_version = nullptr;
  // Engine groups (docs/architecture.md "Engine groups"); registered whether or not a group is
  // configured: refit_group_member_info{group,member,members} 1 only in a group.
  GaugeFamily* group_member_info = nullptr;  // {group, member, members}, value 1
  GaugeFamily* group_phase = nullptr;        // {phase}: 1 for the member's phase now, else 0
  Gauge* group_dirty = nullptr;              // 1 while the group may be mixed here
  GaugeFamily* group_versions = nullptr;     // {outcome}: committed | aborted, since refitd started
  Gauge* group_deadline_expiries = nullptr;  // copied versions this member decided alone
  Gauge* staging_bytes = nullptr;      // bytes held in staging (device or pinned host)
  Gauge* active_sessions = nullptr;    // sessions begun and not yet committed or aborted
  Gauge* engine_registered = nullptr;  // 1 while an engine is registered, else 0
  GaugeFamily* build_info = nullptr;   // {version, git_commit, build_type, cuda}, value 1
};

}  // namespace refit::metrics

#endif  // REFIT_METRICS_REFIT_METRICS_H_
