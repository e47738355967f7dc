#include "common/hot_wait.h"

#include <sched.h>

#include <atomic>

#include "absl/time/clock.h"

namespace refit {
namespace {

std::atomic<bool> hot{false};

}  // namespace

void SetRefitHot(bool on) { hot.store(on, std::memory_order_relaxed); }

bool RefitHot() { return hot.load(std::memory_order_relaxed); }

bool SpinWhileRefitHot(absl::Mutex& mu, const absl::Condition& cond, absl::Time deadline) {
  while (!cond.Eval()) {
    if (!RefitHot() || absl::Now() >= deadline) return false;
    mu.Unlock();
    sched_yield();  // on a busy machine, the thread this one waits for runs first
    mu.Lock();
  }
  return true;
}

int HotPoll(pollfd* fds, nfds_t count, int timeout_ms) {
  if (!RefitHot()) return poll(fds, count, timeout_ms);
  const int rc = poll(fds, count, 0);
  if (rc == 0) sched_yield();
  return rc;
}

}  // namespace refit
