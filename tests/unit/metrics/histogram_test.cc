#include "metrics/histogram.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace refit::metrics {
namespace {

using ::testing::ElementsAre;

TEST(Histogram, BoundsAreInclusiveAndCountsCumulative) {
  Histogram h({1, 2, 5});
  for (double v : {0.5, 1.0, 1.0000001, 2.0, 4.0, 5.0, 5.5, 100.0, -3.0}) h.Observe(v);
  HistogramSnapshot s = h.Snapshot();
  EXPECT_THAT(s.upper_bounds, ElementsAre(1, 2, 5));
  // <=1: 0.5, 1.0, -3 ; <=2: +1.0000001, 2.0 ; <=5: +4, 5 ; +Inf: +5.5, 100
  EXPECT_THAT(s.cumulative_counts, ElementsAre(3, 5, 7, 9));
  EXPECT_EQ(s.count, 9u);
  EXPECT_DOUBLE_EQ(s.sum, 0.5 + 1.0 + 1.0000001 + 2.0 + 4.0 + 5.0 + 5.5 + 100.0 - 3.0);
}

TEST(Histogram, NaNCountsOnlyInTheInfBucket) {
  Histogram h({1});
  h.Observe(std::nan(""));
  HistogramSnapshot s = h.Snapshot();
  EXPECT_THAT(s.cumulative_counts, ElementsAre(0, 1));
  EXPECT_TRUE(std::isnan(s.sum));
}

TEST(Histogram, InfinitiesLandAtTheEnds) {
  Histogram h({0, 1});
  h.Observe(-std::numeric_limits<double>::infinity());
  h.Observe(std::numeric_limits<double>::infinity());
  EXPECT_THAT(h.Snapshot().cumulative_counts, ElementsAre(1, 1, 2));
}

TEST(Histogram, NoBoundsMeansOnlyInf) {
  Histogram h({});
  h.Observe(3);
  HistogramSnapshot s = h.Snapshot();
  EXPECT_THAT(s.cumulative_counts, ElementsAre(1));
  EXPECT_EQ(s.sum, 3);
}

TEST(ValidateBucketBounds, RejectsUnsortedDuplicateAndNonFinite) {
  EXPECT_TRUE(ValidateBucketBounds({}).ok());
  EXPECT_TRUE(ValidateBucketBounds({-1, 0, 0.5}).ok());
  EXPECT_FALSE(ValidateBucketBounds({1, 1}).ok());
  EXPECT_FALSE(ValidateBucketBounds({2, 1}).ok());
  EXPECT_FALSE(ValidateBucketBounds({1, std::numeric_limits<double>::infinity()}).ok());
  EXPECT_FALSE(ValidateBucketBounds({std::nan("")}).ok());
  EXPECT_FALSE(ValidateBucketBounds({0, std::nan(""), 1}).ok());
}

TEST(ExponentialBuckets, MultipliesByFactor) {
  EXPECT_THAT(ExponentialBuckets(0.5, 2, 4), ElementsAre(0.5, 1, 2, 4));
  EXPECT_TRUE(ExponentialBuckets(1, 2, 0).empty());
}

}  // namespace
}  // namespace refit::metrics
