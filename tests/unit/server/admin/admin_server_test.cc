// Serves the admin endpoint on a real KJ event loop and talks to it over loopback TCP with
// KJ's HTTP client.
#include "server/admin/admin_server.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kj/async-io.h"
#include "kj/compat/http.h"
#include "metrics/registry.h"
#include "metrics/text_format.h"
#include "nlohmann/json.hpp"

namespace refit::admin {
namespace {

using ::testing::HasSubstr;

struct Reply {
  uint status = 0;
  std::string content_type;
  std::string allow;
  std::string body;
};

class AdminServerTest : public ::testing::Test {
 protected:
  AdminServerTest()
      : io_(std::make_unique<kj::AsyncIoContext>(kj::setupAsyncIo())),
        timer_(io_->provider->getTimer()),
        network_(io_->provider->getNetwork()) {
    kj::HttpHeaderTable::Builder builder;
    allow_ = builder.add("Allow");
    authorization_ = builder.add("Authorization");
    table_ = builder.build();
    client_ = kj::newHttpClient(timer_, *table_, network_, nullptr);
    counter_ = *registry_.AddCounter("test_requests_total", "Requests.", {"code"});
    counter_->Labels({"200"}).Inc(5);
  }

  // KJ's destructors are noexcept(false); a gtest fixture's must not be.
  ~AdminServerTest() noexcept override {}

  AdminContent Content() {
    AdminContent c;
    c.registry = &registry_;
    c.readiness = [this] { return ready_; };
    c.build = {"1.2.3", "deadbeef", "Debug", false};
    return c;
  }

  std::unique_ptr<AdminServer> Start(const std::string& address = "127.0.0.1:0", AdminOptions options = {}) {
    options.listen_address = address;
    absl::StatusOr<std::unique_ptr<AdminServer>> server =
        AdminServer::Listen(network_, timer_, options, Content()).wait(io_->waitScope);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? std::move(*server) : nullptr;
  }

  Reply Fetch(const AdminServer& server, const std::string& path,
              kj::HttpMethod method = kj::HttpMethod::GET, const std::string& authorization = "") {
    kj::HttpHeaders headers(*table_);
    if (!authorization.empty()) headers.set(authorization_, kj::StringPtr(authorization.c_str()));
    const std::string url = "http://127.0.0.1:" + std::to_string(server.port()) + path;
    auto request = client_->request(method, kj::StringPtr(url.c_str()), headers, uint64_t{0});
    kj::HttpClient::Response response = request.response.wait(io_->waitScope);
    Reply reply;
    reply.status = response.statusCode;
    KJ_IF_MAYBE(v, response.headers->get(kj::HttpHeaderId::CONTENT_TYPE)) {
      reply.content_type = v->cStr();
    }
    KJ_IF_MAYBE(v, response.headers->get(allow_)) { reply.allow = v->cStr(); }
    reply.body = response.body->readAllText().wait(io_->waitScope).cStr();
    return reply;
  }

  std::unique_ptr<kj::AsyncIoContext> io_;
  kj::Timer& timer_;
  kj::Network& network_;
  kj::HttpHeaderId allow_ = kj::HttpHeaderId::HOST;
  kj::HttpHeaderId authorization_ = kj::HttpHeaderId::HOST;
  kj::Own<kj::HttpHeaderTable> table_;
  kj::Own<kj::HttpClient> client_;
  metrics::Registry registry_;
  metrics::CounterFamily* counter_ = nullptr;
  absl::Status ready_ = absl::UnavailableError("no engine registered");
};

TEST_F(AdminServerTest, ServesMetricsInTextFormat) {
  auto server = Start();
  ASSERT_NE(server, nullptr);
  EXPECT_NE(server->port(), 0);
  Reply r = Fetch(*server, "/metrics");
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(r.content_type, "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(r.body,
            "# HELP test_requests_total Requests.\n"
            "# TYPE test_requests_total counter\n"
            "test_requests_total{code=\"200\"} 5\n");
  // Updates show in the next scrape; a query string does not change the route.
  counter_->Labels({"503"}).Inc();
  Reply again = Fetch(*server, "/metrics?name[]=x");
  EXPECT_EQ(again.status, 200u);
  EXPECT_EQ(again.body, metrics::FormatText(registry_));
  EXPECT_THAT(again.body, HasSubstr("test_requests_total{code=\"503\"} 1\n"));
}

TEST_F(AdminServerTest, HealthzIsAlwaysOk) {
  auto server = Start();
  Reply r = Fetch(*server, "/healthz");
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(r.body, "ok\n");
}

TEST_F(AdminServerTest, ReadyzFollowsTheReadinessCheck) {
  auto server = Start();
  Reply not_ready = Fetch(*server, "/readyz");
  EXPECT_EQ(not_ready.status, 503u);
  EXPECT_EQ(not_ready.body, "not ready: no engine registered\n");
  ready_ = absl::OkStatus();
  Reply ready = Fetch(*server, "/readyz");
  EXPECT_EQ(ready.status, 200u);
  EXPECT_EQ(ready.body, "ready\n");
}

TEST_F(AdminServerTest, VersionIsJson) {
  auto server = Start();
  Reply r = Fetch(*server, "/version");
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(r.content_type, "application/json");
  nlohmann::json j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["name"], "refitd");
  EXPECT_EQ(j["version"], "1.2.3");
  EXPECT_EQ(j["git_commit"], "deadbeef");
  EXPECT_EQ(j["build_type"], "Debug");
  EXPECT_EQ(j["cuda"], false);
}

TEST_F(AdminServerTest, UnknownPathIs404AndOtherMethodsAre405) {
  auto server = Start();
  EXPECT_EQ(Fetch(*server, "/").status, 404u);
  EXPECT_EQ(Fetch(*server, "/metricsx").status, 404u);
  EXPECT_EQ(Fetch(*server, "/metrics/extra").status, 404u);
  Reply post = Fetch(*server, "/metrics", kj::HttpMethod::POST);
  EXPECT_EQ(post.status, 405u);
  EXPECT_EQ(post.allow, "GET");
  EXPECT_EQ(Fetch(*server, "/readyz", kj::HttpMethod::DELETE).status, 405u);
  // The server keeps serving after errors.
  EXPECT_EQ(Fetch(*server, "/healthz").status, 200u);
}

TEST_F(AdminServerTest, ServesOnAGivenListener) {
  kj::Own<kj::NetworkAddress> address =
      network_.parseAddress("127.0.0.1", 0).wait(io_->waitScope);
  AdminServer server(timer_, address->listen(), Content());
  EXPECT_EQ(Fetch(server, "/healthz").status, 200u);
  server.Drain().wait(io_->waitScope);
}

TEST_F(AdminServerTest, TokenIsRequiredOnEveryPathWhenSet) {
  AdminOptions options;
  options.token = "0123456789abcdef-token";
  auto server = Start("127.0.0.1:0", options);
  ASSERT_NE(server, nullptr);
  for (const char* path : {"/metrics", "/healthz", "/readyz", "/version", "/nope"}) {
    EXPECT_EQ(Fetch(*server, path).status, 401u) << path;
    EXPECT_EQ(Fetch(*server, path, kj::HttpMethod::GET, "Bearer 0123456789abcdef-tokeN").status, 401u) << path;
    EXPECT_EQ(Fetch(*server, path, kj::HttpMethod::GET, "0123456789abcdef-token").status, 401u) << path;
  }
  EXPECT_EQ(Fetch(*server, "/healthz", kj::HttpMethod::GET, "Bearer 0123456789abcdef-token").status, 200u);
  EXPECT_EQ(Fetch(*server, "/readyz", kj::HttpMethod::GET, "Bearer 0123456789abcdef-token").status, 503u);
}

TEST_F(AdminServerTest, ConnectionsOverTheCapAreClosedAndCounted) {
  metrics::Counter refused;
  AdminOptions options;
  options.max_connections = 2;
  options.refused_connections = &refused;
  std::vector<std::string> warnings;
  options.warn = [&warnings](const std::string& line) { warnings.push_back(line); };
  auto server = Start("127.0.0.1:0", options);
  ASSERT_NE(server, nullptr);
  kj::Own<kj::NetworkAddress> address =
      network_.parseAddress("127.0.0.1", server->port()).wait(io_->waitScope);
  auto held1 = address->connect().wait(io_->waitScope);
  auto held2 = address->connect().wait(io_->waitScope);
  auto over = address->connect().wait(io_->waitScope);
  char byte = 0;
  // The third is closed by the server: its read ends (EOF) instead of waiting.
  EXPECT_EQ(over->tryRead(&byte, 1, 1).wait(io_->waitScope), 0u);
  EXPECT_EQ(refused.Value(), 1.0);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr("admin.max_connections (2) reached"));
  held1 = nullptr;
  held2 = nullptr;
  // Places free again once the held connections close.
  bool served = false;
  for (int i = 0; i < 100 && !served; ++i) {
    timer_.afterDelay(10 * kj::MILLISECONDS).wait(io_->waitScope);
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&] { served = Fetch(*server, "/healthz").status == 200u; })) {
      (void)e;  // refused while the server had not yet seen the held ones close
    }
  }
  EXPECT_TRUE(served);
}

TEST_F(AdminServerTest, BadAddressIsInvalidArgumentNamingIt) {
  AdminOptions options;
  options.listen_address = "no-such-host.invalid:abc";
  absl::StatusOr<std::unique_ptr<AdminServer>> server =
      AdminServer::Listen(network_, timer_, options, Content()).wait(io_->waitScope);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(server.status().message()), HasSubstr("'no-such-host.invalid:abc'"));
}

TEST_F(AdminServerTest, PortInUseIsUnavailable) {
  auto first = Start();
  ASSERT_NE(first, nullptr);
  AdminOptions options;
  options.listen_address = "127.0.0.1:" + std::to_string(first->port());
  absl::StatusOr<std::unique_ptr<AdminServer>> second =
      AdminServer::Listen(network_, timer_, options, Content()).wait(io_->waitScope);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr(options.listen_address));
}

}  // namespace
}  // namespace refit::admin
