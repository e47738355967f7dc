// The admin HTTP endpoint of the daemon (routes in admin_routes.h), served with KJ-HTTP on the
// daemon's existing KJ event loop, next to its Cap'n Proto RPC.
//
// Threading: construct, use and destroy an AdminServer on the thread that runs its event loop.
// Requests are served on that loop; the registry it exposes may be updated from any thread.
// Destroying the server stops listening and drops open connections.
//
// Limits: at most `max_connections` open connections (more are closed at accept and counted);
// KJ-HTTP closes a connection that sends no complete request within 15 s, or no next request
// within 5 s of an answer. accept() failing (EMFILE, ENFILE, ...) is counted, reported through
// `warn` and retried after 100 ms; the endpoint never stops listening on its own. With a
// `token`, every request must carry "Authorization: Bearer TOKEN" (401 otherwise).
#ifndef REFIT_SERVER_ADMIN_ADMIN_SERVER_H_
#define REFIT_SERVER_ADMIN_ADMIN_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kj/async-io.h"
#include "kj/compat/http.h"
#include "kj/timer.h"
#include "metrics/counter.h"
#include "metrics/gauge.h"
#include "server/admin/admin_routes.h"

namespace refit::admin {

struct AdminOptions {
  // Any address kj::Network::parseAddress takes: "127.0.0.1:9400", "[::1]:0", "unix:/path".
  // Port 0 picks a free port; port() reports it. The default keeps the endpoint local.
  std::string listen_address = "127.0.0.1:0";
  uint32_t max_connections = 16;
  std::string token;  // "": requests need no authorization
  // Not owned; null: not counted. `warn` gets one log line's text; empty: KJ_LOG.
  metrics::Counter* accept_errors = nullptr;
  metrics::Counter* refused_connections = nullptr;
  metrics::Gauge* open_connections = nullptr;
  std::function<void(const std::string&)> warn;
};

class AdminServer {
 public:
  // Binds options.listen_address and starts serving. Resolves to InvalidArgument when the
  // address does not parse and to Unavailable when it cannot be bound; both name the address.
  static kj::Promise<absl::StatusOr<std::unique_ptr<AdminServer>>> Listen(
      kj::Network& network, kj::Timer& timer, const AdminOptions& options, AdminContent content);

  // Serves on an already-bound listener (for a daemon that binds its sockets itself).
  AdminServer(kj::Timer& timer, kj::Own<kj::ConnectionReceiver> listener, AdminContent content,
              AdminOptions options = {});
  ~AdminServer();
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  // The bound TCP port (0 for a Unix socket).
  uint16_t port() const { return port_; }

  // Stops accepting connections and requests; resolves once in-flight requests are answered.
  kj::Promise<void> Drain();

 private:
  class Service;
  struct IgnoreErrors : kj::TaskSet::ErrorHandler {
    void taskFailed(kj::Exception&&) override {}
  };

  AdminServer(kj::Timer& timer, kj::Own<kj::ConnectionReceiver> listener, AdminContent content,
              AdminOptions options, kj::HttpHeaderTable::Builder&& headers);
  kj::Promise<void> AcceptLoop();
  kj::Promise<void> AcceptFailed(kj::Exception&& e);  // counts, logs, retries after 100 ms
  void Warn(const std::string& line);

  kj::Timer& timer_;
  const AdminContent content_;
  const AdminOptions options_;
  // These refer to header_table_, built right after them.
  const kj::HttpHeaderId allow_header_;
  const kj::HttpHeaderId authorization_header_;
  const kj::HttpHeaderId www_authenticate_header_;
  kj::Own<kj::HttpHeaderTable> header_table_;
  kj::Own<kj::ConnectionReceiver> listener_;
  uint16_t port_;
  kj::Own<Service> service_;
  kj::Own<kj::HttpServer> http_;
  uint32_t open_ = 0;
  uint64_t refused_logged_ = 0, accept_errors_logged_ = 0;  // every 100th is logged
  IgnoreErrors ignore_errors_;
  kj::TaskSet connections_;        // after http_ and open_: destroyed before them
  kj::Promise<void> listen_task_;  // last: destroyed first, before what it uses
};

}  // namespace refit::admin

#endif  // REFIT_SERVER_ADMIN_ADMIN_SERVER_H_
