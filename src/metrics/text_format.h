// The Prometheus text exposition format, version 0.0.4: HELP and TYPE lines, one line per
// sample, histograms as cumulative _bucket{le=...} series (ending in le="+Inf") plus _sum and
// _count. This is what GET /metrics serves.
// Thread-safe: pure functions over snapshots.
#ifndef REFIT_METRICS_TEXT_FORMAT_H_
#define REFIT_METRICS_TEXT_FORMAT_H_

#include <string>
#include <string_view>

#include "absl/types/span.h"
#include "metrics/registry.h"
#include "metrics/snapshot.h"

namespace refit::metrics {

// The Content-Type of a text exposition, as Prometheus negotiates it.
inline constexpr std::string_view kTextFormatContentType =
    "text/plain; version=0.0.4; charset=utf-8";

// Renders snapshots in order. Families without children are left out (they have no samples).
std::string FormatText(absl::Span<const FamilySnapshot> families);

// Collects `registry` and renders it.
std::string FormatText(const Registry& registry);

// A sample value or bucket bound: "+Inf", "-Inf", "NaN"; otherwise the fewest digits that read
// back to the same double, in fixed notation for decimal exponents -4..20 (so integers such as
// byte counts and versions print whole: "0", "42", "1048576") and scientific beyond
// ("0.25", "0.0001", "1.5e-07", "1e+300").
std::string FormatValue(double value);

// Label values escape backslash, double quote and newline; bytes that are not UTF-8 become
// U+FFFD, since Prometheus rejects a scrape with an invalid label value.
std::string EscapeLabelValue(std::string_view value);

// HELP text escapes backslash and newline.
std::string EscapeHelp(std::string_view help);

}  // namespace refit::metrics

#endif  // REFIT_METRICS_TEXT_FORMAT_H_
