// The one way clients (trainer client, engine agent, refitctl, the C API and the Python package
// through it) open a control-plane connection to refitd:
//   - "unix:PATH": a plain Unix-socket connection (refitd checks the peer's uid); by default
//     kDefaultControlAddress.
//   - "HOST:PORT": TCP; with TLS when $REFIT_TLS_CA is set (docs/security.md), then the
//     shared-secret preamble (common/auth_preamble.h), inside TLS when TLS is on.
// Settings come from the environment:
//   REFITD_TOKEN / REFITD_TOKEN_FILE   the shared secret (may be empty under mutual TLS)
//   REFIT_TLS_CA                       CA bundle that signed refitd's certificate; turns TLS on
//   REFIT_TLS_CERT, REFIT_TLS_KEY      client certificate and key (when refitd requires them)
//   REFIT_TLS_SERVER_NAME              the name refitd's certificate must carry (default: HOST)
//
// Threading: ConnectControl runs on the calling thread's KJ event loop and waits on it.
#ifndef REFIT_COMMON_CONTROL_CONNECT_H_
#define REFIT_COMMON_CONTROL_CONNECT_H_

#include <string>

#include "absl/status/statusor.h"
#include "kj/async-io.h"
#include "kj/timer.h"

namespace refit {

// Where refitd listens and clients connect when nothing says otherwise ($REFITD_ADDRESS, a
// --address flag, the `listen` key): a socket in refitd's own runtime directory (systemd
// RuntimeDirectory=refitd), never in a world-writable one (docs/security.md).
inline constexpr char kDefaultControlAddress[] = "unix:/run/refitd/refitd.sock";

struct ControlClientOptions {
  std::string token;
  bool tls = false;
  std::string tls_ca;           // REFIT_TLS_CA
  std::string tls_cert;         // REFIT_TLS_CERT
  std::string tls_key;          // REFIT_TLS_KEY
  std::string tls_server_name;  // REFIT_TLS_SERVER_NAME; "" = the host of the address
};

// Reads the variables above. Errors: REFIT_TLS_CERT/KEY/SERVER_NAME set without REFIT_TLS_CA.
absl::StatusOr<ControlClientOptions> ControlClientOptionsFromEnv();

// The host part of "HOST:PORT" or "[V6]:PORT" (brackets removed); the whole string without a port.
std::string HostOfAddress(const std::string& address);

// Connects to `address` as described above and returns the stream the Cap'n Proto client runs
// on. Errors (kUnavailable; callers add the address): unreachable refitd, a TLS handshake that
// refitd's certificate fails (untrusted CA, wrong name), a refitd that closes the handshake (no
// TLS on that port, or it wants a client certificate); kInvalidArgument for unusable TLS files,
// naming the variable. With `timer`, each step (resolving, connecting, the TLS handshake, the
// preamble) is bounded by `timeout`: kUnavailable past it (an address that drops the connect).
absl::StatusOr<kj::Own<kj::AsyncIoStream>> ConnectControl(kj::Network& network, kj::WaitScope& wait_scope,
                                                          const std::string& address,
                                                          const ControlClientOptions& options,
                                                          kj::Timer* timer = nullptr,
                                                          kj::Duration timeout = 10 * kj::SECONDS);

// For a connection lost with a TLS error: a hint at the likely causes (refitd requires a client
// certificate, or refused the one presented; with TLS 1.3 that surfaces only at the first call).
// "" for other errors.
std::string TlsDisconnectHint(const std::string& description);

}  // namespace refit

#endif  // REFIT_COMMON_CONTROL_CONNECT_H_
