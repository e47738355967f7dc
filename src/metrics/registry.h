// The set of metric families one process exports. The daemon owns one Registry (there is no
// global instance) and hands references to whoever records or exposes metrics.
//
// Registration validates names, label names, help text and bucket bounds, and rejects a family
// whose exposed series names (for a histogram: name_bucket, name_sum, name_count) collide with
// an existing family's. Returned family pointers are owned by the registry and stay valid for
// its lifetime.
// Threading: all methods are thread-safe; Collect() may run concurrently with updates.
#ifndef REFIT_METRICS_REGISTRY_H_
#define REFIT_METRICS_REGISTRY_H_

#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "metrics/family.h"
#include "metrics/snapshot.h"

namespace refit::metrics {

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // `name` must end in "_total".
  absl::StatusOr<CounterFamily*> AddCounter(std::string_view name, std::string_view help,
                                            std::vector<std::string> label_names = {});
  absl::StatusOr<GaugeFamily*> AddGauge(std::string_view name, std::string_view help,
                                        std::vector<std::string> label_names = {});
  // `upper_bounds`: finite, strictly increasing; the +Inf bucket is implicit.
  absl::StatusOr<HistogramFamily*> AddHistogram(std::string_view name, std::string_view help,
                                                std::vector<double> upper_bounds,
                                                std::vector<std::string> label_names = {});

  // Runs `hook` at the start of every Collect(), before the snapshots: families whose values are
  // read from elsewhere at scrape time (process_* from /proc) refresh themselves there. Two
  // scrapes may run a hook at once (a hook locks what it shares); a hook runs under the
  // registry's shared lock, so it must not register families.
  void AddCollectHook(std::function<void()> hook) ABSL_LOCKS_EXCLUDED(mu_);

  // Snapshots of every family, in registration order. A family without labels always has its
  // single child, so it is exposed (at zero) from registration on.
  std::vector<FamilySnapshot> Collect() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Validates a new family and reserves the series names it will expose.
  absl::Status Reserve(std::string_view name, std::string_view help, MetricType type,
                       const std::vector<std::string>& label_names)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // std::shared_mutex, not absl::Mutex: the prebuilt Abseil is not built for ThreadSanitizer,
  // which would then report false races on everything this lock guards.
  mutable std::shared_mutex mu_;
  std::vector<std::unique_ptr<FamilyBase>> families_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> series_names_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> collect_hooks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace refit::metrics

#endif  // REFIT_METRICS_REGISTRY_H_
