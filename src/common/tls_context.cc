#include "common/tls_context.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bounded_file.h"
#include "kj/vector.h"

namespace refit {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

// The OpenSSL errors queued on this thread, as one line; clears the queue (kj-tls reads the
// same queue when a handshake fails, and stale entries would end up in its message).
std::string TakeOpensslErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no detail from OpenSSL" : out;
}

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& setting) {
  // A certificate chain or CA bundle is kilobytes; 4 MiB leaves room for the largest bundles.
  absl::StatusOr<std::string> read = ReadBoundedFile(path, 4 << 20, "file");
  if (!read.ok()) return absl::InvalidArgumentError(absl::StrCat(setting, ": ", read.status().message()));
  std::string text = std::move(*read);
  if (text.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(setting, ": '", path, "' is not a PEM file"));
  }
  return text;
}

BioPtr MemBio(const std::string& text) { return BioPtr(BIO_new_mem_buf(text.data(), static_cast<int>(text.size()))); }

// Every certificate in a PEM text, in order.
absl::StatusOr<std::vector<X509Ptr>> ParseCertificates(const std::string& pem, const std::string& path,
                                                       const std::string& setting) {
  ERR_clear_error();
  BioPtr bio = MemBio(pem);
  std::vector<X509Ptr> out;
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) out.emplace_back(x);
  // The loop ends with "no start line" at the end of the text; anything else is a broken block.
  unsigned long last = ERR_peek_last_error();
  bool clean_end = ERR_GET_REASON(last) == PEM_R_NO_START_LINE;
  std::string detail = TakeOpensslErrors();
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(setting, ": no certificate in '", path, "'"));
  if (last != 0 && !clean_end) {
    return absl::InvalidArgumentError(absl::StrCat(setting, ": malformed certificate in '", path, "': ", detail));
  }
  return out;
}

int NoPassword(char*, int, int, void*) { return 0; }

absl::StatusOr<PkeyPtr> ParseKey(const std::string& pem, const std::string& path, const std::string& setting) {
  ERR_clear_error();
  BioPtr bio = MemBio(pem);
  PkeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassword, nullptr));
  if (!key) {
    return absl::InvalidArgumentError(absl::StrCat(setting, ": no usable private key in '", path,
                                                   "' (encrypted keys are not supported): ", TakeOpensslErrors()));
  }
  return key;
}

std::string SubjectOf(X509* x) {
  char buf[512];
  X509_NAME_oneline(X509_get_subject_name(x), buf, sizeof(buf));
  return buf;
}

std::string NotAfterOf(X509* x) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  ASN1_TIME_print(bio.get(), X509_get0_notAfter(x));
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, n > 0 ? static_cast<size_t>(n) : 0);
}

absl::Status CheckValidNow(X509* x, const std::string& path, const std::string& setting) {
  if (X509_cmp_current_time(X509_get0_notAfter(x)) <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(setting, ": the certificate in '", path, "' expired on ", NotAfterOf(x)));
  }
  if (X509_cmp_current_time(X509_get0_notBefore(x)) > 0) {
    return absl::InvalidArgumentError(absl::StrCat(setting, ": the certificate in '", path, "' is not valid yet"));
  }
  return absl::OkStatus();
}

kj::TlsCertificate ToKj(X509* x) {
  int n = i2d_X509(x, nullptr);
  std::vector<unsigned char> der(n > 0 ? static_cast<size_t>(n) : 0);
  unsigned char* p = der.data();
  i2d_X509(x, &p);
  return kj::TlsCertificate(kj::arrayPtr(der.data(), der.size()));
}

// The checked pieces of a context, before kj::TlsContext is built from them.
struct Loaded {
  kj::Maybe<kj::TlsKeypair> keypair;
  kj::Vector<kj::TlsCertificate> trusted;
  TlsSummary summary;
};

absl::StatusOr<Loaded> Load(const TlsFiles& f) {
  Loaded out;
  if (f.cert.empty() != f.key.empty()) {
    return absl::InvalidArgumentError(f.cert.empty() ? absl::StrCat(f.key_setting, " is set but ", f.cert_setting, " is not")
                                                     : absl::StrCat(f.cert_setting, " is set but ", f.key_setting, " is not"));
  }
  if (!f.cert.empty()) {
    absl::StatusOr<std::string> cert_pem = ReadPemFile(f.cert, f.cert_setting);
    if (!cert_pem.ok()) return cert_pem.status();
    absl::StatusOr<std::string> key_pem = ReadPemFile(f.key, f.key_setting);
    if (!key_pem.ok()) return key_pem.status();
    absl::StatusOr<std::vector<X509Ptr>> chain = ParseCertificates(*cert_pem, f.cert, f.cert_setting);
    if (!chain.ok()) return chain.status();
    if (chain->size() > 10) {
      return absl::InvalidArgumentError(absl::StrCat(f.cert_setting, ": '", f.cert, "' holds ", chain->size(),
                                                     " certificates; a chain may hold at most 10"));
    }
    absl::StatusOr<PkeyPtr> key = ParseKey(*key_pem, f.key, f.key_setting);
    if (!key.ok()) return key.status();
    X509* leaf = chain->front().get();
    if (X509_check_private_key(leaf, key->get()) != 1) {
      ERR_clear_error();
      return absl::InvalidArgumentError(absl::StrCat(f.key_setting, ": the key in '", f.key,
                                                     "' does not belong to the certificate in '", f.cert, "' (",
                                                     f.cert_setting, ")"));
    }
    if (absl::Status st = CheckValidNow(leaf, f.cert, f.cert_setting); !st.ok()) return st;
    out.summary.cert_subject = SubjectOf(leaf);
    out.summary.cert_not_after = NotAfterOf(leaf);
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
      out.keypair = kj::TlsKeypair{kj::TlsPrivateKey(kj::StringPtr(key_pem->c_str())),
                                   kj::TlsCertificate(kj::StringPtr(cert_pem->c_str()))};
    })) {
      ERR_clear_error();
      return absl::InvalidArgumentError(
          absl::StrCat(f.cert_setting, "/", f.key_setting, ": ", absl::string_view(e->getDescription().begin(), e->getDescription().size())));
    }
  }
  if (!f.trust_ca.empty()) {
    absl::StatusOr<std::string> ca_pem = ReadPemFile(f.trust_ca, f.trust_ca_setting);
    if (!ca_pem.ok()) return ca_pem.status();
    absl::StatusOr<std::vector<X509Ptr>> cas = ParseCertificates(*ca_pem, f.trust_ca, f.trust_ca_setting);
    if (!cas.ok()) return cas.status();
    for (X509Ptr& ca : *cas) out.trusted.add(ToKj(ca.get()));
    out.summary.trusted_cas = static_cast<int>(cas->size());
  }
  return out;
}

absl::StatusOr<TlsContextAndSummary> Build(Loaded loaded, bool server) {
  kj::TlsContext::Options options;
  options.useSystemTrustStore = false;
  options.verifyClients = server && loaded.trusted.size() > 0;
  options.trustedCertificates = loaded.trusted.asPtr();
  KJ_IF_MAYBE(kp, loaded.keypair) { options.defaultKeypair = *kp; }
  TlsContextAndSummary out;
  out.summary = loaded.summary;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { out.context = kj::heap<kj::TlsContext>(kj::mv(options)); })) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("TLS setup failed: ", absl::string_view(e->getDescription().begin(), e->getDescription().size())));
  }
  return out;
}

}  // namespace

absl::StatusOr<TlsContextAndSummary> NewServerTlsContext(const TlsFiles& files) {
  if (files.cert.empty() || files.key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TLS needs both ", files.cert_setting, " and ", files.key_setting));
  }
  absl::StatusOr<Loaded> loaded = Load(files);
  if (!loaded.ok()) return loaded.status();
  return Build(std::move(*loaded), /*server=*/true);
}

absl::StatusOr<TlsContextAndSummary> NewClientTlsContext(const TlsFiles& files) {
  if (files.trust_ca.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TLS needs ", files.trust_ca_setting, ": the CA that signed refitd's certificate"));
  }
  absl::StatusOr<Loaded> loaded = Load(files);
  if (!loaded.ok()) return loaded.status();
  return Build(std::move(*loaded), /*server=*/false);
}

}  // namespace refit
