// The control plane's front door: accepts connections, admits only authorized peers, and serves
// each admitted connection the Daemon capability with the configured Cap'n Proto ReaderOptions
// (traversal limit, nesting limit), so a hostile message cannot make refitd read unbounded data.
//
// Admission (docs/security.md):
//   - Unix socket: the peer's uid (SO_PEERCRED) must be in `allowed_uids`.
//   - TCP: with a TLS context, the TLS handshake first (with client certificates when the
//     context requires them); then, inside TLS if any, the shared-secret preamble
//     (common/auth_preamble.h). Everything within `handshake_timeout`. A TCP peer is admitted
//     only if it proved something: the token, or a client certificate (`tls_client_certs`).
// A refused connection is closed before any Cap'n Proto message is read, and logged. Each
// connection is admitted as its own task: a peer that stalls or fails its handshake delays no
// other peer. A client that speaks plain TCP to a TLS listener is told so in a Cap'n Proto
// Abort message before the connection is closed, so it reports a clear error.
//
// Limits (server/connection_limits.h): connections beyond `max_connections` (or, on the Unix
// socket, beyond `max_connections_per_uid` of one uid) are closed at accept; every admitted
// connection is read through a MessageLimitedStream (buffered message bytes, stalls). accept()
// failing (EMFILE, ENFILE, ...) is logged, counted and retried after 100 ms: it never ends the
// listener or the process.
//
// File descriptors: Unix-socket connections run over a capability stream and accept up to
// kMaxFdsPerMessage descriptors per message (an engine's CUDA virtual-memory allocations,
// common/fd_passing.h), read through a MessageLimitedCapabilityStream; TCP and TLS connections
// accept none.
//
// Threading: everything runs on the KJ event loop thread that created the listener.
#ifndef REFIT_SERVER_CONTROL_LISTENER_H_
#define REFIT_SERVER_CONTROL_LISTENER_H_

#include <cstdint>
#include <set>
#include <string>

#include "capnp/capability.h"
#include "capnp/message.h"
#include "kj/async-io.h"
#include "kj/compat/tls.h"
#include "kj/timer.h"
#include "server/connection_limits.h"

namespace refit::server {

struct AccessPolicy {
  std::set<uint32_t> allowed_uids;  // Unix-socket peers
  std::string token;                // TCP peers must present it; empty: only client certificates admit
  bool tls_client_certs = false;    // the TLS context requires client certificates (mutual TLS)
  kj::Duration handshake_timeout = 5 * kj::SECONDS;
};

class ControlListener {
 public:
  // `tls`: null for plain TCP; otherwise used for every TCP connection (common/tls_context.h).
  ControlListener(capnp::Capability::Client bootstrap, capnp::ReaderOptions reader_options, AccessPolicy policy,
                  kj::Timer& timer, kj::Own<kj::TlsContext> tls = {}, ConnectionLimits limits = {},
                  ListenerMetrics metrics = {});
  ~ControlListener();

  // Accepts until the returned promise is dropped. `unix_socket` selects the admission check.
  kj::Promise<void> Listen(kj::ConnectionReceiver& listener, bool unix_socket);
  // Replaces the TLS context for connections accepted from now on (certificate rotation); open
  // connections keep theirs. REQUIRES: the listener was built with TLS and `tls` is not null.
  void ReplaceTls(kj::Own<kj::TlsContext> tls);

  uint64_t admitted() const { return admitted_; }
  uint64_t refused() const { return refused_; }
  uint32_t open_connections() const { return counter_.open(); }

 private:
  struct Connection;
  kj::Promise<void> Admit(kj::Own<kj::AsyncIoStream> stream, bool unix_socket);
  kj::Promise<void> AcceptFailed(kj::ConnectionReceiver& listener, bool unix_socket, kj::Exception&& e);
  // TCP admission: resolves to the admitted stream, or fails with the refusal reason.
  kj::Promise<kj::Own<kj::AsyncIoStream>> AdmitTcp(kj::Own<kj::AsyncIoStream> stream);
  kj::Promise<kj::Own<kj::AsyncIoStream>> StartTls(kj::Own<kj::AsyncIoStream> stream);
  kj::Promise<kj::Own<kj::AsyncIoStream>> CheckPreamble(kj::Own<kj::AsyncIoStream> stream);
  // `unix_socket`: the connection may pass file descriptors (common/fd_passing.h).
  void Serve(kj::Own<kj::AsyncIoStream> stream, kj::Own<ConnectionCounter::Slot> slot, bool unix_socket);
  void Refuse(const std::string& reason);
  // A connection closed at accept because a cap is full; `cap` is the config key's reason.
  void RefuseOverCap(const char* cap, const std::string& peer);
  // False when this second already logged enough refusals (a flood must not flood the log).
  bool LogAllowed();

  capnp::Capability::Client bootstrap_;
  const capnp::ReaderOptions reader_options_;
  const AccessPolicy policy_;
  kj::Timer& timer_;
  kj::Own<kj::TlsContext> tls_;
  const ConnectionLimits limits_;
  const ListenerMetrics metrics_;
  ConnectionCounter counter_;
  MessageBudget budget_;
  uint64_t admitted_ = 0, refused_ = 0;
  int64_t log_second_ = -1;
  uint32_t logged_this_second_ = 0;
  uint64_t log_suppressed_ = 0;
  struct ErrorHandler : kj::TaskSet::ErrorHandler {
    void taskFailed(kj::Exception&& e) override;
  } error_handler_;
  kj::TaskSet tasks_;
};

}  // namespace refit::server

#endif  // REFIT_SERVER_CONTROL_LISTENER_H_
