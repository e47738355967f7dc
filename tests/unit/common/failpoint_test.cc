#include "common/failpoint.h"

#include <chrono>

#include "gtest/gtest.h"

namespace refit {
namespace {

TEST(FailpointTest, EmptySpecArmsNothing) {
  absl::StatusOr<std::unique_ptr<FailpointSet>> set = FailpointSet::Parse("");
  ASSERT_TRUE(set.ok());
  EXPECT_TRUE((*set)->empty());
  EXPECT_TRUE((*set)->Hit(failpoints::kMidCommit).ok());
}

TEST(FailpointTest, ErrorNamesThePoint) {
  absl::StatusOr<std::unique_ptr<FailpointSet>> set = FailpointSet::Parse("after_convert=error");
  ASSERT_TRUE(set.ok()) << set.status();
  absl::Status st = (*set)->Hit(failpoints::kAfterConvert);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_NE(st.message().find("after_convert"), absl::string_view::npos);
  EXPECT_TRUE((*set)->Hit(failpoints::kAfterReceive).ok());  // not armed
}

TEST(FailpointTest, NthHitOnly) {
  absl::StatusOr<std::unique_ptr<FailpointSet>> set = FailpointSet::Parse(" mid_commit = error@2 ; after_copy=delay:1");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_TRUE((*set)->Hit(failpoints::kMidCommit).ok());
  EXPECT_FALSE((*set)->Hit(failpoints::kMidCommit).ok());
  EXPECT_TRUE((*set)->Hit(failpoints::kMidCommit).ok());
  EXPECT_EQ((*set)->hits("mid_commit"), 3u);
}

TEST(FailpointTest, DelaySleeps) {
  absl::StatusOr<std::unique_ptr<FailpointSet>> set = FailpointSet::Parse("before_commit=delay:50");
  ASSERT_TRUE(set.ok());
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE((*set)->Hit(failpoints::kBeforeCommit).ok());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(50));
}

TEST(FailpointTest, CrashKillsTheProcess) {
  absl::StatusOr<std::unique_ptr<FailpointSet>> set = FailpointSet::Parse("after_commit=crash");
  ASSERT_TRUE(set.ok());
  EXPECT_EXIT((void)(*set)->Hit(failpoints::kAfterCommit), testing::KilledBySignal(SIGKILL), "");
}

TEST(FailpointTest, BadSpecsAreErrors) {
  for (const char* spec : {"no_such_point=crash", "mid_commit", "mid_commit=explode", "mid_commit=delay:x",
                           "mid_commit=error@0", "=crash"}) {
    EXPECT_FALSE(FailpointSet::Parse(spec).ok()) << spec;
  }
}

TEST(FailpointTest, MacroCompilesOutWithoutFailpoints) {
  absl::StatusOr<std::unique_ptr<FailpointSet>> set = FailpointSet::Parse("mid_commit=error");
  ASSERT_TRUE(set.ok());
  const FailpointSet* fp = set->get();
  absl::Status st = REFIT_FAILPOINT(fp, failpoints::kMidCommit);
#if defined(REFIT_FAILPOINTS) && REFIT_FAILPOINTS
  EXPECT_FALSE(st.ok());
#else
  EXPECT_TRUE(st.ok());
#endif
  const FailpointSet* none = nullptr;
  EXPECT_TRUE(REFIT_FAILPOINT(none, failpoints::kMidCommit).ok());
}

}  // namespace
}  // namespace refit

#if defined(REFIT_FAILPOINTS) && REFIT_FAILPOINTS
namespace refit {
namespace {

// Test builds arm from $REFIT_FAILPOINTS (failpoint_compiled_out_test.cc: release builds do not).
TEST(FailpointTest, TestBuildsArmFromTheEnvironment) {
  ASSERT_EQ(setenv("REFIT_FAILPOINTS", "before_commit=error", 1), 0);
  absl::StatusOr<std::unique_ptr<FailpointSet>> armed = ArmFailpointsFromEnvironment();
  ASSERT_TRUE(armed.ok() && *armed != nullptr);
  EXPECT_FALSE(REFIT_FAILPOINT(armed->get(), failpoints::kBeforeCommit).ok());
  ASSERT_EQ(setenv("REFIT_FAILPOINTS", "no_such_point=crash", 1), 0);
  EXPECT_FALSE(ArmFailpointsFromEnvironment().ok());
  unsetenv("REFIT_FAILPOINTS");
  EXPECT_EQ(*ArmFailpointsFromEnvironment(), nullptr);
}

}  // namespace
}  // namespace refit
#endif
