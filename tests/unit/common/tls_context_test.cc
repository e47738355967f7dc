// TLS context loading and the client connect settings (common/tls_context.h,
// common/control_connect.h). Certificates are made with the openssl CLI in a temp dir.
#include "common/tls_context.h"

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/control_connect.h"
#include "gtest/gtest.h"

namespace refit {
namespace {

namespace fs = std::filesystem;

class TlsContextTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/refit-tls-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = new fs::path(tmpl);
    std::string d = dir_->string();
    const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    std::string script =
        "cd " + d + " && openssl req -x509 " + ec + " -keyout ca.key -out ca.crt -days 2 -subj /CN=ca" +
        " && openssl req -x509 " + ec + " -keyout ca2.key -out ca2.crt -days 2 -subj /CN=ca2" +
        " && openssl req " + ec + " -keyout server.key -out server.csr -subj /CN=refitd" +
        " && openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 2" +
        " && openssl req " + ec + " -keyout other.key -out other.csr -subj /CN=other" +
        " && cat ca.crt ca2.crt > bundle.crt && echo 'not pem' > junk.txt) >/dev/null 2>&1";
    ASSERT_EQ(std::system(("(" + script).c_str()), 0);
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  static std::string P(const char* name) { return (*dir_ / name).string(); }
  static fs::path* dir_;
};
fs::path* TlsContextTest::dir_ = nullptr;

TEST_F(TlsContextTest, ServerLoadsMatchingPairAndEveryCaOfABundle) {
  TlsFiles f{P("server.crt"), P("server.key"), P("bundle.crt")};
  absl::StatusOr<TlsContextAndSummary> ctx = NewServerTlsContext(f);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  EXPECT_EQ(ctx->summary.cert_subject, "/CN=refitd");
  EXPECT_FALSE(ctx->summary.cert_not_after.empty());
  EXPECT_EQ(ctx->summary.trusted_cas, 2);
}

TEST_F(TlsContextTest, ErrorsNameTheSetting) {
  TlsFiles f{P("server.crt"), P("other.key"), ""};
  f.cert_setting = "tls.cert";
  f.key_setting = "tls.key";
  absl::Status st = NewServerTlsContext(f).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("tls.key: the key in"), absl::string_view::npos) << st;

  f.key = P("server.key");
  f.cert = P("absent.crt");
  st = NewServerTlsContext(f).status();
  EXPECT_NE(st.message().find("tls.cert: cannot read"), absl::string_view::npos) << st;

  f.cert = P("junk.txt");
  st = NewServerTlsContext(f).status();
  EXPECT_NE(st.message().find("is not a PEM file"), absl::string_view::npos) << st;

  f.cert = P("server.key");  // PEM, but no certificate in it
  st = NewServerTlsContext(f).status();
  EXPECT_NE(st.message().find("tls.cert: no certificate"), absl::string_view::npos) << st;

  TlsFiles client{"", "", ""};
  client.trust_ca_setting = "REFIT_TLS_CA";
  st = NewClientTlsContext(client).status();
  EXPECT_NE(st.message().find("REFIT_TLS_CA"), absl::string_view::npos) << st;
  TlsFiles half{P("server.crt"), "", P("ca.crt")};
  st = NewClientTlsContext(half).status();
  EXPECT_NE(st.message().find("is set but"), absl::string_view::npos) << st;
}

TEST(ControlConnectTest, HostOfAddress) {
  EXPECT_EQ(HostOfAddress("refitd.example:7400"), "refitd.example");
  EXPECT_EQ(HostOfAddress("127.0.0.1:7400"), "127.0.0.1");
  EXPECT_EQ(HostOfAddress("[::1]:7400"), "::1");
  EXPECT_EQ(HostOfAddress("refitd.example"), "refitd.example");
}

TEST(ControlConnectTest, OptionsFromEnv) {
  unsetenv("REFIT_TLS_CA");
  setenv("REFIT_TLS_CERT", "/x.crt", 1);
  absl::StatusOr<ControlClientOptions> o = ControlClientOptionsFromEnv();
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("REFIT_TLS_CERT is set but REFIT_TLS_CA is not"), absl::string_view::npos);
  unsetenv("REFIT_TLS_CERT");
  o = ControlClientOptionsFromEnv();
  ASSERT_TRUE(o.ok());
  EXPECT_FALSE(o->tls);
  setenv("REFIT_TLS_CA", "/ca.crt", 1);
  o = ControlClientOptionsFromEnv();
  ASSERT_TRUE(o.ok());
  EXPECT_TRUE(o->tls);
  EXPECT_EQ(o->tls_ca, "/ca.crt");
  unsetenv("REFIT_TLS_CA");
}

TEST(ControlConnectTest, TlsDisconnectHint) {
  EXPECT_NE(TlsDisconnectHint("ssl connection ended during write").find("REFIT_TLS_CERT"), std::string::npos);
  EXPECT_EQ(TlsDisconnectHint("Peer disconnected."), "");
}

}  // namespace
}  // namespace refit
