// Busy polling: an event loop that spins while a refit is in flight instead of sleeping between
// events, so that each hop between refitd, the engine and the trainer costs microseconds rather
// than a sleeping thread's wake-up (0.1-0.2 ms each on a virtualized GPU host; docs/benchmarks.md
// run 25). It costs one CPU core per spinning loop for the refit's duration.
//
// Threading: the loop's own thread.
#ifndef REFIT_COMMON_BUSY_POLL_H_
#define REFIT_COMMON_BUSY_POLL_H_

#include <functional>
#include <string_view>

#include "kj/async.h"

namespace refit {

// Whether to busy poll under `setting`: "on", "off", or "auto": the environment's
// REFIT_BUSY_POLL ("1" or "0") when set, else on when this process may use at least
// kBusyPollMinCpus CPUs (a spinning loop would take a small machine's only cores from the work
// it waits for, and a container's CPU quota with them).
inline constexpr unsigned kBusyPollMinCpus = 8;
bool BusyPollWanted(std::string_view setting);
// The CPUs this process may use: the machine's, at most its affinity mask's and its cgroup v2
// CPU quota's (rounded up).
unsigned AvailableCpus();

// Runs the event loop until `done` resolves: spinning (kj::Promise::poll) while hot() is true;
// otherwise blocking until `done` or the promise heat() returns resolves (fulfilled, on this
// loop, by whatever makes hot() true: a begin, a pause).
void WaitBusyPolling(kj::ForkedPromise<void>& done, kj::WaitScope& wait_scope, const std::function<bool()>& hot,
                     const std::function<kj::Promise<void>()>& heat);

}  // namespace refit

#endif  // REFIT_COMMON_BUSY_POLL_H_
