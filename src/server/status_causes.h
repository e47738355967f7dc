// The causes refitd attaches to the statuses a trainer gets (refit/types.h WithCause, carried as
// Status.cause), so that it tells apart failures of one code that it handles differently: a busy
// daemon (begin again soon) from a missing engine (both Unavailable), and a dirty engine (only a
// full refit lands) from either. The node answers with codes; the causes are read here, at the
// edge, from the node's state at the moment it answered.
//
// Threading: the daemon's event loop (the node's thread), right after the node answered.
#ifndef REFIT_SERVER_STATUS_CAUSES_H_
#define REFIT_SERVER_STATUS_CAUSES_H_

#include "absl/status/status.h"
#include "refit/node.h"
#include "refit/types.h"

namespace refit::server {

// A begin of `manifest` that Node::Begin refused, with its cause. Node::Begin refuses as
// Unavailable only a missing or unanswering engine (kEngineError) or a busy node (kBusy: the
// engine is there and answering); a partial refit of a dirty engine (FailedPrecondition) is
// kEngineDirty. Other refusals keep no cause: their code says it.
absl::Status BeginRefusal(absl::Status refused, const Node& node, const Manifest& manifest);

// The status answering a commit that ended with `report` (ReportStatus, the report's cause
// attached); a refit that failed and left the engine dirty has cause kEngineDirty instead, except
// a verify mismatch, whose own cause always means a dirty engine.
absl::Status CommitAnswer(const RefitReport& report, const Node& node);

}  // namespace refit::server

#endif  // REFIT_SERVER_STATUS_CAUSES_H_
