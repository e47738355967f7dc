#include "metrics/refit_metrics.h"

#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/registry.h"

namespace refit::metrics {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

std::map<std::string, FamilySnapshot> ByName(const Registry& r) {
  std::map<std::string, FamilySnapshot> out;
  for (FamilySnapshot& f : r.Collect()) out[f.name] = std::move(f);
  return out;
}

TEST(RefitMetrics, RegistersExactlyTheCatalogue) {
  Registry r;
  ASSERT_TRUE(RefitMetrics::Register(r, {"0.1.0", "abc123", "Release", true}).ok());
  std::map<std::string, FamilySnapshot> f = ByName(r);
  std::vector<std::pair<std::string, MetricType>> types;
  for (const auto& [name, snap] : f) types.emplace_back(name, snap.type);
  EXPECT_THAT(
      types,
      UnorderedElementsAre(
          Pair("refit_sessions_total", MetricType::kCounter), Pair("refit_received_bytes_total", MetricType::kCounter),
          Pair("refit_converted_bytes_total", MetricType::kCounter),
          Pair("refit_phase_duration_seconds", MetricType::kHistogram),
          Pair("refit_commit_pause_seconds", MetricType::kHistogram),
          Pair("refit_committed_version", MetricType::kGauge),
          Pair("refit_committed_version_timestamp_seconds", MetricType::kGauge),
          Pair("refit_committed_version_info", MetricType::kGauge),
          Pair("refit_verify_mismatches_total", MetricType::kCounter),
          Pair("refit_converted_in_place_bytes_total", MetricType::kCounter),
          Pair("refit_kept_versions", MetricType::kGauge), Pair("refit_staging_bytes", MetricType::kGauge),
          Pair("refit_active_sessions", MetricType::kGauge), Pair("refit_engine_registered", MetricType::kGauge),
          Pair("refit_group_member_info", MetricType::kGauge), Pair("refit_group_phase", MetricType::kGauge),
          Pair("refit_group_dirty", MetricType::kGauge), Pair("refit_group_versions", MetricType::kGauge),
          Pair("refit_group_deadline_expiries", MetricType::kGauge),
          Pair("refit_engine_rank_registered", MetricType::kGauge), Pair("refit_engine_rank_dirty", MetricType::kGauge),
          Pair("refit_engine_rank_version", MetricType::kGauge), Pair("refit_build_info", MetricType::kGauge)));
  EXPECT_THAT(f["refit_sessions_total"].label_names, ElementsAre("outcome", "reason"));
  EXPECT_THAT(f["refit_received_bytes_total"].label_names, ElementsAre("transport"));
  EXPECT_THAT(f["refit_converted_bytes_total"].label_names, ElementsAre("format"));
  EXPECT_THAT(f["refit_phase_duration_seconds"].label_names, ElementsAre("phase"));
  EXPECT_TRUE(f["refit_commit_pause_seconds"].label_names.empty());
  EXPECT_THAT(f["refit_committed_version_info"].label_names, ElementsAre("tag"));
  EXPECT_TRUE(f["refit_committed_version_info"].children.empty());  // until the first commit
  EXPECT_EQ(f["refit_kept_versions"].children.size(), 3u);          // held, current, previous at 0

  // Pre-created series: the four phases, committed/none, and the build info at 1.
  std::vector<std::string> phases;
  for (const ChildSnapshot& c : f["refit_phase_duration_seconds"].children) {
    phases.push_back(c.label_values[0]);
  }
  EXPECT_THAT(phases, UnorderedElementsAre("receive", "convert", "validate", "commit"));
  ASSERT_EQ(f["refit_sessions_total"].children.size(), 1u);
  EXPECT_THAT(f["refit_sessions_total"].children[0].label_values, ElementsAre("committed", "none"));
  ASSERT_EQ(f["refit_build_info"].children.size(), 1u);
  EXPECT_THAT(f["refit_build_info"].children[0].label_values,
              ElementsAre("0.1.0", "abc123", "Release", "true"));
  EXPECT_EQ(f["refit_build_info"].children[0].value, 1);
}

TEST(RefitMetrics, SecondRegistrationOnTheSameRegistryFails) {
  Registry r;
  ASSERT_TRUE(RefitMetrics::Register(r, {}).ok());
  EXPECT_EQ(RefitMetrics::Register(r, {}).status().code(), absl::StatusCode::kAlreadyExists);
}

TEST(RefitMetrics, HelpersUpdateTheirSeries) {
  Registry r;
  RefitMetrics m = *RefitMetrics::Register(r, {});
  m.RecordSession(SessionOutcome::kCommitted, SessionFailureReason::kNone);
  m.RecordSession(SessionOutcome::kFailed, SessionFailureReason::kIncomplete);
  m.RecordSession(SessionOutcome::kFailed, SessionFailureReason::kIncomplete);
  m.ObservePhase(RefitPhase::kConvert, absl::Milliseconds(30));
  m.RecordCommit(7, absl::FromUnixSeconds(1700000000) + absl::Milliseconds(500),
                 absl::Microseconds(800));
  EXPECT_EQ(m.sessions_total->Labels({"committed", "none"}).Value(), 1);
  EXPECT_EQ(m.sessions_total->Labels({"failed", "incomplete"}).Value(), 2);
  HistogramSnapshot convert = m.phase_duration_seconds->Labels({"convert"}).Snapshot();
  EXPECT_EQ(convert.count, 1u);
  EXPECT_DOUBLE_EQ(convert.sum, 0.03);
  EXPECT_EQ(m.committed_version->Value(), 7);
  EXPECT_EQ(m.committed_version_timestamp_seconds->Value(), 1700000000.5);
  HistogramSnapshot pause = m.commit_pause_seconds->Snapshot();
  EXPECT_EQ(pause.count, 1u);
  EXPECT_DOUBLE_EQ(pause.sum, 0.0008);
  // 0.0008 s lies in (0.0005, 0.001]: the fourth bound.
  EXPECT_EQ(pause.upper_bounds[3], 0.001);
  EXPECT_EQ(pause.cumulative_counts[2], 0u);
  EXPECT_EQ(pause.cumulative_counts[3], 1u);
}

TEST(RefitMetrics, TheTagInfoSeriesNamesOnlyTheCurrentTag) {
  Registry r;
  RefitMetrics m = *RefitMetrics::Register(r, {});
  m.SetCommittedTag("step-1");
  m.SetCommittedTag("step-2");
  m.SetCommittedTag("step-2");
  std::map<std::string, FamilySnapshot> f = ByName(r);
  ASSERT_EQ(f["refit_committed_version_info"].children.size(), 1u);
  EXPECT_THAT(f["refit_committed_version_info"].children[0].label_values, ElementsAre("step-2"));
  EXPECT_EQ(f["refit_committed_version_info"].children[0].value, 1);
  m.SetCommittedTag("");
  f = ByName(r);
  ASSERT_EQ(f["refit_committed_version_info"].children.size(), 1u);
  EXPECT_THAT(f["refit_committed_version_info"].children[0].label_values, ElementsAre(""));
  m.verify_mismatches_total->Inc();
  EXPECT_EQ(m.verify_mismatches_total->Value(), 1);
  EXPECT_EQ(LabelValue(SessionFailureReason::kVerifyMismatch), "verify_mismatch");
}

TEST(RefitMetrics, LabelValuesAreTheDocumentedStrings) {
  EXPECT_EQ(LabelValue(SessionOutcome::kAborted), "aborted");
  EXPECT_EQ(LabelValue(SessionFailureReason::kDeadlineExceeded), "deadline_exceeded");
  EXPECT_EQ(LabelValue(SessionFailureReason::kEngineError), "engine_error");
  EXPECT_EQ(LabelValue(RefitPhase::kValidate), "validate");
}

}  // namespace
}  // namespace refit::metrics
