// Conformance suite for transport.h: every transport of BuiltinTransports() (and the further
// configurations in AllTransportConfigs()) must pass the same tests, written only against
// Receiver/Sender. Contents are checked byte for byte
// against a pattern that sender and receiver compute independently.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/builtin_transports.h"
#include "transport/transport.h"
#include "transport_test_support.h"
#include "ucx_leak_watch.h"
#include "ucx_runtime.h"

extern char** environ;

namespace refit::transport::testing {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = 1ull << 20;

absl::Time Soon() { return absl::Now() + absl::Seconds(60); }

// Sends on a background thread; Join() returns the first error.
class SendThread {
 public:
  explicit SendThread(std::function<absl::Status()> body)
      : thread_([this, body = std::move(body)] { status_ = body(); }) {}
  ~SendThread() {
    if (thread_.joinable()) thread_.join();
  }
  absl::Status Join() {
    thread_.join();
    return status_;
  }

 private:
  absl::Status status_;
  std::thread thread_;
};

class TransportConformanceTest : public ::testing::TestWithParam<TransportConfig> {
 protected:
  static void SetUpTestSuite() {
    QuietTransportLogs();
    std::printf("UCX %s from %s\n", UcxRuntimeVersion().c_str(), UcxRuntimeLibrary().c_str());
  }

  void SetUp() override {
    if (std::string why = UcxRuntimeMismatch(); !why.empty()) GTEST_FAIL() << why;
    if (GetParam().unavailable) {
      if (std::string why = GetParam().unavailable(); !why.empty()) GTEST_SKIP() << GetParam().name << ": " << why;
    }
    absl::StatusOr<std::unique_ptr<Receiver>> receiver = GetParam().listen();
    ASSERT_TRUE(receiver.ok()) << receiver.status();
    receiver_ = *std::move(receiver);
  }

  // Every test ends with its receiver and senders gone, so UCX has destroyed their workers and
  // contexts: anything of them still in use by then was leaked (ucx_leak_watch.h).
  void TearDown() override {
    receiver_.reset();
    EXPECT_THAT(TakeUcxLeakReports(), ::testing::IsEmpty());
  }

  std::unique_ptr<Sender> Connect() {
    absl::StatusOr<std::unique_ptr<Sender>> sender = GetParam().connect(receiver_->Endpoint());
    EXPECT_TRUE(sender.ok()) << sender.status();
    return sender.ok() ? *std::move(sender) : nullptr;
  }

  // Receives one message on `tag` into a buffer of `capacity` bytes and checks it is exactly
  // Pattern(seed, bytes).
  void ExpectMessage(uint64_t tag, uint64_t capacity, uint64_t seed, uint64_t bytes) {
    std::vector<uint8_t> buffer(capacity + 1, 0xA5);  // one guard byte past the capacity
    absl::StatusOr<uint64_t> got = receiver_->Receive(tag, buffer.data(), capacity, Soon());
    ASSERT_TRUE(got.ok()) << "tag " << tag << ": " << got.status();
    ASSERT_EQ(*got, bytes) << "tag " << tag;
    EXPECT_EQ(FirstPatternMismatch(seed, buffer.data(), bytes), -1) << "tag " << tag;
    EXPECT_EQ(buffer[capacity], 0xA5) << "tag " << tag << ": wrote past the capacity";
  }

  std::unique_ptr<Receiver> receiver_;
};

absl::Status SendPattern(Sender& sender, uint64_t tag, uint64_t seed, uint64_t bytes) {
  std::vector<uint8_t> data = Pattern(seed, bytes);
  return sender.Send(tag, data.data(), bytes);
}

TEST_P(TransportConformanceTest, EndpointIsNonEmpty) {
  EXPECT_FALSE(receiver_->Endpoint().empty());
}

// The endpoint names its transport: the trainer client picks the transport by it.
TEST_P(TransportConformanceTest, EndpointCarriesItsTransportsScheme) {
  const TransportRegistry transports = BuiltinTransports();
  const TransportDescriptor* d = transports.FindByEndpoint(receiver_->Endpoint());
  ASSERT_NE(d, nullptr) << receiver_->Endpoint() << " matches none of: " << transports.Names();
}

// The session skips the announced checksum exactly when the descriptor says so.
TEST_P(TransportConformanceTest, ReceiverChecksIntegrityAsItsDescriptorSays) {
  EXPECT_EQ(receiver_->ChecksIntegrity(), GetParam().checks_integrity);
}

TEST_P(TransportConformanceTest, TinyMessagesIntoBuffersOfDifferentSizes) {
  std::unique_ptr<Sender> sender = Connect();
  ASSERT_NE(sender, nullptr);
  SendThread send([&]() -> absl::Status {
    for (uint64_t tag : {1, 2, 3, 4}) {
      if (absl::Status st = SendPattern(*sender, tag, tag, tag <= 2 ? 0 : 1); !st.ok()) return st;
    }
    return absl::OkStatus();
  });
  ExpectMessage(1, 0, 1, 0);
  ExpectMessage(2, 4096, 2, 0);
  ExpectMessage(3, 1, 3, 1);
  ExpectMessage(4, 1 * kMiB, 4, 1);
  EXPECT_TRUE(send.Join().ok());
}

TEST_P(TransportConformanceTest, LargeMessage64MiB) {
  std::unique_ptr<Sender> sender = Connect();
  ASSERT_NE(sender, nullptr);
  SendThread send([&] {
    absl::Status st = SendPattern(*sender, 10, 10, 64 * kMiB);
    return st.ok() ? SendPattern(*sender, 11, 11, 64 * kMiB) : st;
  });
  ExpectMessage(10, 64 * kMiB, 10, 64 * kMiB);       // exactly fits
  ExpectMessage(11, 64 * kMiB + 4096, 11, 64 * kMiB);  // buffer larger than the message
  EXPECT_TRUE(send.Join().ok());
}

TEST_P(TransportConformanceTest, DistinctTagsAreMatchedWhateverTheReceiveOrder) {
  std::unique_ptr<Sender> sender = Connect();
  ASSERT_NE(sender, nullptr);
  // Small messages only: Send blocks until a large message is matched, so a large message
  // received out of order would hold back the messages behind it.
  constexpr uint64_t kCount = 16;
  auto size_of = [](uint64_t tag) { return tag * 61 % 1000; };
  SendThread send([&]() -> absl::Status {
    for (uint64_t tag = 0; tag < kCount; ++tag) {
      if (absl::Status st = SendPattern(*sender, 1000 + tag, tag, size_of(tag)); !st.ok()) {
        return st;
      }
    }
    return absl::OkStatus();
  });
  for (uint64_t tag = kCount; tag-- > 0;) ExpectMessage(1000 + tag, 1000, tag, size_of(tag));
  EXPECT_TRUE(send.Join().ok());
}

TEST_P(TransportConformanceTest, SameTagArrivesInSendOrder) {
  std::unique_ptr<Sender> sender = Connect();
  ASSERT_NE(sender, nullptr);
  constexpr uint64_t kCount = 200;
  auto size_of = [](uint64_t i) { return i % 3 == 0 ? 200 * 1024 : 1 + i * 13; };
  SendThread send([&]() -> absl::Status {
    for (uint64_t i = 0; i < kCount; ++i) {
      if (absl::Status st = SendPattern(*sender, 7, i, size_of(i)); !st.ok()) return st;
    }
    return absl::OkStatus();
  });
  for (uint64_t i = 0; i < kCount; ++i) ExpectMessage(7, 256 * 1024, i, size_of(i));
  EXPECT_TRUE(send.Join().ok());
}

TEST_P(TransportConformanceTest, ManyMessagesOnInterleavedTags) {
  std::unique_ptr<Sender> sender = Connect();
  ASSERT_NE(sender, nullptr);
  constexpr uint64_t kPerTag = 1000;
  constexpr uint64_t kTags = 4;
  auto size_of = [](uint64_t seed) { return seed % 97 == 0 ? 100 * 1024 : seed % 2048; };
  SendThread send([&]() -> absl::Status {
    for (uint64_t i = 0; i < kPerTag; ++i) {
      for (uint64_t t = 0; t < kTags; ++t) {
        uint64_t seed = i * kTags + t;
        if (absl::Status st = SendPattern(*sender, 50 + t, seed, size_of(seed)); !st.ok()) {
          return st;
        }
      }
    }
    return absl::OkStatus();
  });
  for (uint64_t i = 0; i < kPerTag; ++i) {
    for (uint64_t t = 0; t < kTags; ++t) {
      uint64_t seed = i * kTags + t;
      ExpectMessage(50 + t, 100 * 1024, seed, size_of(seed));
    }
  }
  EXPECT_TRUE(send.Join().ok());
}

TEST_P(TransportConformanceTest, MessageLargerThanCapacityIsRejectedAndDropped) {
  std::unique_ptr<Sender> sender = Connect();
  ASSERT_NE(sender, nullptr);
  SendThread send([&]() -> absl::Status {
    for (auto [seed, bytes] : {std::pair<uint64_t, uint64_t>{1, 4096}, {2, 16},
                               {3, 8 * kMiB}, {4, 32}}) {
      if (absl::Status st = SendPattern(*sender, 5, seed, bytes); !st.ok()) return st;
    }
    return absl::OkStatus();
  });
  std::vector<uint8_t> small(100);
  absl::StatusOr<uint64_t> got = receiver_->Receive(5, small.data(), small.size(), Soon());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
  ExpectMessage(5, 100, 2, 16);  // the oversized message is gone, the next one follows
  got = receiver_->Receive(5, small.data(), small.size(), Soon());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
  ExpectMessage(5, 100, 4, 32);
  EXPECT_TRUE(send.Join().ok());
}

TEST_P(TransportConformanceTest, DeadlineExceededThenTheMessageStillArrives) {
  std::unique_ptr<Sender> sender = Connect();
  ASSERT_NE(sender, nullptr);
  std::vector<uint8_t> buffer(64);
  absl::Time start = absl::Now();
  absl::StatusOr<uint64_t> got =
      receiver_->Receive(9, buffer.data(), buffer.size(), start + absl::Milliseconds(200));
  absl::Duration waited = absl::Now() - start;
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
  EXPECT_GE(waited, absl::Milliseconds(200));
  EXPECT_LT(waited, absl::Seconds(5));
  // A deadline in the past returns at once.
  got = receiver_->Receive(9, buffer.data(), buffer.size(), absl::InfinitePast());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();

  ASSERT_TRUE(SendPattern(*sender, 9, 99, 64).ok());
  ExpectMessage(9, 64, 99, 64);
}

TEST_P(TransportConformanceTest, CancelFromAnotherThreadUntilReset) {
  std::unique_ptr<Sender> sender = Connect();
  ASSERT_NE(sender, nullptr);
  std::vector<uint8_t> buffer(64);
  absl::Time start = absl::Now();
  // Whether Cancel lands before or during the Receive, the outcome is the same.
  std::thread canceller([&] { receiver_->Cancel(); });
  absl::StatusOr<uint64_t> got = receiver_->Receive(3, buffer.data(), buffer.size(), Soon());
  canceller.join();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kCancelled) << got.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));

  ASSERT_TRUE(SendPattern(*sender, 3, 33, 64).ok());
  got = receiver_->Receive(3, buffer.data(), buffer.size(), Soon());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kCancelled) << "cancel is sticky";

  receiver_->Reset();
  ExpectMessage(3, 64, 33, 64);  // the message sent meanwhile was kept
}

TEST_P(TransportConformanceTest, CancelWakesABlockedReceive) {
  std::vector<uint8_t> buffer(64);
  absl::Notification receiving;
  absl::StatusOr<uint64_t> got;
  std::thread receiver_thread([&] {
    receiving.Notify();
    got = receiver_->Receive(4, buffer.data(), buffer.size(), Soon());
  });
  receiving.WaitForNotification();
  absl::SleepFor(absl::Milliseconds(50));  // most likely blocked by now; either order must work
  absl::Time cancelled_at = absl::Now();
  receiver_->Cancel();
  receiver_thread.join();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kCancelled) << got.status();
  EXPECT_LT(absl::Now() - cancelled_at, absl::Seconds(5));
}

TEST_P(TransportConformanceTest, OrderlyCloseIsNotAFailure) {
  {
    std::unique_ptr<Sender> sender = Connect();
    ASSERT_NE(sender, nullptr);
    ASSERT_TRUE(SendPattern(*sender, 1, 1, 16).ok());
  }
  ExpectMessage(1, 16, 1, 16);
  std::vector<uint8_t> buffer(16);
  absl::StatusOr<uint64_t> got =
      receiver_->Receive(2, buffer.data(), buffer.size(), absl::Now() + absl::Milliseconds(500));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
  std::unique_ptr<Sender> next = Connect();
  ASSERT_NE(next, nullptr);
  SendThread send([&] { return SendPattern(*next, 2, 2, 16); });
  ExpectMessage(2, 16, 2, 16);
  EXPECT_TRUE(send.Join().ok());
}

TEST_P(TransportConformanceTest, TwoSendersAtOnce) {
  std::unique_ptr<Sender> a = Connect();
  std::unique_ptr<Sender> b = Connect();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto body = [](Sender& s, uint64_t tag) {
    return [&s, tag]() -> absl::Status {
      for (uint64_t i = 0; i < 50; ++i) {
        if (absl::Status st = SendPattern(s, tag, tag * 1000 + i, 70 * 1024 + i); !st.ok()) {
          return st;
        }
      }
      return absl::OkStatus();
    };
  };
  SendThread send_a(body(*a, 1));
  SendThread send_b(body(*b, 2));
  for (uint64_t i = 0; i < 50; ++i) {
    ExpectMessage(2, 128 * 1024, 2000 + i, 70 * 1024 + i);
    ExpectMessage(1, 128 * 1024, 1000 + i, 70 * 1024 + i);
  }
  EXPECT_TRUE(send_a.Join().ok());
  EXPECT_TRUE(send_b.Join().ok());
}

TEST_P(TransportConformanceTest, ConnectToAClosedEndpointFails) {
  std::string endpoint = receiver_->Endpoint();
  receiver_.reset();
  absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<Sender>> sender = GetParam().connect(endpoint);
  EXPECT_FALSE(sender.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

TEST_P(TransportConformanceTest, SendFailsOnceTheReceiverIsGone) {
  std::unique_ptr<Sender> sender = Connect();
  ASSERT_NE(sender, nullptr);
  receiver_.reset();
  absl::Time start = absl::Now();
  absl::Status st;
  std::vector<uint8_t> data = Pattern(1, 1 * kMiB);
  for (int i = 0; i < 1000 && st.ok(); ++i) st = sender->Send(1, data.data(), data.size());
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
}

// The sender runs in a child process that is SIGKILLed while it is streaming 1 MiB messages.
// Starts the sender process: `count` messages (0 = until killed) of `bytes` bytes on `tag`,
// message i carrying Pattern(seed = i). Returns its pid, or 0 if it could not be started.
pid_t SpawnSender(const std::string& config, const std::string& endpoint, uint64_t tag, uint64_t bytes,
                  uint64_t count) {
  std::string sender_path = TestSenderPath();
  EXPECT_FALSE(sender_path.empty()) << "transport_test_sender not found beside the test binary";
  if (sender_path.empty()) return 0;
  std::vector<std::string> args = {sender_path, config, endpoint, std::to_string(tag),
                                   std::to_string(bytes), std::to_string(count)};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t child = 0;
  return posix_spawn(&child, argv[0], nullptr, nullptr, argv.data(), environ) == 0 ? child : 0;
}

TEST_P(TransportConformanceTest, PeerDeathIsReportedNotWaitedOn) {
  constexpr uint64_t kTag = 77;
  constexpr uint64_t kBytes = 1 * kMiB;
  pid_t child = SpawnSender(GetParam().name, receiver_->Endpoint(), kTag, kBytes, 0);
  ASSERT_NE(child, 0);

  std::vector<uint8_t> buffer(kBytes);
  uint64_t next_seed = 0;
  for (; next_seed < 3; ++next_seed) {
    absl::StatusOr<uint64_t> got = receiver_->Receive(kTag, buffer.data(), kBytes, Soon());
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(*got, kBytes);
    ASSERT_EQ(FirstPatternMismatch(next_seed, buffer.data(), kBytes), -1);
  }
  ASSERT_EQ(kill(child, SIGKILL), 0);
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFSIGNALED(wstatus));

  // Messages that fully arrived before the kill may still be delivered; then an error must come.
  absl::Time killed_at = absl::Now();
  absl::Status failure;
  for (int i = 0; i < 1000 && failure.ok(); ++i, ++next_seed) {
    absl::StatusOr<uint64_t> got =
        receiver_->Receive(kTag, buffer.data(), kBytes, killed_at + absl::Seconds(60));
    if (!got.ok()) {
      failure = got.status();
      break;
    }
    ASSERT_EQ(*got, kBytes);
    ASSERT_EQ(FirstPatternMismatch(next_seed, buffer.data(), kBytes), -1);
  }
  EXPECT_EQ(failure.code(), absl::StatusCode::kUnavailable) << failure;
  EXPECT_LT(absl::Now() - killed_at, absl::Seconds(15));

  // The failure is sticky until Reset; afterwards the receiver serves a new sender. The new
  // sender is a process, as a restarted trainer is: a second UCX worker in this process could
  // take over the dead connection's file descriptor while the receiver's worker still holds an
  // event for it, which UCX 1.13 aborts on (docs/transports.md, "Known UCX limitation").
  absl::StatusOr<uint64_t> again =
      receiver_->Receive(kTag, buffer.data(), kBytes, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable) << again.status();
  receiver_->Reset();
  pid_t next = SpawnSender(GetParam().name, receiver_->Endpoint(), 78, 4096, 1);
  ASSERT_NE(next, 0);
  ExpectMessage(78, 4096, 0, 4096);
  ASSERT_EQ(waitpid(next, &wstatus, 0), next);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "sender exit status " << wstatus;
}

// A sender killed while a large (rendezvous) message is on its way: the kill lands before,
// during or after that message's transfer, and each must end the same way: the Receive waiting
// for it returns (the whole message, or Unavailable), the receiver fails until Reset, and nothing
// of the dead message stays in use in the transport (TearDown).
TEST_P(TransportConformanceTest, PeerDiesMidLargeMessage) {
  constexpr uint64_t kTag = 79;
  constexpr uint64_t kBytes = 16 * kMiB;
  pid_t child = SpawnSender(GetParam().name, receiver_->Endpoint(), kTag, kBytes, 0);
  ASSERT_NE(child, 0);
  std::vector<uint8_t> buffer(kBytes);
  absl::StatusOr<uint64_t> got = receiver_->Receive(kTag, buffer.data(), kBytes, Soon());
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(FirstPatternMismatch(0, buffer.data(), kBytes), -1);

  // The sender sends back to back, so the next message is on its way by now or soon; the kill
  // races with the Receive that takes it.
  absl::Notification receiving;
  std::thread killer([&] {
    receiving.WaitForNotification();
    kill(child, SIGKILL);
  });
  receiving.Notify();
  absl::Time start = absl::Now();
  absl::Status failure;
  for (uint64_t seed = 1; seed < 100 && failure.ok(); ++seed) {
    got = receiver_->Receive(kTag, buffer.data(), kBytes, start + absl::Seconds(60));
    if (!got.ok()) {
      failure = got.status();
      break;
    }
    ASSERT_EQ(*got, kBytes);
    ASSERT_EQ(FirstPatternMismatch(seed, buffer.data(), kBytes), -1) << "message " << seed;
  }
  killer.join();
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  EXPECT_EQ(failure.code(), absl::StatusCode::kUnavailable) << failure;
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  receiver_->Reset();
}

// The receiver goes away while a large Send waits for it: the Send fails with Unavailable instead
// of waiting for good, and the sender, destroyed afterwards, leaves nothing of the failed message
// in use (TearDown).
TEST_P(TransportConformanceTest, SendInFlightFailsWhenTheReceiverGoes) {
  std::unique_ptr<Sender> sender = Connect();
  ASSERT_NE(sender, nullptr);
  std::vector<uint8_t> data = Pattern(1, 16 * kMiB);
  absl::Notification sending;
  SendThread send([&] {
    sending.Notify();
    return sender->Send(1, data.data(), data.size());
  });
  // No Receive is posted, so the Send cannot finish; it is in flight once it started, or fails at
  // once if the receiver was gone before it started. Either way it must fail.
  sending.WaitForNotification();
  absl::Time start = absl::Now();
  receiver_.reset();
  absl::Status st = send.Join();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  sender.reset();
}

INSTANTIATE_TEST_SUITE_P(AllTransports, TransportConformanceTest,
                         ::testing::ValuesIn(AllTransportConfigs()),
                         [](const ::testing::TestParamInfo<TransportConfig>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace refit::transport::testing
