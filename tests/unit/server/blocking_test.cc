// BlockingThreads: functions run off the event loop on kept threads, promises resolve on the loop,
// a dropped promise cancels and waits, and calls at once each get a thread.
#include "server/blocking.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kj/async-io.h"

namespace refit::server {
namespace {

TEST(BlockingThreadsTest, RunsOffTheLoopAndResolvesOnItOnceTheFunctionReturned) {
  auto io = kj::setupAsyncIo();
  BlockingThreads blocking(*io.lowLevelProvider);
  std::thread::id ran_on;
  std::atomic<bool> returned{false};
  blocking.Run([&] {
    ran_on = std::this_thread::get_id();
    returned = true;
  }).wait(io.waitScope);
  EXPECT_TRUE(returned.load());
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

TEST(BlockingThreadsTest, KeepsItsThreadForTheNextCall) {
  auto io = kj::setupAsyncIo();
  BlockingThreads blocking(*io.lowLevelProvider);
  // Thread-local: a thread started for the second call would not have seen the first (a thread id
  // may be reused by the next thread started).
  static thread_local bool ran_here = false;
  bool second_on_the_first_thread = false;
  blocking.Run([] { ran_here = true; }).wait(io.waitScope);
  blocking.Run([&] { second_on_the_first_thread = ran_here; }).wait(io.waitScope);
  EXPECT_TRUE(second_on_the_first_thread);
  EXPECT_EQ(blocking.threads(), 1u);
}

TEST(BlockingThreadsTest, CallsInFlightAtOnceRunOnThreadsOfTheirOwn) {
  auto io = kj::setupAsyncIo();
  BlockingThreads blocking(*io.lowLevelProvider);
  // The first waits for the second: on one thread the first would wait out its timeout.
  absl::Notification second_ran;
  bool first_saw_second = false;
  auto first = blocking.Run([&] { first_saw_second = second_ran.WaitForNotificationWithTimeout(absl::Seconds(30)); });
  auto second = blocking.Run([&] { second_ran.Notify(); });
  first.wait(io.waitScope);
  second.wait(io.waitScope);
  EXPECT_TRUE(first_saw_second);
  EXPECT_EQ(blocking.threads(), 2u);
  // Both threads are idle again: the next call starts none.
  blocking.Run([] {}).wait(io.waitScope);
  EXPECT_EQ(blocking.threads(), 2u);
}

TEST(BlockingThreadsTest, DroppingThePromiseCancelsThenWaitsForTheFunction) {
  auto io = kj::setupAsyncIo();
  BlockingThreads blocking(*io.lowLevelProvider);
  absl::Notification started, cancelled;
  std::atomic<bool> returned{false};
  auto promise = blocking.Run(
      [&] {
        started.Notify();
        cancelled.WaitForNotification();
        absl::SleepFor(absl::Milliseconds(20));  // still running when the cancel returned
        returned = true;
      },
      [&] { cancelled.Notify(); });
  started.WaitForNotification();
  promise = nullptr;  // cancels, and returns only once the function did
  EXPECT_TRUE(cancelled.HasBeenNotified());
  EXPECT_TRUE(returned.load());
}

TEST(BlockingThreadsTest, NoCancelForAFunctionThatReturnedBeforeItsPromiseWasDropped) {
  auto io = kj::setupAsyncIo();
  BlockingThreads blocking(*io.lowLevelProvider);
  absl::Notification returned;
  std::atomic<int> cancels{0};
  auto promise = blocking.Run([&] { returned.Notify(); }, [&] { ++cancels; });
  returned.WaitForNotification();
  absl::SleepFor(absl::Milliseconds(20));  // the thread is past the function
  promise = nullptr;
  EXPECT_EQ(cancels.load(), 0);
}

TEST(BlockingThreadsTest, TheDestructorJoinsOnceTheFunctionsInFlightReturned) {
  auto io = kj::setupAsyncIo();
  std::atomic<int> ran{0};
  kj::Promise<void> a = nullptr, b = nullptr;
  {
    BlockingThreads blocking(*io.lowLevelProvider);
    a = blocking.Run([&] {
      absl::SleepFor(absl::Milliseconds(20));
      ++ran;
    });
    b = blocking.Run([&] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 2);
  // Their promises still resolve on the loop.
  a.wait(io.waitScope);
  b.wait(io.waitScope);
}

}  // namespace
}  // namespace refit::server
