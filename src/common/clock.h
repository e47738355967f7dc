// The time seam: what refitd reads the current time from, so that deadlines (session deadlines,
// engine pause deadlines) can be tested with a FakeClock (fake_clock.h) instead of sleeping.
// Code that takes a Clock& uses it for every deadline it computes or checks; the daemon passes
// the system clock.
//
// Threading: implementations are thread-safe.
#ifndef REFIT_COMMON_CLOCK_H_
#define REFIT_COMMON_CLOCK_H_

#include <memory>

#include "absl/time/time.h"

namespace refit {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// The real clock (absl::Now()). Each call returns a new owner; all of them read the same time.
std::unique_ptr<Clock> NewSystemClock();

}  // namespace refit

#endif  // REFIT_COMMON_CLOCK_H_
