// UCX-specific behaviour beyond the transport conformance suite: endpoint strings, option
// validation, which lanes each configuration really uses, and how a failed peer is named.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <thread>
#include <utility>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/ucx/ucx_address.h"
#include "transport/ucx/ucx_handles.h"
#include "transport/ucx/ucx_receiver.h"
#include "transport/ucx/ucx_sender.h"
#include "../transport_test_support.h"
#include "../ucx_leak_watch.h"
#include "../ucx_runtime.h"

extern char** environ;

namespace refit::transport {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;

class UcxTransportTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    testing::WatchUcxLeaks();
    std::printf("UCX %s from %s\n", testing::UcxRuntimeVersion().c_str(),
                testing::UcxRuntimeLibrary().c_str());
  }
  void SetUp() override {
    if (std::string why = testing::UcxRuntimeMismatch(); !why.empty()) GTEST_FAIL() << why;
  }
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

// The configurations of the conformance suite, by the names transport_test_sender knows.
std::vector<std::pair<std::string, UcxOptions>> BothConfigurations() {
  UcxOptions tcp;
  tcp.tls = "tcp";
  UcxOptions shm;
  shm.tls = "sm,self,tcp";
  shm.error_mode = UcxErrorMode::kConnectionManager;
  return {{"ucx_tcp", tcp}, {"ucx_shm", shm}};
}

// Starts transport_test_sender streaming `bytes`-byte messages on `tag` with its "sent <i>"
// reports on a pipe; *reports is the pipe's read end. Returns the pid, 0 on failure.
pid_t SpawnReportingSender(const std::string& config, const std::string& endpoint, uint64_t tag,
                           uint64_t bytes, int* reports) {
  int fds[2];
  if (pipe(fds) != 0) return 0;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  std::vector<std::string> args = {testing::TestSenderPath(), config, endpoint, std::to_string(tag),
                                   std::to_string(bytes), "0", "report"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t child = 0;
  int rc = posix_spawn(&child, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return 0;
  }
  *reports = fds[0];
  return child;
}

// Reads up to and including the next newline; false at end of file.
bool ReadLine(int fd, std::string* line) {
  line->clear();
  char c;
  while (read(fd, &c, 1) == 1) {
    if (c == '\n') return true;
    line->push_back(c);
  }
  return false;
}

// The state letter of /proc/<pid>/stat ('R' running, 'S' sleeping in a system call, ...).
char ProcessState(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  size_t paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() ? '?' : text[paren + 2];
}

// A receiver destroyed while a Receive it gave up on is still matched to a message that never
// completes: the sender is stopped (SIGSTOP) after announcing a rendezvous message, so over tcp
// the data never comes. The Receive returns once buffer_release_timeout passed, and the receiver,
// destroyed with that receive still posted in UCX, completes it before its worker and context go
// (no leak reports) and does not hang. Over shared memory the receiver reads the stopped process's
// memory itself (cma), so there the message simply arrives.
TEST_F(UcxTransportTest, ReceiverDestroyedWithAStalledReceive) {
  constexpr uint64_t kTag = 6;
  constexpr uint64_t kBytes = 4 << 20;
  for (auto& [name, base] : BothConfigurations()) {
    SCOPED_TRACE(name);
    UcxOptions options = base;
    options.buffer_release_timeout = absl::Milliseconds(500);
    absl::StatusOr<std::unique_ptr<UcxReceiver>> receiver = UcxReceiver::Listen(options);
    ASSERT_TRUE(receiver.ok()) << receiver.status();
    int reports = -1;
    pid_t child = SpawnReportingSender(name, (*receiver)->Endpoint(), kTag, kBytes, &reports);
    ASSERT_NE(child, 0);
    std::vector<uint8_t> buffer(kBytes);
    ASSERT_TRUE((*receiver)->Receive(kTag, buffer.data(), kBytes, absl::Now() + absl::Seconds(30)).ok());
    std::string line;
    ASSERT_TRUE(ReadLine(reports, &line));
    ASSERT_EQ(line, "sent 0");
    // After "sent 0" the sender fills message 1 (running) and then sleeps in Send waiting for it
    // to be matched, its announcement out. Stop it there.
    absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (ProcessState(child) != 'S' && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
    ASSERT_EQ(ProcessState(child), 'S');
    ASSERT_EQ(kill(child, SIGSTOP), 0);

    absl::StatusOr<uint64_t> got =
        (*receiver)->Receive(kTag, buffer.data(), kBytes, absl::Now() + absl::Milliseconds(300));
    std::printf("%s: the receive from the stopped sender ended with %s\n", name.c_str(),
                got.ok() ? "the message" : got.status().ToString().c_str());
    if (got.ok()) {
      EXPECT_EQ(*got, kBytes);
      EXPECT_EQ(testing::FirstPatternMismatch(1, buffer.data(), kBytes), -1);
    } else {
      EXPECT_THAT(got.status().code(), AnyOf(absl::StatusCode::kUnavailable,
                                             absl::StatusCode::kDeadlineExceeded))
          << got.status();
    }
    absl::Time start = absl::Now();
    receiver->reset();
    EXPECT_LT(absl::Now() - start, absl::Seconds(15));
    kill(child, SIGKILL);
    ASSERT_EQ(waitpid(child, nullptr, 0), child);
    close(reports);
    EXPECT_THAT(testing::TakeUcxLeakReports(), ::testing::IsEmpty());
  }
}

// DisconnectPeers while a sender's large Send waits for a Receive that will not come (an aborted
// session): the Send fails with Unavailable, and the sender, destroyed afterwards, leaves nothing
// of the failed message in use.
TEST_F(UcxTransportTest, DisconnectPeersFailsASendInFlight) {
  for (auto& [name, options] : BothConfigurations()) {
    SCOPED_TRACE(name);
    absl::StatusOr<std::unique_ptr<UcxReceiver>> receiver = UcxReceiver::Listen(options);
    ASSERT_TRUE(receiver.ok()) << receiver.status();
    absl::StatusOr<std::unique_ptr<UcxSender>> sender =
        UcxSender::Connect((*receiver)->Endpoint(), options);
    ASSERT_TRUE(sender.ok()) << sender.status();
    std::vector<uint8_t> data = testing::Pattern(1, 16 << 20);
    absl::Notification sending;
    absl::Status sent;
    std::thread send([&] {
      sending.Notify();
      sent = (*sender)->Send(1, data.data(), data.size());
    });
    sending.WaitForNotification();
    absl::Time start = absl::Now();
    (*receiver)->DisconnectPeers();
    send.join();
    EXPECT_EQ(sent.code(), absl::StatusCode::kUnavailable) << sent;
    EXPECT_LT(absl::Now() - start, absl::Seconds(15));
    sender->reset();
    receiver->reset();
    EXPECT_THAT(testing::TakeUcxLeakReports(), ::testing::IsEmpty());
  }
}

// What refitd's exit does (transport.h CloseForExit): the receiver answers Unavailable, a new
// sender is not served, and destroying the receiver afterwards is harmless. The listener, worker
// and context stay until the process exits (kept reachable: no leak report); so do the worker's
// connections, which the process exit closes (the integration test test_sigterm_while_receiving).
TEST_F(UcxTransportTest, CloseForExitServesNoNewSender) {
  UcxOptions options;
  options.close_timeout = absl::Seconds(1);
  absl::StatusOr<std::unique_ptr<UcxReceiver>> receiver = UcxReceiver::Listen(options);
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  absl::StatusOr<std::unique_ptr<UcxSender>> sender = UcxSender::Connect((*receiver)->Endpoint(), options);
  ASSERT_TRUE(sender.ok()) << sender.status();
  uint8_t byte = 7;
  ASSERT_TRUE((*sender)->Send(1, &byte, 1).ok());
  uint8_t got = 0;
  ASSERT_TRUE((*receiver)->Receive(1, &got, 1, absl::Now() + absl::Seconds(30)).ok());
  EXPECT_EQ(got, 7);

  (*receiver)->CloseForExit();
  absl::StatusOr<uint64_t> after = (*receiver)->Receive(2, &got, 1, absl::Now() + absl::Seconds(30));
  EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable) << after.status();
  EXPECT_THAT(after.status().message(), HasSubstr("closed"));
  (*receiver)->DisconnectPeers();  // nothing left to drop, no worker to wake: a no-op
  UcxOptions quick = options;
  quick.connect_timeout = absl::Seconds(1);
  absl::StatusOr<std::unique_ptr<UcxSender>> late = UcxSender::Connect((*receiver)->Endpoint(), quick);
  EXPECT_FALSE(late.ok());
  receiver->reset();
  absl::Time start = absl::Now();
  sender->reset();  // its receiver never answers: the close gives up after close_timeout
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
}

}  // namespace
}  // namespace refit::transport
