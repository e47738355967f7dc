#include "metrics/histogram.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace refit::metrics {

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)),
      bucket_counts_(new std::atomic<uint64_t>[upper_bounds_.size() + 1]) {
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) {
    bucket_counts_[i].store(0, std::memory_order_relaxed);
  }
}

void Histogram::Observe(double value) {
  size_t bucket = upper_bounds_.size();  // +Inf
  if (!std::isnan(value)) {
    bucket = static_cast<size_t>(
        std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) -
        upper_bounds_.begin());
  }
  bucket_counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

HistogramSnapshot Histogram::Snapshot() const {
  HistogramSnapshot snap;
  snap.upper_bounds = upper_bounds_;
  snap.cumulative_counts.resize(upper_bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= upper_bounds_.size(); ++i) {
    running += bucket_counts_[i].load(std::memory_order_relaxed);
    snap.cumulative_counts[i] = running;
  }
  snap.count = running;
  snap.sum = sum_.load(std::memory_order_relaxed);
  return snap;
}

absl::Status ValidateBucketBounds(absl::Span<const double> upper_bounds) {
  for (size_t i = 0; i < upper_bounds.size(); ++i) {
    if (!std::isfinite(upper_bounds[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bucket bound [", i, "] = ", upper_bounds[i], " must be finite (+Inf is implicit)"));
    }
    if (i > 0 && !(upper_bounds[i] > upper_bounds[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("bucket bounds must increase strictly: [", i - 1, "] = ",
                       upper_bounds[i - 1], ", [", i, "] = ", upper_bounds[i]));
    }
  }
  return absl::OkStatus();
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> bounds;
  bounds.reserve(count > 0 ? static_cast<size_t>(count) : 0);
  double bound = start;
  for (int i = 0; i < count; ++i) {
    bounds.push_back(bound);
    bound *= factor;
  }
  return bounds;
}

}  // namespace refit::metrics
