// A value that goes up and down (bytes in use, active sessions, a version number, a timestamp).
// One Gauge is one labelled child of a gauge family; it lives as long as the registry.
// Thread-safe: lock-free atomics.
#ifndef REFIT_METRICS_GAUGE_H_
#define REFIT_METRICS_GAUGE_H_

#include <atomic>

namespace refit::metrics {

class Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Inc(double delta = 1.0) { value_.fetch_add(delta, std::memory_order_relaxed); }
  void Dec(double delta = 1.0) { value_.fetch_sub(delta, std::memory_order_relaxed); }

  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

}  // namespace refit::metrics

#endif  // REFIT_METRICS_GAUGE_H_
