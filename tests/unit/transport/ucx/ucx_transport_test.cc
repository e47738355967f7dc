// UCX-specific behaviour beyond the transport conformance suite: endpoint strings, option
// validation, which lanes each configuration really uses, and how a failed peer is named.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/ucx/ucx_address.h"
#include "transport/ucx/ucx_handles.h"
#include "transport/ucx/ucx_receiver.h"
#include "transport/ucx/ucx_sender.h"
#include "../transport_test_support.h"
#include "../ucx_leak_watch.h"

extern char** environ;

namespace refit::transport {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;

class UcxTransportTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { testing::WatchUcxLeaks(); }
  // Each test's receivers and senders are gone by now: nothing of theirs may be left in use.
  void TearDown() override { EXPECT_THAT(testing::TakeUcxLeakReports(), ::testing::IsEmpty()); }
};

TEST_F(UcxTransportTest, EndpointRoundTrips) {
  std::string text = ucx::FormatEndpoint({"10.1.2.3", 40123});
  EXPECT_EQ(text, "ucx:10.1.2.3:40123");
  absl::StatusOr<ucx::HostPort> parsed = ucx::ParseEndpoint(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->host, "10.1.2.3");
  EXPECT_EQ(parsed->port, 40123);
}

TEST_F(UcxTransportTest, MalformedEndpointsAreRejectedByName) {
  for (const char* bad : {"", "tcp:1.2.3.4:5", "ucx:", "ucx:1.2.3.4", "ucx::80", "ucx:host:0",
                          "ucx:host:65536", "ucx:host:12x", "ucx:host:-1"}) {
    absl::StatusOr<ucx::HostPort> parsed = ucx::ParseEndpoint(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(parsed.status().message(), HasSubstr(absl::StrCat("\"", bad, "\""))) << bad;
  }
  absl::StatusOr<std::unique_ptr<UcxSender>> sender = UcxSender::Connect("ucx:nope", {});
  EXPECT_EQ(sender.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(UcxTransportTest, ReceiverAdvertisesItsHostAndTheChosenPort) {
  absl::StatusOr<std::unique_ptr<UcxReceiver>> receiver = UcxReceiver::Listen({});
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  absl::StatusOr<ucx::HostPort> parsed = ucx::ParseEndpoint((*receiver)->Endpoint());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->host, "127.0.0.1");
  EXPECT_NE(parsed->port, 0);
}

TEST_F(UcxTransportTest, BadOptionsAreInvalidArguments) {
  UcxOptions no_tls;
  no_tls.tls = "";
  EXPECT_EQ(UcxReceiver::Listen(no_tls).status().code(), absl::StatusCode::kInvalidArgument);

  UcxOptions bad_key;
  bad_key.extra_config = {{"NO_SUCH_UCX_SETTING", "1"}};
  absl::Status st = UcxReceiver::Listen(bad_key).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(st.message(), HasSubstr("NO_SUCH_UCX_SETTING"));

  UcxOptions good_key;
  good_key.extra_config = {{"RNDV_THRESH", "64K"}};
  EXPECT_TRUE(UcxReceiver::Listen(good_key).ok());

  UcxOptions bad_host;
  bad_host.listen_host = "no-such-host.invalid";
  EXPECT_EQ(UcxReceiver::Listen(bad_host).status().code(), absl::StatusCode::kInvalidArgument);
}

// Connects with `options`, pushes one message through, and returns the sender's lanes.
std::string LanesOf(const UcxOptions& options) {
  absl::StatusOr<std::unique_ptr<UcxReceiver>> receiver = UcxReceiver::Listen(options);
  EXPECT_TRUE(receiver.ok()) << receiver.status();
  if (!receiver.ok()) return "";
  absl::StatusOr<std::unique_ptr<UcxSender>> sender =
      UcxSender::Connect((*receiver)->Endpoint(), options);
  EXPECT_TRUE(sender.ok()) << sender.status();
  if (!sender.ok()) return "";
  char byte = 42;
  EXPECT_TRUE((*sender)->Send(1, &byte, 1).ok());
  char got = 0;
  EXPECT_TRUE((*receiver)->Receive(1, &got, 1, absl::Now() + absl::Seconds(30)).ok());
  EXPECT_EQ(got, 42);
  return (*sender)->DescribeLanes();
}

TEST_F(UcxTransportTest, TcpOnlyMovesDataOverTcp) {
  UcxOptions options;
  options.tls = "tcp";
  std::string lanes = LanesOf(options);
  EXPECT_THAT(lanes, AllOf(HasSubstr("tcp/"), Not(HasSubstr("sysv/")), Not(HasSubstr("posix/")),
                           Not(HasSubstr("cma/"))));
}

TEST_F(UcxTransportTest, SharedMemoryMovesDataOverSharedMemory) {
  UcxOptions options;
  options.tls = "sm,self,tcp";
  options.error_mode = UcxErrorMode::kConnectionManager;
  std::string lanes = LanesOf(options);
  // Messages over sysv or posix FIFOs, rendezvous through cma; tcp is left for connecting.
  EXPECT_THAT(lanes, AnyOf(HasSubstr("sysv/"), HasSubstr("posix/"))) << lanes;
  EXPECT_THAT(lanes, HasSubstr("cma/")) << lanes;
  EXPECT_THAT(lanes, Not(HasSubstr("tcp/"))) << lanes;
}

TEST_F(UcxTransportTest, DeadPeerIsNamedInTheError) {
  absl::StatusOr<std::unique_ptr<UcxReceiver>> receiver = UcxReceiver::Listen({});
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  std::vector<std::string> args = {testing::TestSenderPath(), "ucx_tcp", (*receiver)->Endpoint(),
                                   "5", "1048576", "0"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t child = 0;
  ASSERT_EQ(posix_spawn(&child, argv[0], nullptr, nullptr, argv.data(), environ), 0);
  std::vector<char> buffer(1 << 20);
  ASSERT_TRUE((*receiver)->Receive(5, buffer.data(), buffer.size(), absl::Now() + absl::Seconds(30)).ok());
  ASSERT_EQ(kill(child, SIGKILL), 0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  absl::Status failure;
  for (int i = 0; i < 100 && failure.ok(); ++i) {
    failure = (*receiver)->Receive(5, buffer.data(), buffer.size(),
                                   absl::Now() + absl::Seconds(30)).status();
  }
  EXPECT_EQ(failure.code(), absl::StatusCode::kUnavailable) << failure;
  // The default peer name is "<hostname>:<pid>".
  EXPECT_THAT(failure.message(), HasSubstr(absl::StrCat(":", child))) << failure;
}

}  // namespace
}  // namespace refit::transport
