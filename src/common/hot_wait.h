// Waits that spin while a refit is in flight. refitd's event loop busy polls from a begin to its
// commit's answer (common/busy_poll.h); the threads a refit's bytes cross on their way to the GPU
// (a data-plane peer's socket, the tag matcher, the session's receiver and converter, the commit
// waiting for the last bucket) would still sleep between steps, and each wake-up costs 0.1-0.2 ms
// on a virtualized GPU host (docs/benchmarks.md run 32). While the loop is hot they spin instead:
// each such wait first checks its condition (yielding the CPU between checks) until it holds, the
// loop cools, or its deadline passes, and only then sleeps as before.
//
// Threading: SetRefitHot from the event loop's thread; the rest from any thread.
#ifndef REFIT_COMMON_HOT_WAIT_H_
#define REFIT_COMMON_HOT_WAIT_H_

#include <poll.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace refit {

// Whether a refit is in flight in this process with busy polling on (refitd's main loop sets it
// each time it decides to spin or to sleep). Off unless set: tests and tools never spin.
void SetRefitHot(bool hot);
bool RefitHot();

// `mu` held: while RefitHot() and before `deadline`, re-evaluates `cond` (releasing `mu` and
// yielding between checks) until it holds. Returns whether it holds; the caller then waits as it
// would have (mu.Await...), which returns at once when it does.
bool SpinWhileRefitHot(absl::Mutex& mu, const absl::Condition& cond, absl::Time deadline = absl::InfiniteFuture())
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

// poll(2) for a thread waiting for a refit's next message: while RefitHot(), polls without
// waiting and yields the CPU when nothing is ready (the caller loops, checking its deadline);
// otherwise waits up to `timeout_ms` as poll does.
int HotPoll(pollfd* fds, nfds_t count, int timeout_ms);

}  // namespace refit

#endif  // REFIT_COMMON_HOT_WAIT_H_
