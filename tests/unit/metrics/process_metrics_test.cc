#include "metrics/process_metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <vector>

#include "gtest/gtest.h"
#include "metrics/registry.h"

namespace refit::metrics {
namespace {

TEST(ProcessMetrics, ParsesStatWithSpacesAndParensInTheCommand) {
  // Fields 14 utime=250, 15 stime=150, 22 starttime=1000, 23 vsize, 24 rss (pages).
  const std::string line =
      "1234 (a (b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 3 0 1000 987654321 512 "
      "18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
  ProcessSample s;
  double since_boot = 0;
  ASSERT_TRUE(ParseProcStat(line, 100.0, 4096, s, since_boot).ok());
  EXPECT_DOUBLE_EQ(s.cpu_seconds, 4.0);
  EXPECT_DOUBLE_EQ(since_boot, 10.0);
  EXPECT_EQ(s.virtual_bytes, 987654321u);
  EXPECT_EQ(s.resident_bytes, 512u * 4096u);
}

TEST(ProcessMetrics, TruncatedStatIsAnError) {
  ProcessSample s;
  double since_boot = 0;
  absl::Status st = ParseProcStat("1234 (x) S 1 2 3", 100.0, 4096, s, since_boot);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("/proc/self/stat"), std::string::npos) << st;
  EXPECT_FALSE(ParseProcStat("garbage", 100.0, 4096, s, since_boot).ok());
}

TEST(ProcessMetrics, ReadsThisProcess) {
  absl::StatusOr<ProcessSample> a = ReadProcessSample();
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_GT(a->resident_bytes, 0u);
  EXPECT_GE(a->virtual_bytes, a->resident_bytes);
  EXPECT_GT(a->max_fds, 0u);
  EXPECT_LE(a->start_time_seconds, static_cast<double>(std::time(nullptr)) + 1);
  EXPECT_GT(a->start_time_seconds, static_cast<double>(std::time(nullptr)) - 3600);
  // Three more descriptors show as three more.
  std::vector<int> fds;
  for (int i = 0; i < 3; ++i) fds.push_back(open("/dev/null", O_RDONLY));
  absl::StatusOr<ProcessSample> b = ReadProcessSample();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->open_fds, a->open_fds + 3);
  for (int fd : fds) close(fd);
  // Burn some CPU: the counter moves.
  volatile double x = 0;
  for (int i = 0; i < 50'000'000; ++i) x = x + i * 0.5;
  absl::StatusOr<ProcessSample> c = ReadProcessSample();
  ASSERT_TRUE(c.ok());
  EXPECT_GT(c->cpu_seconds, a->cpu_seconds);
}

TEST(ProcessMetrics, RegisteredFamiliesRefreshAtCollect) {
  Registry registry;
  ASSERT_TRUE(RegisterProcessMetrics(registry).ok());
  EXPECT_FALSE(RegisterProcessMetrics(registry).ok());  // names taken
  auto value = [&](const std::string& name) {
    for (const FamilySnapshot& f : registry.Collect()) {
      if (f.name == name) return f.children.at(0).value;
    }
    ADD_FAILURE() << name << " not collected";
    return -1.0;
  };
  const double fds = value("process_open_fds");
  EXPECT_GT(fds, 0);
  int fd = open("/dev/null", O_RDONLY);
  EXPECT_EQ(value("process_open_fds"), fds + 1);
  close(fd);
  EXPECT_GT(value("process_resident_memory_bytes"), 0);
  EXPECT_GT(value("process_max_fds"), 0);
  EXPECT_GT(value("process_start_time_seconds"), 1.6e9);
  EXPECT_GE(value("process_cpu_seconds_total"), 0);
}

}  // namespace
}  // namespace refit::metrics
