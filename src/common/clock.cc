#include "common/clock.h"

#include <cstdio>
#include <cstdlib>

#include "absl/time/clock.h"
#include "common/fake_clock.h"

namespace refit {
namespace {

class SystemClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

// A test that moves time backwards has a bug; fail it loudly.
void CheckForward(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "FakeClock: %s would run time backwards\n", what);
    std::abort();
  }
}

}  // namespace

std::unique_ptr<Clock> NewSystemClock() { return std::make_unique<SystemClock>(); }

absl::Time FakeClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

void FakeClock::Advance(absl::Duration d) {
  CheckForward(d >= absl::ZeroDuration(), "Advance");
  absl::MutexLock lock(&mu_);
  now_ += d;
}

void FakeClock::SetTime(absl::Time t) {
  absl::MutexLock lock(&mu_);
  CheckForward(t >= now_, "SetTime");
  now_ = t;
}

}  // namespace refit
