#include "common/control_connect.h"

#include <cctype>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/auth_preamble.h"
#include "common/tls_context.h"
#include "kj/compat/tls.h"

namespace refit {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// A failed TLS handshake, explained in terms of the settings that fix it.
absl::Status HandshakeError(const kj::Exception& e, const ControlClientOptions& options,
                            const std::string& server_name) {
  std::string detail(e.getDescription().begin(), e.getDescription().size());
  if (detail.find("hostname mismatch") != std::string::npos) {
    return absl::UnavailableError(absl::StrCat("TLS: refitd's certificate does not carry the name '", server_name,
                                               "' (set REFIT_TLS_SERVER_NAME to a name it carries): ", detail));
  }
  if (detail.find("not trusted") != std::string::npos) {
    return absl::UnavailableError(absl::StrCat("TLS: refitd's certificate is not signed by a CA in REFIT_TLS_CA ('",
                                               options.tls_ca, "'): ", detail));
  }
  return absl::UnavailableError(absl::StrCat(
      "TLS handshake failed (does refitd listen with tls: on this port? does it require a client certificate, "
      "REFIT_TLS_CERT and REFIT_TLS_KEY?): ",
      detail));
}

}  // namespace

absl::StatusOr<ControlClientOptions> ControlClientOptionsFromEnv() {
  ControlClientOptions o;
  o.token = ClientToken();
  o.tls_ca = Env("REFIT_TLS_CA");
  o.tls_cert = Env("REFIT_TLS_CERT");
  o.tls_key = Env("REFIT_TLS_KEY");
  o.tls_server_name = Env("REFIT_TLS_SERVER_NAME");
  o.tls = !o.tls_ca.empty();
  if (!o.tls) {
    for (const char* name : {"REFIT_TLS_CERT", "REFIT_TLS_KEY", "REFIT_TLS_SERVER_NAME"}) {
      if (!Env(name).empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, " is set but REFIT_TLS_CA is not: set it to the CA that signed refitd's certificate"));
      }
    }
  }
  return o;
}

std::string HostOfAddress(const std::string& address) {
  if (!address.empty() && address[0] == '[') {
    size_t close = address.find(']');
    return close == std::string::npos ? address.substr(1) : address.substr(1, close - 1);
  }
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || address.find(':') != colon) return address;  // no port, or bare IPv6
  return address.substr(0, colon);
}

absl::StatusOr<kj::Own<kj::AsyncIoStream>> ConnectControl(kj::Network& network, kj::WaitScope& wait_scope,
                                                          const std::string& address,
                                                          const ControlClientOptions& options, kj::Timer* timer,
                                                          kj::Duration timeout) {
  const bool tcp = IsTcpAddress(address);
  auto bounded = [timer, timeout](auto promise) -> decltype(promise) {
    if (timer == nullptr) return promise;
    return timer->timeoutAfter(timeout, kj::mv(promise));
  };
  kj::Own<kj::TlsContext> tls;
  std::string server_name = options.tls_server_name.empty() ? HostOfAddress(address) : options.tls_server_name;
  if (tcp && options.tls) {
    TlsFiles files;
    files.trust_ca = options.tls_ca;
    files.cert = options.tls_cert;
    files.key = options.tls_key;
    files.trust_ca_setting = "REFIT_TLS_CA";
    files.cert_setting = "REFIT_TLS_CERT";
    files.key_setting = "REFIT_TLS_KEY";
    absl::StatusOr<TlsContextAndSummary> ctx = NewClientTlsContext(files);
    if (!ctx.ok()) return ctx.status();
    tls = kj::mv(ctx->context);
  }
  kj::Own<kj::AsyncIoStream> stream;
  KJ_IF_MAYBE (e, kj::runCatchingExceptions([&]() {
                 stream = bounded(bounded(network.parseAddress(address)).wait(wait_scope)->connect()).wait(wait_scope);
               })) {
    return absl::UnavailableError(absl::string_view(e->getDescription().begin(), e->getDescription().size()));
  }
  if (tls.get() != nullptr) {
    KJ_IF_MAYBE (e, kj::runCatchingExceptions(
                        [&]() { stream = bounded(tls->wrapClient(kj::mv(stream), server_name)).wait(wait_scope); })) {
      return HandshakeError(*e, options, server_name);
    }
    // The stream does not need the context after the handshake; it stays with it for clarity.
    stream = stream.attach(kj::mv(tls));
  }
  if (tcp) {
    // Every TCP connection starts with the preamble (docs/security.md); inside TLS when TLS is on.
    std::string preamble = AuthPreamble(options.token);
    KJ_IF_MAYBE (e, kj::runCatchingExceptions(
                        [&]() { bounded(stream->write(preamble.data(), preamble.size())).wait(wait_scope); })) {
      return absl::UnavailableError(absl::StrCat("sending the authentication preamble: ", absl::string_view(e->getDescription().begin(), e->getDescription().size())));
    }
  }
  return stream;
}

std::string TlsDisconnectHint(const std::string& description) {
  std::string lower = description;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower.find("ssl") == std::string::npos) return "";  // kj-tls and OpenSSL errors say "ssl"
  return " (over TLS: refitd may require a client certificate, REFIT_TLS_CERT and REFIT_TLS_KEY, or have refused "
         "this one; its log says why)";
}

}  // namespace refit
