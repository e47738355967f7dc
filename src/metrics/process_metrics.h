// The process_* metrics of the Prometheus client conventions, read from /proc/self at every
// scrape (Registry::AddCollectHook): the same names, types and units the official clients
// export, so standard dashboards and alerts work unchanged. Linux only.
//
//   process_cpu_seconds_total       counter  user + system CPU time
//   process_resident_memory_bytes   gauge    resident set size
//   process_virtual_memory_bytes    gauge    virtual memory size
//   process_start_time_seconds      gauge    start time, seconds since the Unix epoch
//   process_open_fds                gauge    open file descriptors
//   process_max_fds                 gauge    the soft limit on open file descriptors
#ifndef REFIT_METRICS_PROCESS_METRICS_H_
#define REFIT_METRICS_PROCESS_METRICS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "metrics/registry.h"

namespace refit::metrics {

struct ProcessSample {
  double cpu_seconds = 0;
  uint64_t resident_bytes = 0;
  uint64_t virtual_bytes = 0;
  double start_time_seconds = 0;
  uint64_t open_fds = 0;
  uint64_t max_fds = 0;
};

// Reads the sample of this process. Fails naming the /proc file it could not read or parse.
absl::StatusOr<ProcessSample> ReadProcessSample();

// The fields of a /proc/PID/stat line (exposed for tests): CPU seconds, vsize, rss bytes and
// the start time since boot in seconds, given the clock ticks per second and the page size.
absl::Status ParseProcStat(const std::string& stat_line, double ticks_per_second, uint64_t page_size,
                           ProcessSample& out, double& start_since_boot_seconds);

// Registers the six families on `registry` and a collect hook that refreshes them. Fails only
// if a name is already registered.
absl::Status RegisterProcessMetrics(Registry& registry);

}  // namespace refit::metrics

#endif  // REFIT_METRICS_PROCESS_METRICS_H_
