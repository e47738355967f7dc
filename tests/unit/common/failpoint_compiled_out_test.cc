// What a release build (REFIT_TESTING=OFF, so no REFIT_FAILPOINTS macro) does with failpoints:
// this file is compiled as refitd's sources are in such a build, whatever the test build's
// setting, and proves that $REFIT_FAILPOINTS arms nothing and REFIT_FAILPOINT never fires.
#undef REFIT_FAILPOINTS

#include <stdlib.h>

#include "common/failpoint.h"
#include "gtest/gtest.h"

namespace refit {
namespace {

static_assert(!kFailpointsCompiledIn);

TEST(FailpointCompiledOutTest, EnvironmentIsIgnored) {
  ASSERT_EQ(setenv("REFIT_FAILPOINTS", "mid_commit=crash;before_commit=error", 1), 0);
  absl::StatusOr<std::unique_ptr<FailpointSet>> armed = ArmFailpointsFromEnvironment();
  ASSERT_TRUE(armed.ok()) << armed.status();
  EXPECT_EQ(*armed, nullptr);
  // Even a misspelled spec, which a test build refuses, is not read at all.
  ASSERT_EQ(setenv("REFIT_FAILPOINTS", "no_such_point=crash", 1), 0);
  EXPECT_TRUE(ArmFailpointsFromEnvironment().ok());
  unsetenv("REFIT_FAILPOINTS");
}

TEST(FailpointCompiledOutTest, MacroNeverFiresEvenWithAnArmedSet) {
  absl::StatusOr<std::unique_ptr<FailpointSet>> set = FailpointSet::Parse("before_commit=error;mid_commit=crash");
  ASSERT_TRUE(set.ok());
  const FailpointSet* fp = set->get();
  EXPECT_TRUE(REFIT_FAILPOINT(fp, failpoints::kBeforeCommit).ok());
  EXPECT_TRUE(REFIT_FAILPOINT(fp, failpoints::kMidCommit).ok());  // would SIGKILL this test
  EXPECT_EQ((*set)->hits(failpoints::kBeforeCommit), 0u);
}

}  // namespace
}  // namespace refit
