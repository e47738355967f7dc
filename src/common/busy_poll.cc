#include "common/busy_poll.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

namespace refit {

unsigned AvailableCpus() {
  unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    cpus = std::min(cpus, static_cast<unsigned>(std::max(1, CPU_COUNT(&set))));
  }
  // A cgroup v2 CPU quota ("QUOTA PERIOD", or "max PERIOD" for none): a container limited to
  // fewer CPUs than it sees would be throttled by a spinning loop.
  std::ifstream max("/sys/fs/cgroup/cpu.max");
  std::string quota;
  long long period = 0;
  if (max >> quota >> period && quota != "max" && period > 0) {
    const long long q = std::atoll(quota.c_str());
    if (q > 0) cpus = std::min(cpus, static_cast<unsigned>(std::max(1LL, (q + period - 1) / period)));
  }
  return cpus;
}

bool BusyPollWanted(std::string_view setting) {
  if (setting == "on") return true;
  if (setting == "off") return false;
  if (const char* v = std::getenv("REFIT_BUSY_POLL"); v != nullptr && *v != '\0') return std::string_view(v) == "1";
  return AvailableCpus() >= kBusyPollMinCpus;
}

void WaitBusyPolling(kj::ForkedPromise<void>& done, kj::WaitScope& wait_scope, const std::function<bool()>& hot,
                     const std::function<kj::Promise<void>()>& heat) {
  while (true) {
    if (hot()) {
      kj::Promise<void> branch = done.addBranch();
      while (hot()) {
        if (branch.poll(wait_scope)) return;
      }
      continue;
    }
    const bool finished = done.addBranch()
                              .then([] { return true; })
                              .exclusiveJoin(heat().then([] { return false; }))
                              .wait(wait_scope);
    if (finished) return;
  }
}

}  // namespace refit
