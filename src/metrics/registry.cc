#include "metrics/registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "metrics/names.h"
#include "metrics/utf8.h"

namespace refit::metrics {
namespace {

std::vector<std::string> SeriesNames(std::string_view name_view, MetricType type) {
  const std::string name(name_view);
  if (type == MetricType::kHistogram) {
    return {name, absl::StrCat(name, "_bucket"), absl::StrCat(name, "_sum"),
            absl::StrCat(name, "_count")};
  }
  return {name};
}

// Families without labels get their single child now, so the series exists (at zero) before
// the first event; a rate() or absent() over it then behaves from the first scrape.
template <typename T>
void CreateUnlabelledChild(Family<T>& family) {
  if (family.label_names().empty()) family.Labels({});
}

}  // namespace

absl::Status Registry::Reserve(std::string_view name_view, std::string_view help,
                               MetricType type, const std::vector<std::string>& label_names) {
  const std::string name(name_view);  // absl::StrCat takes std::string, not std::string_view
  if (absl::Status s = ValidateMetricName(name, type); !s.ok()) return s;
  if (absl::Status s = ValidateLabelNames(name, type, label_names); !s.ok()) return s;
  if (help.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("metric '", name, "': help is empty"));
  }
  if (!IsValidUtf8(help)) {
    return absl::InvalidArgumentError(absl::StrCat("metric '", name, "': help is not UTF-8"));
  }
  const std::vector<std::string> series = SeriesNames(name, type);
  for (const std::string& s : series) {
    if (series_names_.contains(s)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "metric '", name, "': series name '", s, "' is already used by another family"));
    }
  }
  series_names_.insert(series.begin(), series.end());
  return absl::OkStatus();
}

absl::StatusOr<CounterFamily*> Registry::AddCounter(std::string_view name, std::string_view help,
                                                    std::vector<std::string> label_names) {
  std::unique_lock lock(mu_);
  if (absl::Status s = Reserve(name, help, MetricType::kCounter, label_names); !s.ok()) return s;
  auto family = std::make_unique<CounterFamily>(
      std::string(name), std::string(help), MetricType::kCounter, std::move(label_names),
      [] { return std::make_unique<Counter>(); });
  CounterFamily* out = family.get();
  CreateUnlabelledChild(*out);
  families_.push_back(std::move(family));
  return out;
}

absl::StatusOr<GaugeFamily*> Registry::AddGauge(std::string_view name, std::string_view help,
                                                std::vector<std::string> label_names) {
  std::unique_lock lock(mu_);
  if (absl::Status s = Reserve(name, help, MetricType::kGauge, label_names); !s.ok()) return s;
  auto family = std::make_unique<GaugeFamily>(
      std::string(name), std::string(help), MetricType::kGauge, std::move(label_names),
      [] { return std::make_unique<Gauge>(); });
  GaugeFamily* out = family.get();
  CreateUnlabelledChild(*out);
  families_.push_back(std::move(family));
  return out;
}

absl::StatusOr<HistogramFamily*> Registry::AddHistogram(std::string_view name,
                                                        std::string_view help,
                                                        std::vector<double> upper_bounds,
                                                        std::vector<std::string> label_names) {
  if (absl::Status s = ValidateBucketBounds(upper_bounds); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("histogram '", std::string(name), "': ", s.message()));
  }
  std::unique_lock lock(mu_);
  if (absl::Status s = Reserve(name, help, MetricType::kHistogram, label_names); !s.ok()) {
    return s;
  }
  auto family = std::make_unique<HistogramFamily>(
      std::string(name), std::string(help), MetricType::kHistogram, std::move(label_names),
      [bounds = std::move(upper_bounds)] { return std::make_unique<Histogram>(bounds); });
  HistogramFamily* out = family.get();
  CreateUnlabelledChild(*out);
  families_.push_back(std::move(family));
  return out;
}

void Registry::AddCollectHook(std::function<void()> hook) {
  std::unique_lock lock(mu_);
  collect_hooks_.push_back(std::move(hook));
}

std::vector<FamilySnapshot> Registry::Collect() const {
  std::vector<const FamilyBase*> families;
  {
    std::shared_lock lock(mu_);
    for (const auto& hook : collect_hooks_) hook();
    families.reserve(families_.size());
    for (const auto& f : families_) families.push_back(f.get());
  }
  // Families are never removed, so they can be snapshotted outside the registry lock.
  std::vector<FamilySnapshot> out;
  out.reserve(families.size());
  for (const FamilyBase* f : families) out.push_back(f->Snapshot());
  return out;
}

}  // namespace refit::metrics
