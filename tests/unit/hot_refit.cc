// Linked into a test binary: its tests run with every wait of a refit spinning (common/hot_wait.h),
// as refitd's threads do while a refit is in flight with busy polling on.
#include "common/hot_wait.h"
#include "gtest/gtest.h"

namespace {

class HotRefit : public ::testing::Environment {
 public:
  void SetUp() override { refit::SetRefitHot(true); }
  void TearDown() override { refit::SetRefitHot(false); }
};

::testing::Environment* const hot_refit = ::testing::AddGlobalTestEnvironment(new HotRefit);

}  // namespace
