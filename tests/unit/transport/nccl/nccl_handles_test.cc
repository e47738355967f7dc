// The NCCL data plane's host-side pieces, which run without a GPU: endpoint strings, the
// rendezvous socket's doorbell and liveness checks, and the refusals of Listen/Connect where no
// usable CUDA device or receiver exists. The GPU paths are covered by the conformance suite's
// "nccl" configuration and tests/integration/gpu/test_nccl_path.py (2 GPUs).
#include "transport/nccl/nccl_handles.h"

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/nccl/nccl_receiver.h"
#include "transport/nccl/nccl_sender.h"

namespace refit::transport::nccl {
namespace {

using ::testing::HasSubstr;

TEST(NcclEndpointTest, FormatsAndParses) {
  std::string host;
  uint16_t port = 0;
  ASSERT_TRUE(ParseEndpoint(FormatEndpoint("10.0.0.7", 41234), host, port).ok());
  EXPECT_EQ(host, "10.0.0.7");
  EXPECT_EQ(port, 41234);
  for (const char* bad : {"ucx:127.0.0.1:1", "nccl:", "nccl::5", "nccl:host", "nccl:host:0", "nccl:host:70000",
                          "nccl:host:12x"}) {
    absl::Status st = ParseEndpoint(bad, host, port);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(st.message(), HasSubstr(bad));
  }
}

class SocketPairTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0); }
  void TearDown() override {
    for (int fd : fds_) {
      if (fd >= 0) close(fd);
    }
  }
  void CloseWriter() {
    close(fds_[1]);
    fds_[1] = -1;
  }
  int fds_[2] = {-1, -1};
};

TEST_F(SocketPairTest, FramesArriveOneAtATimeEvenWhenSplit) {
  Frame a, b;
  a.tag = 7;
  a.bytes = 1000;
  b.tag = 8;
  b.flags = Frame::kGoodbye;
  std::string wire(reinterpret_cast<const char*>(&a), sizeof(a));
  wire.append(reinterpret_cast<const char*>(&b), sizeof(b));
  // The first frame and half of the second now, the rest a moment later.
  ASSERT_TRUE(WriteAll(fds_[1], wire.data(), sizeof(a) + 10).ok());
  std::thread rest([&] {
    absl::SleepFor(absl::Milliseconds(50));
    (void)WriteAll(fds_[1], wire.data() + sizeof(a) + 10, sizeof(b) - 10);
  });
  auto never = [] { return false; };
  Frame got;
  ASSERT_TRUE(AwaitFrame(fds_[0], "peer", never, got).ok());
  EXPECT_EQ(got.tag, 7u);
  EXPECT_EQ(got.bytes, 1000u);
  ASSERT_TRUE(AwaitFrame(fds_[0], "peer", never, got).ok());
  rest.join();
  EXPECT_EQ(got.tag, 8u);
  EXPECT_EQ(got.flags, Frame::kGoodbye);
  // Nothing pending is not a failure of the connection.
  EXPECT_TRUE(CheckIdle(fds_[0], "peer").ok());
}

TEST_F(SocketPairTest, ClosedConnectionIsAFailureNamingThePeer) {
  EXPECT_TRUE(CheckIdle(fds_[0], "host:42").ok());
  CloseWriter();
  absl::Status idle = CheckIdle(fds_[0], "host:42");
  EXPECT_EQ(idle.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(idle.message(), HasSubstr("host:42"));
  Frame f;
  absl::Status st = AwaitFrame(fds_[0], "host:42", [] { return false; }, f);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(st.message(), HasSubstr("closed without goodbye"));
}

TEST_F(SocketPairTest, PeerDyingMidFrameIsAFailure) {
  Frame a;
  ASSERT_TRUE(WriteAll(fds_[1], &a, 12).ok());
  CloseWriter();
  Frame f;
  absl::Status st = AwaitFrame(fds_[0], "peer", [] { return false; }, f);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(st.message(), HasSubstr("mid-frame"));
}

TEST_F(SocketPairTest, BytesThatAreNotAFrameAreRefused) {
  std::string junk(sizeof(Frame), 'X');
  ASSERT_TRUE(WriteAll(fds_[1], junk.data(), junk.size()).ok());
  Frame f;
  absl::Status st = AwaitFrame(fds_[0], "peer", [] { return false; }, f);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(st.message(), HasSubstr("not a frame"));
}

TEST_F(SocketPairTest, WaitingForAFrameStopsOnRequest) {
  std::atomic<bool> stop{false};
  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(150));
    stop = true;
  });
  absl::Time start = absl::Now();
  Frame f;
  absl::Status st = AwaitFrame(fds_[0], "peer", [&] { return stop.load(); }, f);
  stopper.join();
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST(NcclRendezvousTest, ReadAllTimesOutAndListenConnectRoundTrip) {
  uint16_t port = 0;
  absl::StatusOr<UniqueFd> listener = ListenTcp("127.0.0.1", 0, port);
  ASSERT_TRUE(listener.ok()) << listener.status();
  ASSERT_NE(port, 0);
  absl::StatusOr<UniqueFd> client = ConnectTcp("127.0.0.1", port);
  ASSERT_TRUE(client.ok()) << client.status();
  UniqueFd owned_server(accept(listener->get(), nullptr, nullptr));
  const int server = owned_server.get();
  ASSERT_GE(server, 0);
  char buf[4];
  absl::Status st = ReadAll(server, buf, sizeof(buf), absl::Now() + absl::Milliseconds(100));
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(WriteAll(client->get(), "ping", 4).ok());
  ASSERT_TRUE(ReadAll(server, buf, 4, absl::Now() + absl::Seconds(5)).ok());
  EXPECT_EQ(std::string(buf, 4), "ping");
  owned_server.reset();
  client->reset();
  listener->reset();
  absl::StatusOr<UniqueFd> refused = ConnectTcp("127.0.0.1", port);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(ListenTcp("not-an-address", 0, port).ok());
}

TEST(NcclVersionTest, VersionCodesReadAsNcclPrintsThem) {
  EXPECT_EQ(NcclVersionText(22809), "2.28.9");
  EXPECT_EQ(NcclVersionText(21903), "2.19.3");
  EXPECT_EQ(NcclVersionText(2804), "2.8.4");  // the old encoding, before 2.9
  EXPECT_GE(LoadedNcclVersion(), 20900);
  EXPECT_THAT(LoadedNcclLibrary(), HasSubstr("libnccl"));
}

TEST_F(SocketPairTest, ReceiverAnswersItsVersionAndTakesASenderOfTheSame) {
  ASSERT_TRUE(AnswerNcclVersion(fds_[0], LoadedNcclVersion()).ok());
  EXPECT_TRUE(AwaitNcclVersion(fds_[1], "refitd at nccl:h:1", absl::Now() + absl::Seconds(5)).ok());
}

TEST_F(SocketPairTest, AMismatchedNcclIsRefusedOnBothSidesWithBothVersionsNamed) {
  const int32_t mine = LoadedNcclVersion();
  const int32_t other = mine == 22803 ? 22809 : 22803;
  // The receiver still answers (the sender learns why) and refuses.
  absl::Status rx = AnswerNcclVersion(fds_[0], other);
  EXPECT_EQ(rx.code(), absl::StatusCode::kFailedPrecondition) << rx;
  EXPECT_THAT(rx.message(), HasSubstr(NcclVersionText(other)));
  // The sender reads a receiver of another version: the error names both and this side's library.
  const int32_t theirs = other;
  ASSERT_TRUE(WriteAll(fds_[0], &theirs, sizeof(theirs)).ok());
  int32_t answered = 0;
  ASSERT_TRUE(ReadAll(fds_[1], &answered, sizeof(answered), absl::Now() + absl::Seconds(5)).ok());
  EXPECT_EQ(answered, mine);
  absl::Status tx = AwaitNcclVersion(fds_[1], "refitd at nccl:h:1", absl::Now() + absl::Seconds(5));
  EXPECT_EQ(tx.code(), absl::StatusCode::kFailedPrecondition) << tx;
  EXPECT_THAT(tx.message(), HasSubstr("refitd at nccl:h:1"));
  EXPECT_THAT(tx.message(), HasSubstr(NcclVersionText(mine)));
  EXPECT_THAT(tx.message(), HasSubstr(NcclVersionText(other)));
  EXPECT_THAT(tx.message(), HasSubstr(LoadedNcclLibrary()));
}

TEST_F(SocketPairTest, ASilentReceiverIsNotAVersionMismatch) {
  close(fds_[0]);  // the receiver's end
  fds_[0] = -1;
  absl::Status st = AwaitNcclVersion(fds_[1], "refitd at nccl:h:1", absl::Now() + absl::Seconds(5));
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
}

TEST(NcclReceiverTest, ListenRefusesADeviceThatDoesNotExist) {
  NcclOptions options;
  options.device = 4096;
  absl::StatusOr<std::unique_ptr<NcclReceiver>> r = NcclReceiver::Listen(options);
  ASSERT_FALSE(r.ok());  // no such device, or no usable CUDA at all (CI)
  EXPECT_TRUE(r.status().code() == absl::StatusCode::kInvalidArgument ||
              r.status().code() == absl::StatusCode::kUnavailable)
      << r.status();
}

TEST(NcclSenderTest, ConnectRefusesAMalformedEndpoint) {
  absl::StatusOr<std::unique_ptr<NcclSender>> s = NcclSender::Connect("ucx:127.0.0.1:9", {});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
}

}  // namespace
}  // namespace refit::transport::nccl
