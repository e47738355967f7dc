// KeptThreads: a function starts on an idle kept thread (or a new one when none is idle), Wait
// returns once it and its `then` returned, and the destructor joins after the functions in flight.
#include "common/kept_threads.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace refit {
namespace {

TEST(KeptThreadsTest, WaitReturnsOnceTheFunctionAndItsThenReturned) {
  KeptThreads threads;
  std::atomic<int> order{0};
  int fn_at = -1, then_at = -1;
  KeptThreads::Run run = threads.Start([&] { fn_at = order++; }, [&] { then_at = order++; });
  run.Wait();
  EXPECT_TRUE(run.Returned());
  EXPECT_EQ(fn_at, 0);
  EXPECT_EQ(then_at, 1);
}

TEST(KeptThreadsTest, AFinishedThreadRunsTheNextFunction) {
  KeptThreads threads;
  // Thread-local: a thread started for the second function would not have seen the first (a
  // thread id may be reused by the next thread started).
  static thread_local bool ran_here = false;
  bool second_on_the_first_thread = false;
  threads.Start([] { ran_here = true; }).Wait();
  threads.Start([&] { second_on_the_first_thread = ran_here; }).Wait();
  EXPECT_TRUE(second_on_the_first_thread);
  EXPECT_EQ(threads.threads(), 1u);
}

TEST(KeptThreadsTest, FunctionsInFlightAtOnceHaveThreadsOfTheirOwn) {
  KeptThreads threads;
  // The first waits for the second: on one thread it would wait out its timeout.
  absl::Notification second_ran;
  bool first_saw_second = false;
  KeptThreads::Run first =
      threads.Start([&] { first_saw_second = second_ran.WaitForNotificationWithTimeout(absl::Seconds(30)); });
  KeptThreads::Run second = threads.Start([&] { second_ran.Notify(); });
  first.Wait();
  second.Wait();
  EXPECT_TRUE(first_saw_second);
  EXPECT_EQ(threads.threads(), 2u);
}

TEST(KeptThreadsTest, ReturnedIsFalseWhileTheFunctionRuns) {
  KeptThreads threads;
  absl::Notification release;
  KeptThreads::Run run = threads.Start([&] { release.WaitForNotification(); });
  EXPECT_FALSE(run.Returned());
  release.Notify();
  run.Wait();
  EXPECT_TRUE(run.Returned());
  EXPECT_TRUE(KeptThreads::Run().Returned());  // none started
  KeptThreads::Run().Wait();
}

TEST(KeptThreadsTest, TheDestructorJoinsOnceTheFunctionsInFlightReturned) {
  std::atomic<int> ran{0};
  KeptThreads::Run run;
  {
    KeptThreads threads;
    run = threads.Start([&] {
      absl::SleepFor(absl::Milliseconds(20));
      ++ran;
    });
    threads.Start([&] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 2);
  EXPECT_TRUE(run.Returned());
  run.Wait();  // the run outlives its threads
}

}  // namespace
}  // namespace refit
