// A monotonically increasing value (events, bytes). One Counter is one labelled child of a
// counter family; the family owns it and it lives as long as the registry.
// Thread-safe: lock-free atomics; Inc is cheap enough for per-bucket hot paths.
#ifndef REFIT_METRICS_COUNTER_H_
#define REFIT_METRICS_COUNTER_H_

#include <atomic>
#include <cmath>

namespace refit::metrics {

class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // REQUIRES: delta >= 0. A negative or NaN delta would break monotonicity, which every rate()
  // over this series relies on, so it is dropped.
  void Inc(double delta = 1.0) {
    if (!(delta >= 0)) return;
    value_.fetch_add(delta, std::memory_order_relaxed);
  }

  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

}  // namespace refit::metrics

#endif  // REFIT_METRICS_COUNTER_H_
