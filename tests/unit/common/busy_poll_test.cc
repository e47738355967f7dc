#include "common/busy_poll.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kj/async-io.h"

namespace refit {
namespace {

TEST(BusyPollTest, SettingsAndTheEnvironment) {
  EXPECT_TRUE(BusyPollWanted("on"));
  EXPECT_FALSE(BusyPollWanted("off"));
  ASSERT_EQ(setenv("REFIT_BUSY_POLL", "1", 1), 0);
  EXPECT_TRUE(BusyPollWanted("auto"));
  EXPECT_FALSE(BusyPollWanted("off"));  // the config's explicit setting wins
  ASSERT_EQ(setenv("REFIT_BUSY_POLL", "0", 1), 0);
  EXPECT_FALSE(BusyPollWanted("auto"));
  EXPECT_TRUE(BusyPollWanted("on"));
  ASSERT_EQ(unsetenv("REFIT_BUSY_POLL"), 0);
  EXPECT_EQ(BusyPollWanted("auto"), AvailableCpus() >= kBusyPollMinCpus);
  EXPECT_GE(AvailableCpus(), 1u);
  EXPECT_LE(AvailableCpus(), std::max(1u, std::thread::hardware_concurrency()));
}

// A process bound to one CPU (as a container's cpuset binds it) does not busy poll by itself.
TEST(BusyPollTest, AutoCountsTheAffinityMask) {
  ASSERT_EQ(unsetenv("REFIT_BUSY_POLL"), 0);
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof(before), &before), 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &before)) {
      CPU_SET(c, &one);
      break;
    }
  }
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  const unsigned cpus = AvailableCpus();
  const bool wanted = BusyPollWanted("auto");
  ASSERT_EQ(sched_setaffinity(0, sizeof(before), &before), 0);
  EXPECT_EQ(cpus, 1u);
  EXPECT_FALSE(wanted);
}

// Cold, the loop blocks until a heat (here a timer's) or the end; hot, it spins, running what
// arrives (a timer's event fires while it spins), until hot() turns false; then it blocks again
// and returns when `done` resolves.
TEST(BusyPollTest, SpinsWhileHotBlocksOtherwiseAndReturnsAtDone) {
  auto io = kj::setupAsyncIo();
  kj::Timer& timer = io.provider->getTimer();
  int heats = 0, hot_checks = 0;
  bool hot = false, spun_event = false;
  kj::Own<kj::PromiseFulfiller<void>> heat;
  // Heats the loop after 5 ms; while hot, a 5 ms timer's event ends the hot phase; `done` then
  // resolves 5 ms later.
  auto done = timer.afterDelay(5 * kj::MILLISECONDS)
                  .then([&] {
                    hot = true;
                    if (heat.get() != nullptr) heat->fulfill();
                    return timer.afterDelay(5 * kj::MILLISECONDS);
                  })
                  .then([&] {
                    spun_event = hot_checks > 1;
                    hot = false;
                    return timer.afterDelay(5 * kj::MILLISECONDS);
                  })
                  .fork();
  WaitBusyPolling(
      done, io.waitScope,
      [&] {
        if (hot) ++hot_checks;
        return hot;
      },
      [&] {
        ++heats;
        auto paf = kj::newPromiseAndFulfiller<void>();
        heat = kj::mv(paf.fulfiller);
        return kj::mv(paf.promise);
      });
  EXPECT_TRUE(done.addBranch().poll(io.waitScope));
  EXPECT_TRUE(spun_event) << "the timer's event did not run while the loop spun";
  EXPECT_GT(hot_checks, 10);  // it spun
  EXPECT_EQ(heats, 2);        // blocked twice: before the heat and after the hot phase
}

}  // namespace
}  // namespace refit
