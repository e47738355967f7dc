#include "ucx_leak_watch.h"

#include <ucs/debug/log_def.h>

#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <string_view>

#include "transport/ucx/ucx_handles.h"

namespace refit::transport::testing {
namespace {

std::mutex& Mu() {
  static std::mutex mu;
  return mu;
}

std::vector<std::string>& Reports() {
  static std::vector<std::string> reports;
  return reports;
}

// The warnings UCX 1.13 to 1.22 print when a worker or context is destroyed while something of
// it is still in use (rcache.c, mpool.c, ucp_worker.c).
bool IsLeakReport(std::string_view message) {
  for (std::string_view needle : {"destroying inuse", "was not returned to mpool",
                                  "endpoints were not destroyed", "were not flushed"}) {
    if (message.find(needle) != std::string_view::npos) return true;
  }
  return false;
}

ucs_log_func_rc_t OnUcxLog(const char* file, unsigned line, const char* function,
                           ucs_log_level_t level, const ucs_log_component_config_t* comp_conf,
                           const char* format, va_list ap) {
  if (level != UCS_LOG_LEVEL_WARN) return UCS_LOG_FUNC_RC_CONTINUE;  // errors print as usual
  char text[512];
  va_list copy;
  va_copy(copy, ap);
  std::vsnprintf(text, sizeof(text), format, copy);
  va_end(copy);
  if (IsLeakReport(text)) {
    std::string report = std::string(file) + ":" + std::to_string(line) + " " + text;
    std::fprintf(stderr, "UCX leak report: %s\n", report.c_str());
    std::lock_guard<std::mutex> lock(Mu());
    Reports().push_back(std::move(report));
  }
  return UCS_LOG_FUNC_RC_STOP;
}

}  // namespace

void WatchUcxLeaks() {
  static std::once_flag installed;
  std::call_once(installed, [] { ucs_log_push_handler(&OnUcxLog); });
  (void)ucx::SetUcxLogLevel("warn");
}

std::vector<std::string> TakeUcxLeakReports() {
  std::lock_guard<std::mutex> lock(Mu());
  std::vector<std::string> out;
  out.swap(Reports());
  return out;
}

}  // namespace refit::transport::testing
