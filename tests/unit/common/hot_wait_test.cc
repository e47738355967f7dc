// SpinWhileRefitHot and HotPoll (common/hot_wait.h): a wait spins only while the refit is
// hot, releases its mutex between checks, and ends when the condition holds, the refit cools or
// the deadline passes.
#include "common/hot_wait.h"

#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace refit {
namespace {

class HotWaitTest : public ::testing::Test {
 protected:
  void TearDown() override { SetRefitHot(false); }
};

TEST_F(HotWaitTest, ColdReturnsAtOnceWithTheCondition) {
  absl::Mutex mu;
  bool flag = false;
  absl::MutexLock lock(&mu);
  EXPECT_FALSE(RefitHot());
  EXPECT_FALSE(SpinWhileRefitHot(mu, absl::Condition(&flag)));
  flag = true;
  EXPECT_TRUE(SpinWhileRefitHot(mu, absl::Condition(&flag)));
}

TEST_F(HotWaitTest, HotSpinsUntilAnotherThreadMakesTheConditionHoldUnderTheMutex) {
  SetRefitHot(true);
  absl::Mutex mu;
  bool flag = false;
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(20));
    absl::MutexLock lock(&mu);  // would deadlock if the spin kept the mutex
    flag = true;
  });
  bool held;
  {
    absl::MutexLock lock(&mu);
    held = SpinWhileRefitHot(mu, absl::Condition(&flag));
    EXPECT_TRUE(flag);
  }
  setter.join();
  EXPECT_TRUE(held);
}

TEST_F(HotWaitTest, HotSpinEndsWhenTheRefitCools) {
  SetRefitHot(true);
  absl::Mutex mu;
  bool flag = false;
  std::thread cooler([] {
    absl::SleepFor(absl::Milliseconds(20));
    SetRefitHot(false);
  });
  {
    absl::MutexLock lock(&mu);
    EXPECT_FALSE(SpinWhileRefitHot(mu, absl::Condition(&flag)));
  }
  cooler.join();
  EXPECT_FALSE(RefitHot());
}

TEST_F(HotWaitTest, HotSpinEndsAtItsDeadline) {
  SetRefitHot(true);
  absl::Mutex mu;
  bool flag = false;
  const absl::Time start = absl::Now();
  {
    absl::MutexLock lock(&mu);
    EXPECT_FALSE(SpinWhileRefitHot(mu, absl::Condition(&flag), start + absl::Milliseconds(10)));
  }
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(10));
  EXPECT_TRUE(RefitHot());
}

TEST_F(HotWaitTest, PollWaitsOnlyWhenColdAndSeesReadyDescriptorsEitherWay) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pollfd p{fds[0], POLLIN, 0};
  absl::Time start = absl::Now();
  EXPECT_EQ(HotPoll(&p, 1, 30), 0);  // cold: waits out its timeout
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(25));
  SetRefitHot(true);
  start = absl::Now();
  EXPECT_EQ(HotPoll(&p, 1, 1000), 0);  // hot: returns at once, for the caller to check again
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
  ASSERT_EQ(write(fds[1], "x", 1), 1);
  EXPECT_EQ(HotPoll(&p, 1, 1000), 1);
  EXPECT_TRUE(p.revents & POLLIN);
  SetRefitHot(false);
  p.revents = 0;
  EXPECT_EQ(HotPoll(&p, 1, 1000), 1);
  close(fds[0]);
  close(fds[1]);
}

}  // namespace
}  // namespace refit
