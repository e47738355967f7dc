// TLS for the TCP control plane: builds kj::TlsContext objects from PEM files, after checking
// them with OpenSSL so that a bad file fails at startup (or at connect) with an error naming the
// setting, instead of as a handshake failure later. kj-tls itself does not check that a private
// key matches its certificate, and trusts only the first certificate of a CA file; here every
// certificate of a CA bundle is trusted, so that old and new CAs can be trusted together while
// certificates are rotated (docs/security.md).
//
// Threading: free functions, no shared state. A returned TlsContext may be used by one KJ event
// loop at a time; streams it wrapped stay valid after it is destroyed (OpenSSL reference-counts
// its SSL_CTX), so a server may replace its context while connections are open.
#ifndef REFIT_COMMON_TLS_CONTEXT_H_
#define REFIT_COMMON_TLS_CONTEXT_H_

#include <string>

#include "absl/status/statusor.h"
#include "kj/compat/tls.h"

namespace refit {

// PEM files; `what` strings in errors use the names given in `*_setting`.
struct TlsFiles {
  std::string cert;       // certificate chain, leaf first
  std::string key;        // its private key (unencrypted)
  std::string trust_ca;   // CA bundle: the peer must present a certificate signed by one of them
  // Names of the settings the files came from, for error messages (e.g. "tls.cert" or
  // "REFIT_TLS_CERT").
  std::string cert_setting = "cert";
  std::string key_setting = "key";
  std::string trust_ca_setting = "ca";
};

// What was loaded, for logs.
struct TlsSummary {
  std::string cert_subject;    // "" without a certificate
  std::string cert_not_after;  // e.g. "Jun  1 12:00:00 2026 GMT"
  int trusted_cas = 0;
};

struct TlsContextAndSummary {
  kj::Own<kj::TlsContext> context;
  TlsSummary summary;
};

// Server side: `cert` and `key` are required. With `trust_ca`, clients must present a
// certificate signed by one of its CAs (mutual TLS); the system trust store is never used.
// Errors: unreadable or malformed files, a key that does not match the certificate, a
// certificate that has expired or is not yet valid.
absl::StatusOr<TlsContextAndSummary> NewServerTlsContext(const TlsFiles& files);

// Client side: `trust_ca` is required (only its CAs are trusted); `cert` and `key` are
// optional but go together (they are presented when the server asks for a client certificate).
absl::StatusOr<TlsContextAndSummary> NewClientTlsContext(const TlsFiles& files);

}  // namespace refit

#endif  // REFIT_COMMON_TLS_CONTEXT_H_
