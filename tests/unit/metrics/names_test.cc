#include "metrics/names.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/utf8.h"

namespace refit::metrics {
namespace {

using ::testing::HasSubstr;

TEST(ValidateMetricName, AcceptsConventionalNames) {
  EXPECT_TRUE(ValidateMetricName("refit_sessions_total", MetricType::kCounter).ok());
  EXPECT_TRUE(ValidateMetricName("refit_staging_bytes", MetricType::kGauge).ok());
  EXPECT_TRUE(ValidateMetricName("_x9", MetricType::kGauge).ok());
  EXPECT_TRUE(ValidateMetricName("Refit_Phase_seconds", MetricType::kHistogram).ok());
}

TEST(ValidateMetricName, RejectsInvalidCharactersAndNamesIt) {
  for (const char* bad : {"", "9lives", "a-b", "a b", "a.b", "é", "a:b", "__reserved"}) {
    absl::Status s = ValidateMetricName(bad, MetricType::kGauge);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(s.message()), HasSubstr(std::string("'") + bad + "'")) << bad;
  }
}

TEST(ValidateMetricName, CountersEndInTotalAndOnlyCounters) {
  EXPECT_THAT(std::string(ValidateMetricName("refit_sessions", MetricType::kCounter).message()),
              HasSubstr("must end in '_total'"));
  EXPECT_THAT(std::string(ValidateMetricName("refit_bytes_total", MetricType::kGauge).message()),
              HasSubstr("must not end in '_total'"));
  EXPECT_FALSE(ValidateMetricName("x_total", MetricType::kHistogram).ok());
}

TEST(ValidateLabelNames, AcceptsDistinctIdentifiers) {
  std::vector<std::string> labels = {"outcome", "reason", "_x", "A1"};
  EXPECT_TRUE(ValidateLabelNames("m", MetricType::kCounter, labels).ok());
  EXPECT_TRUE(ValidateLabelNames("m", MetricType::kGauge, {}).ok());
  // "le" is only reserved on histograms.
  std::vector<std::string> le = {"le"};
  EXPECT_TRUE(ValidateLabelNames("m", MetricType::kGauge, le).ok());
}

TEST(ValidateLabelNames, RejectsBadReservedAndDuplicateNames) {
  struct Case {
    std::vector<std::string> labels;
    MetricType type;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{"ok", "a-b"}, MetricType::kGauge, "label name 'a-b' must match"},
      {{"1a"}, MetricType::kGauge, "label name '1a' must match"},
      {{""}, MetricType::kGauge, "label name '' must match"},
      {{"__name__"}, MetricType::kGauge, "'__name__' must not start with '__'"},
      {{"le"}, MetricType::kHistogram, "'le' is reserved"},
      {{"x", "y", "x"}, MetricType::kCounter, "label name 'x' appears twice"},
  };
  for (const Case& c : cases) {
    absl::Status s = ValidateLabelNames("my_metric", c.type, c.labels);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(s.message()), HasSubstr("'my_metric'"));
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message));
  }
}

TEST(Utf8, AcceptsWellFormedText) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("caf\xC3\xA9"));              // U+00E9
  EXPECT_TRUE(IsValidUtf8("\xE2\x82\xAC"));             // U+20AC
  EXPECT_TRUE(IsValidUtf8("\xF0\x9F\x98\x80"));         // U+1F600
  EXPECT_TRUE(IsValidUtf8("\xF4\x8F\xBF\xBF"));         // U+10FFFF
  EXPECT_TRUE(IsValidUtf8(std::string_view("a\0b", 3)));  // NUL is a valid code point
}

TEST(Utf8, RejectsMalformedSequences) {
  EXPECT_FALSE(IsValidUtf8("\x80"));              // stray continuation
  EXPECT_FALSE(IsValidUtf8("\xC3"));              // truncated
  EXPECT_FALSE(IsValidUtf8("\xE2\x82"));          // truncated
  EXPECT_FALSE(IsValidUtf8("\xC3\x28"));          // bad continuation
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF"));          // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xE0\x80\xAF"));      // overlong '/'
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));      // surrogate U+D800
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // U+110000
  EXPECT_FALSE(IsValidUtf8("\xFF"));
  EXPECT_EQ(Utf8SequenceLength("\xE2\x82\xAC", 0), 3u);
  EXPECT_EQ(Utf8SequenceLength("a\xE2\x82\xAC", 1), 3u);
  EXPECT_EQ(Utf8SequenceLength("\xE2\x82", 0), 0u);
}

}  // namespace
}  // namespace refit::metrics
