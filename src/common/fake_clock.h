// A Clock (clock.h) for tests: time stands still until the test moves it.
//
// Threading: thread-safe; Now() may be read while another thread advances the clock.
#ifndef REFIT_COMMON_FAKE_CLOCK_H_
#define REFIT_COMMON_FAKE_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace refit {

class FakeClock final : public Clock {
 public:
  // Starts at `start` (by default an arbitrary fixed instant, never the real time).
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'000'000'000)) : now_(start) {}

  absl::Time Now() const override;
  // REQUIRES: d >= 0 (time never runs backwards).
  void Advance(absl::Duration d);
  // REQUIRES: t >= Now().
  void SetTime(absl::Time t);

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace refit

#endif  // REFIT_COMMON_FAKE_CLOCK_H_
