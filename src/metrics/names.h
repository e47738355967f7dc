// Validation of metric and label names against the Prometheus data model and naming
// conventions, applied once at registration so that exposition never has to reject a name.
// Thread-safe: pure functions.
#ifndef REFIT_METRICS_NAMES_H_
#define REFIT_METRICS_NAMES_H_

#include <string_view>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "metrics/snapshot.h"

namespace refit::metrics {

// Metric names match [a-zA-Z_][a-zA-Z0-9_]* (the data model also allows ':', which is reserved
// for recording rules and so rejected here). Counters must end in "_total"; other types must
// not. Errors name the offending metric.
absl::Status ValidateMetricName(std::string_view name, MetricType type);

// Label names match [a-zA-Z_][a-zA-Z0-9_]*, must not start with "__" (reserved for Prometheus),
// must be unique within a family, and histograms must not use "le". Errors name the metric and
// the label.
absl::Status ValidateLabelNames(std::string_view metric_name, MetricType type,
                                absl::Span<const std::string> label_names);

}  // namespace refit::metrics

#endif  // REFIT_METRICS_NAMES_H_
