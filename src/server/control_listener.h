// The control plane's front door: accepts connections, admits only authorized peers, and serves
// each admitted connection the Daemon capability with the configured Cap'n Proto ReaderOptions
// (traversal limit, nesting limit), so a hostile message cannot make refitd read unbounded data.
//
// Admission (docs/security.md):
//   - Unix socket: the peer's uid (SO_PEERCRED) must be in `allowed_uids`.
//   - TCP: the peer must first send the shared-secret preamble (common/auth_preamble.h) within
//     `handshake_timeout`; refitd refuses to listen on TCP without a token.
// A refused connection is closed before any Cap'n Proto message is read, and logged.
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
#include "kj/timer.h"

namespace refit::server {

struct AccessPolicy {
  std::set<uint32_t> allowed_uids;  // Unix-socket peers
  std::string token;                // TCP peers must present it; empty: TCP connections are refused
  kj::Duration handshake_timeout = 5 * kj::SECONDS;
};

class ControlListener {
 public:
  ControlListener(capnp::Capability::Client bootstrap, capnp::ReaderOptions reader_options, AccessPolicy policy,
                  kj::Timer& timer);
  ~ControlListener();

  // Accepts until the returned promise is dropped. `unix_socket` selects the admission check.
  kj::Promise<void> Listen(kj::ConnectionReceiver& listener, bool unix_socket);

  uint64_t admitted() const { return admitted_; }
  uint64_t refused() const { return refused_; }

 private:
  struct Connection;
  kj::Promise<void> Admit(kj::Own<kj::AsyncIoStream> stream, bool unix_socket);
  void Serve(kj::Own<kj::AsyncIoStream> stream);
  void Refuse(const std::string& reason);

  capnp::Capability::Client bootstrap_;
  const capnp::ReaderOptions reader_options_;
  const AccessPolicy policy_;
  kj::Timer& timer_;
  uint64_t admitted_ = 0, refused_ = 0;
  struct ErrorHandler : kj::TaskSet::ErrorHandler {
    void taskFailed(kj::Exception&& e) override;
  } error_handler_;
  kj::TaskSet tasks_;
};

}  // namespace refit::server

#endif  // REFIT_SERVER_CONTROL_LISTENER_H_
