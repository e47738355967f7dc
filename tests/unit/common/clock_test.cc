// Clock seam: the system clock follows real time; the fake one moves only when told.
#include "common/clock.h"

#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/fake_clock.h"
#include "gtest/gtest.h"

namespace refit {
namespace {

TEST(ClockTest, SystemClockReadsRealTime) {
  std::unique_ptr<Clock> clock = NewSystemClock();
  const absl::Time before = absl::Now();
  const absl::Time now = clock->Now();
  EXPECT_GE(now, before);
  EXPECT_LE(now, absl::Now());
}

TEST(ClockTest, FakeClockStandsStillUntilAdvanced) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  EXPECT_EQ(clock.Now(), start);
  clock.Advance(absl::Milliseconds(1500));
  EXPECT_EQ(clock.Now(), start + absl::Milliseconds(1500));
  clock.SetTime(start + absl::Seconds(10));
  EXPECT_EQ(clock.Now(), start + absl::Seconds(10));
}

TEST(ClockTest, FakeClockStartsWhereTold) {
  const absl::Time t = absl::FromUnixSeconds(42);
  FakeClock clock(t);
  EXPECT_EQ(clock.Now(), t);
}

// A deadline computed from the clock passes exactly when the test moves time past it.
TEST(ClockTest, DeadlinesFollowTheFakeClock) {
  FakeClock fake;
  Clock& clock = fake;
  const absl::Time deadline = clock.Now() + absl::Seconds(30);
  fake.Advance(absl::Seconds(29));
  EXPECT_LT(clock.Now(), deadline);
  fake.Advance(absl::Seconds(1));
  EXPECT_GE(clock.Now(), deadline);
}

TEST(ClockTest, FakeClockIsReadWhileAdvancedFromAnotherThread) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  std::thread advancer([&] {
    for (int i = 0; i < 1000; ++i) clock.Advance(absl::Milliseconds(1));
  });
  absl::Time last = start;
  for (int i = 0; i < 1000; ++i) {
    const absl::Time now = clock.Now();
    EXPECT_GE(now, last);  // monotonic
    last = now;
  }
  advancer.join();
  EXPECT_EQ(clock.Now(), start + absl::Seconds(1));
}

TEST(ClockDeathTest, FakeClockNeverRunsBackwards) {
  FakeClock clock;
  EXPECT_DEATH(clock.Advance(absl::Seconds(-1)), "backwards");
  EXPECT_DEATH(clock.SetTime(clock.Now() - absl::Seconds(1)), "backwards");
}

}  // namespace
}  // namespace refit
