#include "server/status_causes.h"

namespace refit::server {

absl::Status CommitAnswer(const RefitReport& report, const Node& node) {
  absl::Status status = ReportStatus(report);
  const EngineRecord* engine = node.engine();
  const bool left_dirty = report.outcome == Outcome::kFailed && engine != nullptr && engine->dirty;
  if (!left_dirty || report.cause == EndCause::kVerifyMismatch) return status;
  return WithCause(std::move(status), EndCause::kEngineDirty);
}

}  // namespace refit::server
