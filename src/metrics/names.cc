#include "metrics/names.h"

#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace refit::metrics {
namespace {

bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }

bool IsIdentifier(std::string_view name) {
  if (name.empty() || !IsNameStart(name[0])) return false;
  for (char c : name) {
    if (!IsNameChar(c)) return false;
  }
  return true;
}

}  // namespace

absl::Status ValidateMetricName(std::string_view name_view, MetricType type) {
  // absl::StrCat takes std::string; this absl build has its own string_view type.
  const std::string name(name_view);
  if (!IsIdentifier(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric name '", name, "' must match [a-zA-Z_][a-zA-Z0-9_]*"));
  }
  if (name.starts_with("__")) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric name '", name, "' must not start with '__' (reserved)"));
  }
  const bool ends_total = name.ends_with("_total");
  if (type == MetricType::kCounter && !ends_total) {
    return absl::InvalidArgumentError(
        absl::StrCat("counter '", name, "' must end in '_total'"));
  }
  if (type != MetricType::kCounter && ends_total) {
    return absl::InvalidArgumentError(absl::StrCat(
        std::string(MetricTypeName(type)), " '", name, "' must not end in '_total' (counters only)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateLabelNames(std::string_view metric_name_view, MetricType type,
                                absl::Span<const std::string> label_names) {
  const std::string metric_name(metric_name_view);
  absl::flat_hash_set<std::string_view> seen;
  for (const std::string& label : label_names) {
    if (!IsIdentifier(label)) {
      return absl::InvalidArgumentError(absl::StrCat("metric '", metric_name, "': label name '",
                                                     label, "' must match [a-zA-Z_][a-zA-Z0-9_]*"));
    }
    if (label.starts_with("__")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metric '", metric_name, "': label name '", label, "' must not start with '__'"));
    }
    if (type == MetricType::kHistogram && label == "le") {
      return absl::InvalidArgumentError(absl::StrCat(
          "histogram '", metric_name, "': label name 'le' is reserved for bucket bounds"));
    }
    if (!seen.insert(label).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric '", metric_name, "': label name '", label, "' appears twice"));
    }
  }
  return absl::OkStatus();
}

}  // namespace refit::metrics
