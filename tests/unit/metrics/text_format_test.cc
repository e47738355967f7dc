#include "metrics/text_format.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "gtest/gtest.h"
#include "metrics/registry.h"

namespace refit::metrics {
namespace {

TEST(FormatText, SmallRegistryExactText) {
  Registry r;
  CounterFamily* sessions =
      *r.AddCounter("refit_sessions_total", "Sessions by outcome.", {"outcome", "reason"});
  Gauge& staging = (*r.AddGauge("refit_staging_bytes", "Bytes in staging."))->Labels({});
  HistogramFamily* phase =
      *r.AddHistogram("refit_phase_duration_seconds", "Phase time.", {0.1, 1}, {"phase"});
  *r.AddGauge("empty_family", "No children yet.", {"k"});  // labelled, never used: left out

  sessions->Labels({"committed", "none"}).Inc(3);
  sessions->Labels({"failed", "incomplete"}).Inc();
  staging.Set(1048576);
  Histogram& convert = phase->Labels({"convert"});
  convert.Observe(0.05);
  convert.Observe(0.1);
  convert.Observe(0.5);
  convert.Observe(7);
  phase->Labels({"commit"}).Observe(0.25);

  EXPECT_EQ(FormatText(r),
            "# HELP refit_sessions_total Sessions by outcome.\n"
            "# TYPE refit_sessions_total counter\n"
            "refit_sessions_total{outcome=\"committed\",reason=\"none\"} 3\n"
            "refit_sessions_total{outcome=\"failed\",reason=\"incomplete\"} 1\n"
            "# HELP refit_staging_bytes Bytes in staging.\n"
            "# TYPE refit_staging_bytes gauge\n"
            "refit_staging_bytes 1048576\n"
            "# HELP refit_phase_duration_seconds Phase time.\n"
            "# TYPE refit_phase_duration_seconds histogram\n"
            "refit_phase_duration_seconds_bucket{phase=\"commit\",le=\"0.1\"} 0\n"
            "refit_phase_duration_seconds_bucket{phase=\"commit\",le=\"1\"} 1\n"
            "refit_phase_duration_seconds_bucket{phase=\"commit\",le=\"+Inf\"} 1\n"
            "refit_phase_duration_seconds_sum{phase=\"commit\"} 0.25\n"
            "refit_phase_duration_seconds_count{phase=\"commit\"} 1\n"
            "refit_phase_duration_seconds_bucket{phase=\"convert\",le=\"0.1\"} 2\n"
            "refit_phase_duration_seconds_bucket{phase=\"convert\",le=\"1\"} 3\n"
            "refit_phase_duration_seconds_bucket{phase=\"convert\",le=\"+Inf\"} 4\n"
            "refit_phase_duration_seconds_sum{phase=\"convert\"} 7.65\n"
            "refit_phase_duration_seconds_count{phase=\"convert\"} 4\n");
}

TEST(FormatText, UnlabelledHistogramHasOnlyTheLeLabel) {
  Registry r;
  Histogram& h = (*r.AddHistogram("pause_seconds", "P.", {0.001}))->Labels({});
  h.Observe(0.002);
  EXPECT_EQ(FormatText(r),
            "# HELP pause_seconds P.\n"
            "# TYPE pause_seconds histogram\n"
            "pause_seconds_bucket{le=\"0.001\"} 0\n"
            "pause_seconds_bucket{le=\"+Inf\"} 1\n"
            "pause_seconds_sum 0.002\n"
            "pause_seconds_count 1\n");
}

TEST(FormatText, EscapesLabelValuesAndHelp) {
  Registry r;
  GaugeFamily* g = *r.AddGauge("g", "Line one\nback\\slash \"quotes\" stay", {"v"});
  g->Labels({"a\\b\"c\nd"}).Set(1);
  EXPECT_EQ(FormatText(r),
            "# HELP g Line one\\nback\\\\slash \"quotes\" stay\n"
            "# TYPE g gauge\n"
            "g{v=\"a\\\\b\\\"c\\nd\"} 1\n");
}

TEST(EscapeLabelValue, ReplacesInvalidUtf8AndKeepsValidMultibyte) {
  EXPECT_EQ(EscapeLabelValue("caf\xC3\xA9"), "caf\xC3\xA9");
  EXPECT_EQ(EscapeLabelValue("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(EscapeLabelValue("\xE2\x82"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(EscapeLabelValue(""), "");
  EXPECT_EQ(EscapeLabelValue("tab\tstays"), "tab\tstays");
}

TEST(FormatValue, SpecialValues) {
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
  EXPECT_EQ(FormatValue(-std::nan("")), "NaN");
}

TEST(FormatValue, IntegersWithoutExponentOrFraction) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(-0.0), "0");
  EXPECT_EQ(FormatValue(1), "1");
  EXPECT_EQ(FormatValue(-42), "-42");
  EXPECT_EQ(FormatValue(1e6), "1000000");
  EXPECT_EQ(FormatValue(1700000000), "1700000000");
  EXPECT_EQ(FormatValue(123456789012345), "123456789012345");
  EXPECT_EQ(FormatValue(999999999999999), "999999999999999");
}

TEST(FormatValue, FractionsAndLargeValuesRoundTrip) {
  EXPECT_EQ(FormatValue(0.25), "0.25");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(-2.5), "-2.5");
  EXPECT_EQ(FormatValue(0.0001), "0.0001");
  EXPECT_EQ(FormatValue(0.00025), "0.00025");
  EXPECT_EQ(FormatValue(1e-5), "1e-05");
  EXPECT_EQ(FormatValue(1.5e-7), "1.5e-07");
  EXPECT_EQ(FormatValue(1234567.891), "1234567.891");
  EXPECT_EQ(FormatValue(2e15 + 2), "2000000000000002");
  EXPECT_EQ(FormatValue(1e15), "1000000000000000");
  EXPECT_EQ(FormatValue(1e20), "100000000000000000000");
  EXPECT_EQ(FormatValue(1e21), "1e+21");
  EXPECT_EQ(FormatValue(-3.5e22), "-3.5e+22");
  EXPECT_EQ(FormatValue(1e300), "1e+300");
  EXPECT_EQ(FormatValue(0.1 + 0.2), "0.30000000000000004");
  for (double v : {0.1, 1.0 / 3, 6.02214076e23, 5e-324, 1234567.891, 1e15, 2e15 + 2}) {
    const std::string text = FormatValue(v);
    EXPECT_EQ(std::strtod(text.c_str(), nullptr), v) << text;
  }
}

TEST(FormatText, HandBuiltSnapshotWithSpecialValues) {
  FamilySnapshot f;
  f.name = "temps";
  f.type = MetricType::kGauge;
  f.label_names = {"k"};
  f.children.push_back({{"hot"}, std::numeric_limits<double>::infinity(), {}});
  f.children.push_back({{"unknown"}, std::nan(""), {}});
  // An empty help string leaves out the HELP line.
  EXPECT_EQ(FormatText({f}),
            "# TYPE temps gauge\n"
            "temps{k=\"hot\"} +Inf\n"
            "temps{k=\"unknown\"} NaN\n");
}

}  // namespace
}  // namespace refit::metrics
