// Point-in-time values of registered metrics, as plain data: the registry produces them and the
// exposition formats render them, so a format can be tested on hand-built snapshots.
// Thread-safety: value types, no shared state.
#ifndef REFIT_METRICS_SNAPSHOT_H_
#define REFIT_METRICS_SNAPSHOT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace refit::metrics {

enum class MetricType { kCounter, kGauge, kHistogram };

// The name Prometheus uses on the TYPE line: "counter", "gauge", "histogram".
std::string_view MetricTypeName(MetricType type);

struct HistogramSnapshot {
  // Finite, strictly increasing upper bounds; the implicit last bucket is +Inf.
  std::vector<double> upper_bounds;
  // Cumulative counts: cumulative_counts[i] observations were <= upper_bounds[i]; the last
  // element (index upper_bounds.size()) is the +Inf bucket and equals `count`.
  std::vector<uint64_t> cumulative_counts;
  double sum = 0;
  uint64_t count = 0;
};

struct ChildSnapshot {
  std::vector<std::string> label_values;  // parallel to FamilySnapshot::label_names
  double value = 0;                       // counters and gauges
  HistogramSnapshot histogram;            // histograms only
};

struct FamilySnapshot {
  std::string name;
  std::string help;
  MetricType type = MetricType::kGauge;
  std::vector<std::string> label_names;
  std::vector<ChildSnapshot> children;  // sorted by label values
};

}  // namespace refit::metrics

#endif  // REFIT_METRICS_SNAPSHOT_H_
