// What the admin HTTP endpoint answers, as a pure function of method, path and the daemon's
// state, apart from the HTTP machinery (admin_server.h) so the routing reads in one place:
//   GET /metrics  200, Prometheus text format 0.0.4
//   GET /healthz  200 "ok" while the process serves requests
//   GET /readyz   200 "ready" when the readiness check passes, else 503 with its reason
//   GET /version  200, JSON build description
//   other paths   404; other methods on a known path 405 with "Allow: GET"
// (With AdminOptions::token set, AdminServer answers 401 before routing a request that lacks it.)
// Threading: RouteAdminRequest runs on the caller's thread and calls `readiness` there; the
// registry may be updated concurrently from any thread.
#ifndef REFIT_SERVER_ADMIN_ADMIN_ROUTES_H_
#define REFIT_SERVER_ADMIN_ADMIN_ROUTES_H_

#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "metrics/refit_metrics.h"
#include "metrics/registry.h"

namespace refit::admin {

// OK when the daemon is ready to serve refits; otherwise a status whose message says why not
// (e.g. "no engine registered"). Must be quick and must not block: it runs on the event loop.
using ReadinessCheck = std::function<absl::Status()>;

struct AdminContent {
  const metrics::Registry* registry = nullptr;  // not owned; must outlive the server
  ReadinessCheck readiness;                     // empty: always ready
  metrics::BuildInfo build;
};

struct AdminResponse {
  int status = 200;
  std::string content_type;
  std::string body;
  std::string allow;  // the Allow header for 405, else empty
};

// `path` is the request path without query string, e.g. "/metrics".
AdminResponse RouteAdminRequest(std::string_view method, std::string_view path,
                                const AdminContent& content);

// The reason phrase for the status codes RouteAdminRequest produces.
std::string_view StatusText(int status);

}  // namespace refit::admin

#endif  // REFIT_SERVER_ADMIN_ADMIN_ROUTES_H_
