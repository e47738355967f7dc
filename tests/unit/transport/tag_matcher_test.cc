// TagMatcher (tag_matcher.h): the tag matching of the NCCL and CUDA IPC receivers, driven as they
// drive it (a sender thread per message: Arrive, move the bytes, Complete), host memory only.
#include "transport/tag_matcher.h"

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace refit::transport {
namespace {

using ::testing::HasSubstr;

absl::Status HostCopy(void* dst, const void* src, uint64_t bytes) {
  std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

bool Alive() { return true; }

std::vector<uint8_t> Bytes(uint64_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i);
  return v;
}

// What a receiver's peer thread does with one message: find its place, move it, report it.
TagMatcher::Arrival Deliver(TagMatcher& m, TagMatcher::Sender& s, uint64_t tag, const std::vector<uint8_t>& payload,
                            absl::Status status = absl::OkStatus()) {
  TagMatcher::Arrival a = m.Arrive(s, tag, payload.size(), Alive);
  std::vector<uint8_t> host;
  if (status.ok() && a.kind == TagMatcher::Arrival::kPost && !a.oversized) {
    std::memcpy(a.dst, payload.data(), payload.size());
  } else if (status.ok() && a.kind == TagMatcher::Arrival::kHold) {
    host = payload;
  }
  if (a.kind != TagMatcher::Arrival::kStop) m.Complete(a, status, std::move(host));
  return a;
}

TagMatcher::Options Small(bool abort_stalled = false) {
  TagMatcher::Options o;
  o.eager_bytes = 64;
  o.eager_limit_bytes = 128;
  o.abort_stalled = abort_stalled;
  return o;
}

TEST(TagMatcherTest, PostedReceiveGetsTheMessageInItsBuffer) {
  TagMatcher m(Small());
  TagMatcher::Sender s;
  const std::vector<uint8_t> payload = Bytes(1000, 7);  // too large to hold: goes only to a post
  std::vector<uint8_t> dst(2000);
  absl::StatusOr<uint64_t> got;
  std::thread receiver([&] { got = m.Receive(5, dst.data(), dst.size(), absl::Now() + absl::Seconds(10), HostCopy); });
  TagMatcher::Arrival a = Deliver(m, s, 5, payload);
  receiver.join();
  EXPECT_EQ(a.kind, TagMatcher::Arrival::kPost);
  EXPECT_EQ(a.dst, dst.data());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, payload.size());
  EXPECT_TRUE(std::equal(payload.begin(), payload.end(), dst.begin()));
}

// Receiver::ReceiveOrLend: a lendable post takes the bytes the receiver lends (its buffer stays
// untouched); a held message is copied into it as before, with no loan.
TEST(TagMatcherTest, ALendablePostTakesTheLoanAndAHeldMessageIsCopied) {
  TagMatcher m(Small());
  TagMatcher::Sender s;
  const std::vector<uint8_t> payload = Bytes(1000, 3);
  std::vector<uint8_t> dst(1000, 0);
  absl::StatusOr<uint64_t> got;
  TagMatcher::Loan loan{&dst, 99};  // overwritten by Receive
  std::thread receiver([&] {
    got = m.Receive(4, dst.data(), dst.size(), absl::Now() + absl::Seconds(10), HostCopy, &loan);
  });
  TagMatcher::Arrival a = m.Arrive(s, 4, payload.size(), Alive);
  ASSERT_EQ(a.kind, TagMatcher::Arrival::kPost);
  EXPECT_TRUE(a.lendable);
  m.Complete(a, absl::OkStatus(), {}, TagMatcher::Loan{payload.data(), 17});
  receiver.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, payload.size());
  EXPECT_EQ(loan.data, payload.data());
  EXPECT_EQ(loan.id, 17u);
  EXPECT_EQ(dst, std::vector<uint8_t>(1000, 0));  // nothing moved into the buffer

  // A small message that came first is held, and copied into the lendable post's buffer.
  EXPECT_EQ(Deliver(m, s, 6, Bytes(40, 8)).kind, TagMatcher::Arrival::kHold);
  loan = {&dst, 99};
  got = m.Receive(6, dst.data(), dst.size(), absl::Now() + absl::Seconds(1), HostCopy, &loan);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, 40u);
  EXPECT_EQ(loan.id, 0u);
  EXPECT_EQ(loan.data, nullptr);
  EXPECT_EQ(dst[0], 8);

  // A plain Receive is never lendable.
  std::thread plain([&] { got = m.Receive(8, dst.data(), dst.size(), absl::Now() + absl::Seconds(10), HostCopy); });
  TagMatcher::Arrival b = Deliver(m, s, 8, payload);
  plain.join();
  EXPECT_EQ(b.kind, TagMatcher::Arrival::kPost);
  EXPECT_FALSE(b.lendable);
  ASSERT_TRUE(got.ok()) << got.status();
}

TEST(TagMatcherTest, EarlySmallMessagesAreHeldInOrderAndCounted) {
  TagMatcher m(Small());
  TagMatcher::Sender s;
  EXPECT_EQ(Deliver(m, s, 9, Bytes(40, 1)).kind, TagMatcher::Arrival::kHold);
  EXPECT_EQ(Deliver(m, s, 9, Bytes(30, 2)).kind, TagMatcher::Arrival::kHold);
  EXPECT_EQ(m.held_bytes(), 70u);
  std::vector<uint8_t> dst(64);
  absl::StatusOr<uint64_t> first = m.Receive(9, dst.data(), dst.size(), absl::Now() + absl::Seconds(1), HostCopy);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, 40u);
  EXPECT_EQ(dst[0], 1);
  absl::StatusOr<uint64_t> second = m.Receive(9, dst.data(), dst.size(), absl::Now() + absl::Seconds(1), HostCopy);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, 30u);
  EXPECT_EQ(dst[0], 2);
  EXPECT_EQ(m.held_bytes(), 0u);
}

TEST(TagMatcherTest, LargeEarlyMessageWaitsForItsReceive) {
  TagMatcher m(Small());
  TagMatcher::Sender s;
  const std::vector<uint8_t> payload = Bytes(500, 3);
  TagMatcher::Arrival a;
  std::thread sender([&] { a = Deliver(m, s, 4, payload); });
  absl::SleepFor(absl::Milliseconds(100));  // the sender is blocked: nothing to put it in
  std::vector<uint8_t> dst(500);
  absl::StatusOr<uint64_t> got = m.Receive(4, dst.data(), dst.size(), absl::Now() + absl::Seconds(10), HostCopy);
  sender.join();
  EXPECT_EQ(a.kind, TagMatcher::Arrival::kPost);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(dst, payload);
}

TEST(TagMatcherTest, HeldBytesBeyondTheLimitWaitLikeLargeOnes) {
  TagMatcher m(Small());
  TagMatcher::Sender s;
  EXPECT_EQ(Deliver(m, s, 1, Bytes(64, 0)).kind, TagMatcher::Arrival::kHold);
  EXPECT_EQ(Deliver(m, s, 2, Bytes(64, 0)).kind, TagMatcher::Arrival::kHold);
  TagMatcher::Arrival third;
  std::thread sender([&] { third = Deliver(m, s, 3, Bytes(10, 0)); });  // 128 bytes held: no room
  absl::SleepFor(absl::Milliseconds(100));
  std::vector<uint8_t> dst(64);
  ASSERT_TRUE(m.Receive(1, dst.data(), dst.size(), absl::Now() + absl::Seconds(1), HostCopy).ok());
  sender.join();  // room again: held
  EXPECT_EQ(third.kind, TagMatcher::Arrival::kHold);
  EXPECT_EQ(m.held_bytes(), 74u);
}

TEST(TagMatcherTest, OversizedMessageFailsItsReceiveBothWays) {
  TagMatcher m(Small());
  TagMatcher::Sender s;
  std::vector<uint8_t> dst(16);
  // Posted first: the arrival is marked oversized and nothing is moved.
  absl::StatusOr<uint64_t> got;
  std::thread receiver([&] { got = m.Receive(6, dst.data(), dst.size(), absl::Now() + absl::Seconds(10), HostCopy); });
  TagMatcher::Arrival a = Deliver(m, s, 6, Bytes(200, 0));
  receiver.join();
  EXPECT_TRUE(a.oversized);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), HasSubstr("message of 200 bytes on tag 6 exceeds the receive buffer of 16 bytes"));
  // Held first.
  EXPECT_EQ(Deliver(m, s, 8, Bytes(40, 0)).kind, TagMatcher::Arrival::kHold);
  got = m.Receive(8, dst.data(), dst.size(), absl::Now() + absl::Seconds(1), HostCopy);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(got.status().message(), HasSubstr("message of 40 bytes on tag 8 exceeds the receive buffer of 16"));
  EXPECT_EQ(m.held_bytes(), 0u);
}

TEST(TagMatcherTest, DeadlineWithoutAMessage) {
  TagMatcher m(Small());
  std::vector<uint8_t> dst(16);
  const absl::Time start = absl::Now();
  absl::StatusOr<uint64_t> got = m.Receive(3, dst.data(), dst.size(), start + absl::Milliseconds(100), HostCopy);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(got.status().message(), HasSubstr("no message on tag 3 before the deadline"));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(90));
  // A message that comes later waits for the next Receive.
  TagMatcher::Sender s;
  EXPECT_EQ(Deliver(m, s, 3, Bytes(8, 5)).kind, TagMatcher::Arrival::kHold);
  EXPECT_TRUE(m.Receive(3, dst.data(), dst.size(), absl::Now(), HostCopy).ok());
}

TEST(TagMatcherTest, StalledTransferIsAbortedPastTheDeadlineWhenAsked) {
  TagMatcher m(Small(/*abort_stalled=*/true));
  TagMatcher::Sender s;
  std::vector<uint8_t> dst(1000);
  absl::StatusOr<uint64_t> got;
  std::thread receiver(
      [&] { got = m.Receive(2, dst.data(), dst.size(), absl::Now() + absl::Milliseconds(200), HostCopy); });
  TagMatcher::Arrival a = m.Arrive(s, 2, 1000, Alive);  // claimed; the transfer then stalls
  ASSERT_EQ(a.kind, TagMatcher::Arrival::kPost);
  while (!s.abort_requested) absl::SleepFor(absl::Milliseconds(5));
  m.Complete(a, absl::UnavailableError("communicator aborted"), {});
  receiver.join();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(got.status().message(), HasSubstr("message on tag 2 still incomplete at the deadline: communicator aborted"));
}

TEST(TagMatcherTest, StalledHeldMessageIsAbortedPastTheDeadlineWhenAsked) {
  TagMatcher m(Small(/*abort_stalled=*/true));
  TagMatcher::Sender s;
  TagMatcher::Arrival a = m.Arrive(s, 2, 10, Alive);
  ASSERT_EQ(a.kind, TagMatcher::Arrival::kHold);
  std::thread stalled([&] {
    while (!s.abort_requested) absl::SleepFor(absl::Milliseconds(5));
    m.Complete(a, absl::UnavailableError("sender stalled"), {});
  });
  std::vector<uint8_t> dst(10);
  absl::StatusOr<uint64_t> got = m.Receive(2, dst.data(), dst.size(), absl::Now() + absl::Milliseconds(100), HostCopy);
  stalled.join();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
}

TEST(TagMatcherTest, WithoutAbortAClaimedTransferIsAwaitedPastTheDeadline) {
  TagMatcher m(Small(/*abort_stalled=*/false));
  TagMatcher::Sender s;
  std::vector<uint8_t> dst(1000);
  absl::StatusOr<uint64_t> got;
  std::thread receiver(
      [&] { got = m.Receive(2, dst.data(), dst.size(), absl::Now() + absl::Milliseconds(100), HostCopy); });
  TagMatcher::Arrival a = m.Arrive(s, 2, 1000, Alive);
  ASSERT_EQ(a.kind, TagMatcher::Arrival::kPost);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(s.abort_requested);
  m.Complete(a, absl::OkStatus(), {});
  receiver.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, 1000u);
}

TEST(TagMatcherTest, PeerFailureFailsEveryReceiveUntilReset) {
  TagMatcher m(Small());
  TagMatcher::Sender idle;    // delivered nothing since the last Reset(): fails alone
  TagMatcher::Sender active;
  std::vector<uint8_t> dst(64);
  m.PeerFailed(idle, absl::UnavailableError("NCCL peer idle failed"));
  EXPECT_EQ(m.Receive(1, dst.data(), dst.size(), absl::Now(), HostCopy).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  // A Receive waiting when the active sender fails returns its failure.
  absl::StatusOr<uint64_t> waiting;
  std::thread receiver([&] { waiting = m.Receive(7, dst.data(), dst.size(), absl::Now() + absl::Seconds(10), HostCopy); });
  ASSERT_EQ(Deliver(m, active, 1, Bytes(8, 0)).kind, TagMatcher::Arrival::kHold);
  m.PeerFailed(active, absl::UnavailableError("CUDA IPC peer x failed: connection closed without goodbye"));
  receiver.join();
  EXPECT_EQ(waiting.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(waiting.status().message(), HasSubstr("CUDA IPC peer x failed"));
  EXPECT_EQ(m.Receive(1, dst.data(), dst.size(), absl::Now(), HostCopy).status().code(),
            absl::StatusCode::kUnavailable);
  // The first failure is kept.
  m.PeerFailed(active, absl::UnavailableError("second"));
  EXPECT_THAT(m.Receive(1, dst.data(), dst.size(), absl::Now(), HostCopy).status().message(), HasSubstr("CUDA IPC"));
  m.Reset();
  EXPECT_TRUE(m.Receive(1, dst.data(), dst.size(), absl::Now(), HostCopy).ok());  // the held message is kept
  // After Reset() the same sender, idle since, fails alone.
  m.PeerFailed(active, absl::UnavailableError("third"));
  EXPECT_EQ(m.Receive(1, dst.data(), dst.size(), absl::Now(), HostCopy).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(TagMatcherTest, CancelEndsReceivesAndDropsWaitingLargeMessages) {
  TagMatcher m(Small());
  TagMatcher::Sender s;
  std::vector<uint8_t> dst(64);
  absl::StatusOr<uint64_t> waiting;
  std::thread receiver([&] { waiting = m.Receive(1, dst.data(), dst.size(), absl::Now() + absl::Seconds(10), HostCopy); });
  TagMatcher::Arrival large;
  std::thread sender([&] { large = Deliver(m, s, 2, Bytes(500, 0)); });  // no Receive for tag 2
  absl::SleepFor(absl::Milliseconds(100));
  m.Cancel();
  receiver.join();
  sender.join();
  EXPECT_EQ(waiting.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(large.kind, TagMatcher::Arrival::kDrop);  // its sender is released
  EXPECT_EQ(m.Receive(1, dst.data(), dst.size(), absl::Now() + absl::Seconds(1), HostCopy).status().code(),
            absl::StatusCode::kCancelled);
  m.Reset();
  EXPECT_EQ(Deliver(m, s, 3, Bytes(8, 0)).kind, TagMatcher::Arrival::kHold);
  EXPECT_TRUE(m.Receive(3, dst.data(), dst.size(), absl::Now(), HostCopy).ok());
}

TEST(TagMatcherTest, ResetAlsoDropsALargeMessageOfTheEndedSession) {
  TagMatcher m(Small());
  TagMatcher::Sender s;
  TagMatcher::Arrival large;
  std::thread sender([&] { large = Deliver(m, s, 2, Bytes(500, 0)); });
  absl::SleepFor(absl::Milliseconds(100));
  m.Reset();
  sender.join();
  EXPECT_EQ(large.kind, TagMatcher::Arrival::kDrop);
}

TEST(TagMatcherTest, DeadSenderAndShutdownStopTheWait) {
  TagMatcher m(Small());
  TagMatcher::Sender s;
  int asked = 0;
  TagMatcher::Arrival a = m.Arrive(s, 2, 500, [&] { return ++asked < 3; });
  EXPECT_EQ(a.kind, TagMatcher::Arrival::kStop);
  EXPECT_EQ(asked, 3);
  TagMatcher::Arrival b;
  std::thread sender([&] { b = m.Arrive(s, 2, 500, Alive); });
  std::vector<uint8_t> dst(8);
  absl::StatusOr<uint64_t> waiting;
  std::thread receiver([&] { waiting = m.Receive(4, dst.data(), dst.size(), absl::Now() + absl::Seconds(10), HostCopy); });
  absl::SleepFor(absl::Milliseconds(50));
  m.Shutdown();
  sender.join();
  receiver.join();
  EXPECT_EQ(b.kind, TagMatcher::Arrival::kStop);
  EXPECT_EQ(waiting.status().code(), absl::StatusCode::kCancelled);
}

// wait_for_sessions (the CUDA IPC receiver): a message of a session not begun yet (a trainer that
// chose its session id and did not wait for the begin's answer) waits across the end of the
// session before and the next one's Reset, and goes into its receive; a message of a session that
// ended, or whose begin was refused (EndSession), is dropped and its sender released; held
// messages of an ended session are freed.
TEST(TagMatcherTest, WithWaitForSessionsAMessageWaitsForItsSessionNotTheCurrentOne) {
  TagMatcher::Options o = Small();
  o.wait_for_sessions = true;
  TagMatcher m(o);
  TagMatcher::Sender s;
  constexpr uint64_t kEnded = 7, kNext = 9;
  const std::vector<uint8_t> payload = Bytes(500, 5);
  // Session kEnded ends (its receives cancelled); kNext's first message comes before kNext begins.
  m.EndSession(kEnded);
  m.Cancel();
  TagMatcher::Arrival early;
  std::thread sender([&] { early = Deliver(m, s, kNext << 32, payload); });
  absl::SleepFor(absl::Milliseconds(60));  // waits (polled every 20 ms): not dropped while cancelled
  m.Reset();                               // kNext begins
  absl::SleepFor(absl::Milliseconds(60));  // nor at the Reset
  std::vector<uint8_t> dst(500);
  absl::StatusOr<uint64_t> got = m.Receive(kNext << 32, dst.data(), dst.size(), absl::Now() + absl::Seconds(10), HostCopy);
  sender.join();
  EXPECT_EQ(early.kind, TagMatcher::Arrival::kPost);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(dst, payload);
  // A message of an ended session is dropped at once; one waiting when its session ends, then.
  EXPECT_EQ(Deliver(m, s, (kEnded << 32) | 1, payload).kind, TagMatcher::Arrival::kDrop);
  TagMatcher::Arrival refused;
  std::thread late([&] { refused = Deliver(m, s, (kNext + 1) << 32, payload); });
  absl::SleepFor(absl::Milliseconds(60));
  m.EndSession(kNext + 1);  // its begin was refused
  late.join();
  EXPECT_EQ(refused.kind, TagMatcher::Arrival::kDrop);
  // Held (small) messages of a session are freed when it ends.
  EXPECT_EQ(Deliver(m, s, kNext << 32 | 2, Bytes(40, 0)).kind, TagMatcher::Arrival::kHold);
  EXPECT_EQ(m.held_bytes(), 40u);
  m.EndSession(kNext);
  EXPECT_EQ(m.held_bytes(), 0u);
  EXPECT_EQ(m.Receive(kNext << 32 | 2, dst.data(), dst.size(), absl::Now(), HostCopy).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace refit::transport
