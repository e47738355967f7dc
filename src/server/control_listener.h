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
                  kj::Timer& timer, kj::Own<kj::TlsContext> tls = {});
  ~ControlListener();

  // Accepts until the returned promise is dropped. `unix_socket` selects the admission check.
  kj::Promise<void> Listen(kj::ConnectionReceiver& listener, bool unix_socket);
  // Replaces the TLS context for connections accepted from now on (certificate rotation); open
  // connections keep theirs. REQUIRES: the listener was built with TLS and `tls` is not null.
  void ReplaceTls(kj::Own<kj::TlsContext> tls);

  uint64_t admitted() const { return admitted_; }
  uint64_t refused() const { return refused_; }

 private:
  struct Connection;
  kj::Promise<void> Admit(kj::Own<kj::AsyncIoStream> stream, bool unix_socket);
  // TCP admission: resolves to the admitted stream, or fails with the refusal reason.
  kj::Promise<kj::Own<kj::AsyncIoStream>> AdmitTcp(kj::Own<kj::AsyncIoStream> stream);
  kj::Promise<kj::Own<kj::AsyncIoStream>> StartTls(kj::Own<kj::AsyncIoStream> stream);
  kj::Promise<kj::Own<kj::AsyncIoStream>> CheckPreamble(kj::Own<kj::AsyncIoStream> stream);
  void Serve(kj::Own<kj::AsyncIoStream> stream);
  void Refuse(const std::string& reason);

  capnp::Capability::Client bootstrap_;
  const capnp::ReaderOptions reader_options_;
  const AccessPolicy policy_;
  kj::Timer& timer_;
  kj::Own<kj::TlsContext> tls_;
  uint64_t admitted_ = 0, refused_ = 0;
  struct ErrorHandler : kj::TaskSet::ErrorHandler {
    void taskFailed(kj::Exception&& e) override;
  } error_handler_;
  kj::TaskSet tasks_;
};

}  // namespace refit::server

#endif  // REFIT_SERVER_CONTROL_LISTENER_H_
