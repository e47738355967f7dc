// Maps the daemon's events (session reports, engine registration, staging) onto the Prometheus
// metric families of metrics/refit_metrics.h. Thread-safe (metric updates are atomic).
#ifndef REFIT_SERVER_DAEMON_METRICS_H_
#define REFIT_SERVER_DAEMON_METRICS_H_

#include "metrics/refit_metrics.h"
#include "refit/types.h"
#include "server/daemon_service.h"

namespace refit::server {

// The outcome and failure-reason labels of a session report.
metrics::SessionOutcome OutcomeOf(const RefitReport& report);
metrics::SessionFailureReason ReasonOf(const RefitReport& report);

// Hooks that keep `m` current; `m` must outlive the daemon.
DaemonHooks MetricsHooks(const metrics::RefitMetrics& m, std::string transport);

}  // namespace refit::server

#endif  // REFIT_SERVER_DAEMON_METRICS_H_
