// A distribution of observations (durations in seconds, sizes in bytes) counted into fixed
// buckets, exposed as Prometheus cumulative buckets plus sum and count. One Histogram is one
// labelled child of a histogram family; it lives as long as the registry.
// Thread-safe: Observe is lock-free (one bucket increment and one sum add). A snapshot taken
// while observations race may have a sum that lags its counts by in-flight observations, but its
// +Inf bucket always equals its count.
#ifndef REFIT_METRICS_HISTOGRAM_H_
#define REFIT_METRICS_HISTOGRAM_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "metrics/snapshot.h"

namespace refit::metrics {

class Histogram {
 public:
  // REQUIRES: ValidateBucketBounds(upper_bounds).ok() (the registry checks at registration).
  explicit Histogram(std::vector<double> upper_bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // Counts `value` into the first bucket whose upper bound is >= value (bounds are inclusive,
  // as Prometheus' "le" says). NaN counts into the +Inf bucket only.
  void Observe(double value);

  HistogramSnapshot Snapshot() const;

 private:
  const std::vector<double> upper_bounds_;
  // Per-bucket (not cumulative) counts; the last slot is the +Inf bucket.
  const std::unique_ptr<std::atomic<uint64_t>[]> bucket_counts_;
  std::atomic<double> sum_{0.0};
};

// Bounds must be finite and strictly increasing; an empty list is allowed (only +Inf).
absl::Status ValidateBucketBounds(absl::Span<const double> upper_bounds);

// `count` bounds start, start*factor, start*factor^2, ... REQUIRES: start > 0, factor > 1.
std::vector<double> ExponentialBuckets(double start, double factor, int count);

}  // namespace refit::metrics

#endif  // REFIT_METRICS_HISTOGRAM_H_
