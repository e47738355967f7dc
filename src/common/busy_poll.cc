#include "common/busy_poll.h"

#include <cstdlib>
#include <thread>

namespace refit {

bool BusyPollWanted(std::string_view setting) {
  if (setting == "on") return true;
  if (setting == "off") return false;
  if (const char* v = std::getenv("REFIT_BUSY_POLL"); v != nullptr && *v != '\0') return std::string_view(v) == "1";
  return std::thread::hardware_concurrency() >= kBusyPollMinCpus;
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
