// A metric family: one name, help text, type and list of label names, holding one child metric
// (Counter, Gauge or Histogram) per distinct tuple of label values. Children are created on
// first use and never removed, so references to them stay valid for the registry's lifetime.
//
// Threading: all methods are thread-safe. Labels() takes a shared lock and one map lookup;
// on a hot path, call it once and keep the returned reference, whose methods are lock-free.
// Label values must come from small fixed sets (outcomes, phases, formats): every distinct
// tuple is a time series that lives until the process exits.
#ifndef REFIT_METRICS_FAMILY_H_
#define REFIT_METRICS_FAMILY_H_

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/types/span.h"
#include "metrics/counter.h"
#include "metrics/gauge.h"
#include "metrics/histogram.h"
#include "metrics/snapshot.h"

namespace refit::metrics {

// The type-independent face of a family, as the registry and exposition see it.
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  virtual const std::string& name() const = 0;
  virtual MetricType type() const = 0;
  virtual FamilySnapshot Snapshot() const = 0;
};

namespace internal {

// Orders label-value tuples lexicographically; transparent so that a lookup with string_views
// does not allocate.
struct LabelValuesLess {
  using is_transparent = void;
  template <typename A, typename B>
  bool operator()(const A& a, const B& b) const {
    return std::lexicographical_compare(
        a.begin(), a.end(), b.begin(), b.end(),
        [](std::string_view x, std::string_view y) { return x < y; });
  }
};

inline void SnapshotChild(const Counter& c, ChildSnapshot& out) { out.value = c.Value(); }
inline void SnapshotChild(const Gauge& g, ChildSnapshot& out) { out.value = g.Value(); }
inline void SnapshotChild(const Histogram& h, ChildSnapshot& out) { out.histogram = h.Snapshot(); }

}  // namespace internal

template <typename T>
class Family final : public FamilyBase {
 public:
  // Built by Registry, which has validated every argument.
  Family(std::string name, std::string help, MetricType type, std::vector<std::string> label_names,
         std::function<std::unique_ptr<T>()> make_child)
      : name_(std::move(name)),
        help_(std::move(help)),
        type_(type),
        label_names_(std::move(label_names)),
        make_child_(std::move(make_child)) {}
  Family(const Family&) = delete;
  Family& operator=(const Family&) = delete;

  // The child for these label values, in the order of the family's label names; created at
  // zero on first use. A family without labels has exactly one child: Labels({}).
  // REQUIRES: values.size() == label_names().size(). A mismatch is a programming error and
  // aborts with the family's name.
  T& Labels(absl::Span<const std::string_view> values) ABSL_LOCKS_EXCLUDED(mu_) {
    if (values.size() != label_names_.size()) {
      std::fprintf(stderr, "metric '%s': %zu label values given, %zu label names declared\n",
                   name_.c_str(), values.size(), label_names_.size());
      std::abort();
    }
    {
      std::shared_lock lock(mu_);
      auto it = children_.find(values);
      if (it != children_.end()) return *it->second;
    }
    std::unique_lock lock(mu_);
    auto it = children_.find(values);
    if (it != children_.end()) return *it->second;
    std::vector<std::string> key(values.begin(), values.end());
    return *children_.emplace(std::move(key), make_child_()).first->second;
  }

  // The child for these label values, dropping every other child in the same step (for series
  // that name one current value, like an info metric's). References returned by earlier calls
  // for other values become invalid: only for families whose callers keep none.
  T& Only(absl::Span<const std::string_view> values) ABSL_LOCKS_EXCLUDED(mu_) {
    T& child = Labels(values);
    std::unique_lock lock(mu_);
    for (auto it = children_.begin(); it != children_.end();) {
      if (it->second.get() == &child) {
        ++it;
      } else {
        it = children_.erase(it);
      }
    }
    return child;
  }

  const std::string& name() const override { return name_; }
  const std::string& help() const { return help_; }
  MetricType type() const override { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }

  FamilySnapshot Snapshot() const override ABSL_LOCKS_EXCLUDED(mu_) {
    FamilySnapshot snap;
    snap.name = name_;
    snap.help = help_;
    snap.type = type_;
    snap.label_names = label_names_;
    std::shared_lock lock(mu_);
    snap.children.reserve(children_.size());
    for (const auto& [values, child] : children_) {
      ChildSnapshot& out = snap.children.emplace_back();
      out.label_values = values;
      internal::SnapshotChild(*child, out);
    }
    return snap;
  }

 private:
  const std::string name_;
  const std::string help_;
  const MetricType type_;
  const std::vector<std::string> label_names_;
  const std::function<std::unique_ptr<T>()> make_child_;

  // std::shared_mutex, not absl::Mutex: the prebuilt Abseil is not built for ThreadSanitizer,
  // which would then report false races on everything this lock guards.
  mutable std::shared_mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>, internal::LabelValuesLess> children_
      ABSL_GUARDED_BY(mu_);
};

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

}  // namespace refit::metrics

#endif  // REFIT_METRICS_FAMILY_H_
