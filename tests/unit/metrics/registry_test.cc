#include "metrics/registry.h"

#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace refit::metrics {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(Registry, LabelsReturnsTheSameChildForTheSameValues) {
  Registry r;
  CounterFamily* f = *r.AddCounter("x_total", "help", {"a", "b"});
  Counter& c1 = f->Labels({"1", "2"});
  Counter& c2 = f->Labels({"1", "2"});
  Counter& c3 = f->Labels({"2", "1"});
  EXPECT_EQ(&c1, &c2);
  EXPECT_NE(&c1, &c3);
  c1.Inc(2);
  c2.Inc(0.5);
  EXPECT_EQ(c1.Value(), 2.5);
  EXPECT_EQ(c3.Value(), 0);
}

TEST(Registry, CounterIgnoresNegativeAndNaNIncrements) {
  Registry r;
  Counter& c = (*r.AddCounter("x_total", "help"))->Labels({});
  c.Inc();
  c.Inc(-5);
  c.Inc(std::nan(""));
  EXPECT_EQ(c.Value(), 1);
}

TEST(Registry, GaugeMovesBothWays) {
  Registry r;
  Gauge& g = (*r.AddGauge("g", "help"))->Labels({});
  g.Set(10);
  g.Inc(2.5);
  g.Dec();
  g.Dec(20);
  EXPECT_EQ(g.Value(), -8.5);
}

TEST(Registry, CollectIsInRegistrationOrderWithChildrenSortedByLabels) {
  Registry r;
  GaugeFamily* b = *r.AddGauge("b", "help b", {"k"});
  CounterFamily* a = *r.AddCounter("a_total", "help a");
  b->Labels({"z"}).Set(1);
  b->Labels({"m"}).Set(2);
  std::vector<FamilySnapshot> snap = r.Collect();
  ASSERT_EQ(snap.size(), 2u);
  EXPECT_EQ(snap[0].name, "b");
  EXPECT_EQ(snap[0].type, MetricType::kGauge);
  EXPECT_THAT(snap[0].label_names, ElementsAre("k"));
  ASSERT_EQ(snap[0].children.size(), 2u);
  EXPECT_THAT(snap[0].children[0].label_values, ElementsAre("m"));
  EXPECT_EQ(snap[0].children[0].value, 2);
  EXPECT_THAT(snap[0].children[1].label_values, ElementsAre("z"));
  // A family without labels has its child from registration on.
  EXPECT_EQ(snap[1].name, "a_total");
  ASSERT_EQ(snap[1].children.size(), 1u);
  EXPECT_TRUE(snap[1].children[0].label_values.empty());
  (void)a;
}

TEST(Registry, RejectsDuplicateNames) {
  Registry r;
  ASSERT_TRUE(r.AddGauge("dup", "h").ok());
  absl::StatusOr<GaugeFamily*> again = r.AddGauge("dup", "h");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("'dup'"));
  EXPECT_FALSE(r.AddHistogram("dup", "h", {1}).ok());
}

TEST(Registry, RejectsCollisionsWithHistogramSeriesInEitherOrder) {
  Registry r;
  ASSERT_TRUE(r.AddHistogram("lat_seconds", "h", {1}).ok());
  EXPECT_EQ(r.AddGauge("lat_seconds_count", "h").status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(r.AddGauge("lat_seconds_bucket", "h").status().code(),
            absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(r.AddGauge("size_bytes_sum", "h").ok());
  absl::StatusOr<HistogramFamily*> h = r.AddHistogram("size_bytes", "h", {1});
  EXPECT_EQ(h.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(h.status().message()), HasSubstr("'size_bytes_sum'"));
  // A failed registration reserves nothing.
  EXPECT_TRUE(r.AddGauge("size_bytes_count", "h").ok());
}

TEST(Registry, RejectsInvalidNamesHelpAndBuckets) {
  Registry r;
  EXPECT_EQ(r.AddCounter("bad-name_total", "h").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.AddCounter("no_suffix", "h").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.AddGauge("g", "h", {"__x"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.AddGauge("g", "").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.AddGauge("g", "bad \xFF utf8").status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<HistogramFamily*> h = r.AddHistogram("h_seconds", "h", {2, 1});
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(h.status().message()), HasSubstr("histogram 'h_seconds'"));
  EXPECT_EQ(r.AddHistogram("h_seconds", "h", {1}, {"le"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // None of the rejected names was taken.
  EXPECT_TRUE(r.AddGauge("g", "h").ok());
  EXPECT_TRUE(r.AddHistogram("h_seconds", "h", {1}).ok());
  EXPECT_EQ(r.Collect().size(), 2u);
}

TEST(RegistryDeathTest, WrongNumberOfLabelValuesAbortsNamingTheFamily) {
  Registry r;
  CounterFamily* f = *r.AddCounter("x_total", "h", {"a", "b"});
  EXPECT_DEATH(f->Labels({"only_one"}), "metric 'x_total': 1 label values given, 2");
}

// N threads update shared children (creating them concurrently on first use); totals are exact.
TEST(Registry, ConcurrentUpdatesGiveExactTotals) {
  Registry r;
  CounterFamily* counters = *r.AddCounter("events_total", "h", {"kind"});
  Gauge& gauge = (*r.AddGauge("level", "h"))->Labels({});
  HistogramFamily* hist = *r.AddHistogram("obs", "h", {1, 2}, {"kind"});
  constexpr int kThreads = 8;
  constexpr int kIters = 50000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIters; ++i) {
        counters->Labels({"shared"}).Inc();
        counters->Labels({t % 2 ? "odd" : "even"}).Inc(2);
        gauge.Inc(3);
        gauge.Dec(1);
        hist->Labels({"shared"}).Observe(i % 3);  // 0, 1, 2 in turn
      }
    });
  }
  // Scrapes run concurrently with the updates.
  for (int i = 0; i < 50; ++i) {
    for (const FamilySnapshot& f : r.Collect()) {
      for (const ChildSnapshot& c : f.children) {
        if (f.type == MetricType::kHistogram) {
          EXPECT_EQ(c.histogram.cumulative_counts.back(), c.histogram.count);
        }
      }
    }
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(counters->Labels({"shared"}).Value(), kThreads * kIters);
  EXPECT_EQ(counters->Labels({"odd"}).Value(), 2.0 * (kThreads / 2) * kIters);
  EXPECT_EQ(counters->Labels({"even"}).Value(), 2.0 * (kThreads / 2) * kIters);
  EXPECT_EQ(gauge.Value(), 2.0 * kThreads * kIters);
  HistogramSnapshot h = hist->Labels({"shared"}).Snapshot();
  const uint64_t total = uint64_t{kThreads} * kIters;
  const uint64_t zeros = uint64_t{kThreads} * ((kIters + 2) / 3);
  const uint64_t ones = uint64_t{kThreads} * ((kIters + 1) / 3);
  EXPECT_THAT(h.cumulative_counts, ElementsAre(zeros + ones, total, total));
  EXPECT_EQ(h.count, total);
  EXPECT_EQ(h.sum, static_cast<double>(ones + 2 * (total - zeros - ones)));
  EXPECT_EQ(r.Collect()[0].children.size(), 3u);
}

}  // namespace
}  // namespace refit::metrics
