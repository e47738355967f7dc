#include "common/trace.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>

namespace refit::trace_internal {

std::atomic<int> state{-1};

int Open() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* path = std::getenv("REFIT_TRACE_FILE");
    int fd = path != nullptr && *path != '\0' ? open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600) : -1;
    state.store(fd >= 0 ? fd + 1 : 0, std::memory_order_relaxed);
  });
  return state.load(std::memory_order_relaxed);
}

void Write(int fd, const char* label, const uint64_t* value) {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  const long long us = static_cast<long long>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
  char line[256];
  int n = value != nullptr ? std::snprintf(line, sizeof(line), "%d %lld %s %llu\n", static_cast<int>(getpid()), us,
                                           label, static_cast<unsigned long long>(*value))
                           : std::snprintf(line, sizeof(line), "%d %lld %s\n", static_cast<int>(getpid()), us, label);
  if (n <= 0) return;
  if (n >= static_cast<int>(sizeof(line))) {
    n = sizeof(line) - 1;
    line[n - 1] = '\n';
  }
  ssize_t written = write(fd, line, static_cast<size_t>(n));
  (void)written;
}

}  // namespace refit::trace_internal
