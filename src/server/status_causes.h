// The causes refitd attaches to the statuses a trainer gets (refit/types.h WithCause, carried as
// Status.cause), so that it tells apart failures of one code that it handles differently: a busy
// daemon (begin again soon) from a missing engine (both Unavailable), and a dirty engine (only a
// full refit lands) from either. Node::Begin's refusals carry their causes from the node; a
// commit's answer takes the engine's state when it ended from here.
//
// Threading: the daemon's event loop (the node's thread), right after the node answered.
#ifndef REFIT_SERVER_STATUS_CAUSES_H_
#define REFIT_SERVER_STATUS_CAUSES_H_

#include "absl/status/status.h"
#include "refit/node.h"
#include "refit/types.h"

namespace refit::server {

// The status answering a commit that ended with `report` (ReportStatus, the report's cause
// attached); a refit that failed and left the engine dirty has cause kEngineDirty instead, except
// a verify mismatch, whose own cause always means a dirty engine.
absl::Status CommitAnswer(const RefitReport& report, const Node& node);

}  // namespace refit::server

#endif  // REFIT_SERVER_STATUS_CAUSES_H_
