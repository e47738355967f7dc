#include "server/status_causes.h"

namespace refit::server {

absl::Status BeginRefusal(absl::Status refused, const Node& node, const Manifest& manifest) {
  const EngineRecord* engine = node.engine();
  switch (refused.code()) {
    case absl::StatusCode::kUnavailable: {
      const bool engine_answers = engine != nullptr && !engine->gone && engine->control->Responsive();
      return WithCause(std::move(refused), engine_answers ? EndCause::kBusy : EndCause::kEngineError);
    }
    case absl::StatusCode::kFailedPrecondition:
      // Whatever else refused it too, the dirty engine refuses every partial refit until a full one lands.
      if (manifest.partial && engine != nullptr && engine->dirty) {
        return WithCause(std::move(refused), EndCause::kEngineDirty);
      }
      return refused;
    default: return refused;
  }
}

absl::Status CommitAnswer(const RefitReport& report, const Node& node) {
  absl::Status status = ReportStatus(report);
  const EngineRecord* engine = node.engine();
  const bool left_dirty = report.outcome == Outcome::kFailed && engine != nullptr && engine->dirty;
  if (!left_dirty || report.cause == EndCause::kVerifyMismatch) return status;
  return WithCause(std::move(status), EndCause::kEngineDirty);
}

}  // namespace refit::server
