#include "metrics/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace refit::metrics {
namespace {

absl::StatusOr<std::string> ReadFile(const char* path) {
  std::ifstream in(path);
  if (!in) return absl::UnavailableError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Seconds since the epoch at boot: the "btime" line of /proc/stat.
absl::StatusOr<double> BootTime() {
  REFIT_ASSIGN_OR_RETURN(std::string stat, ReadFile("/proc/stat"));
  std::istringstream lines(stat);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("btime ", 0) == 0) return std::strtod(line.c_str() + 6, nullptr);
  }
  return absl::DataLossError("/proc/stat has no btime line");
}

absl::StatusOr<uint64_t> OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return absl::UnavailableError("cannot list /proc/self/fd");
  uint64_t n = 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n > 0 ? n - 1 : 0;  // less the descriptor that lists the directory
}

}  // namespace

absl::Status ParseProcStat(const std::string& line, double ticks, uint64_t page_size, ProcessSample& out,
                           double& start_since_boot) {
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses; fields resume after the
  // last ')'. Field numbers below are proc(5)'s (1-based; state is field 3).
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return absl::DataLossError("/proc/self/stat: no ')' after the command name");
  std::istringstream in(line.substr(close + 1));
  std::vector<std::string> f(3);  // f[3] is field 3
  std::string w;
  while (in >> w) f.push_back(w);
  if (f.size() <= 24) return absl::DataLossError(absl::StrCat("/proc/self/stat: ", f.size() - 1, " fields, want 24+"));
  const double utime = std::strtod(f[14].c_str(), nullptr), stime = std::strtod(f[15].c_str(), nullptr);
  out.cpu_seconds = (utime + stime) / ticks;
  start_since_boot = std::strtod(f[22].c_str(), nullptr) / ticks;
  out.virtual_bytes = std::strtoull(f[23].c_str(), nullptr, 10);
  out.resident_bytes = std::strtoull(f[24].c_str(), nullptr, 10) * page_size;
  return absl::OkStatus();
}

absl::StatusOr<ProcessSample> ReadProcessSample() {
  ProcessSample s;
  REFIT_ASSIGN_OR_RETURN(std::string stat, ReadFile("/proc/self/stat"));
  double since_boot = 0;
  REFIT_RETURN_IF_ERROR(ParseProcStat(stat, static_cast<double>(sysconf(_SC_CLK_TCK)),
                                      static_cast<uint64_t>(sysconf(_SC_PAGESIZE)), s, since_boot));
  REFIT_ASSIGN_OR_RETURN(double boot, BootTime());
  s.start_time_seconds = boot + since_boot;
  REFIT_ASSIGN_OR_RETURN(s.open_fds, OpenFds());
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return absl::UnavailableError("getrlimit(RLIMIT_NOFILE) failed");
  s.max_fds = lim.rlim_cur == RLIM_INFINITY ? 0 : lim.rlim_cur;
  return s;
}

absl::Status RegisterProcessMetrics(Registry& registry) {
  REFIT_ASSIGN_OR_RETURN(CounterFamily * cpu,
                         registry.AddCounter("process_cpu_seconds_total", "Total user and system CPU time spent in seconds."));
  REFIT_ASSIGN_OR_RETURN(GaugeFamily * rss,
                         registry.AddGauge("process_resident_memory_bytes", "Resident memory size in bytes."));
  REFIT_ASSIGN_OR_RETURN(GaugeFamily * vsz,
                         registry.AddGauge("process_virtual_memory_bytes", "Virtual memory size in bytes."));
  REFIT_ASSIGN_OR_RETURN(GaugeFamily * start,
                         registry.AddGauge("process_start_time_seconds",
                                           "Start time of the process since unix epoch in seconds."));
  REFIT_ASSIGN_OR_RETURN(GaugeFamily * fds, registry.AddGauge("process_open_fds", "Number of open file descriptors."));
  REFIT_ASSIGN_OR_RETURN(GaugeFamily * max_fds,
                         registry.AddGauge("process_max_fds", "Maximum number of open file descriptors."));
  auto mu = std::make_shared<std::mutex>();
  Counter* cpu_c = &cpu->Labels({});
  Gauge* rss_g = &rss->Labels({});
  Gauge* vsz_g = &vsz->Labels({});
  Gauge* start_g = &start->Labels({});
  Gauge* fds_g = &fds->Labels({});
  Gauge* max_g = &max_fds->Labels({});
  auto refresh = [=] {
    absl::StatusOr<ProcessSample> s = ReadProcessSample();
    if (!s.ok()) return;  // the last values stay; /proc is always there on Linux
    std::lock_guard<std::mutex> lock(*mu);
    if (s->cpu_seconds > cpu_c->Value()) cpu_c->Inc(s->cpu_seconds - cpu_c->Value());  // only hook writes it
    rss_g->Set(static_cast<double>(s->resident_bytes));
    vsz_g->Set(static_cast<double>(s->virtual_bytes));
    start_g->Set(s->start_time_seconds);
    fds_g->Set(static_cast<double>(s->open_fds));
    max_g->Set(static_cast<double>(s->max_fds));
  };
  refresh();
  registry.AddCollectHook(refresh);
  return absl::OkStatus();
}

}  // namespace refit::metrics
