#include "server/log.h"

#include <unistd.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace refit::server {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
constexpr const char* kNames[] = {"debug", "info", "warn", "error"};
}  // namespace

void SetLogLevel(LogLevel level) { g_level = static_cast<int>(level); }

bool ParseLogLevel(std::string_view name, LogLevel& out) {
  for (int i = 0; i < 4; ++i) {
    if (name == kNames[i]) {
      out = static_cast<LogLevel>(i);
      return true;
    }
  }
  return false;
}

void Log(LogLevel level, std::string_view line) {
  if (static_cast<int>(level) < g_level.load()) return;
  std::string out = absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()),
                                 " level=", kNames[static_cast<int>(level)], " ", std::string(line), "\n");
  ssize_t n = write(STDERR_FILENO, out.data(), out.size());
  (void)n;
}

}  // namespace refit::server
