// The engine's registration audit walks its in-place records once per mapping (AuditByMapping):
// the driver is asked once for each allocation (or virtual-memory mapping) as exported, and every
// parameter in a stale one is named, in registration order. The driver's own answers are checked
// on a GPU (tests/unit/storage/vmm_storage_test.cc, tests/python).
#include <algorithm>
#include <string>
#include <vector>

#include "client/cuda_export.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace refit::client {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(InPlaceAuditTest, OneQueryPerMappingNamesEveryParameterOfAStaleOne) {
  // Two allocations on device 0 (the second a virtual-memory mapping), one on device 1, and a
  // second mapping at the first one's range with another handle (remapped pieces are distinct).
  const std::vector<InPlaceRecord> records = {
      {"a.0", 0x1000, 0x1000, 0x4000, 0, 0},   {"b.0", 0x9000, 0x9000, 0x2000, 0, 7},
      {"a.1", 0x2000, 0x1000, 0x4000, 0, 0},   {"c.0", 0x1000, 0x1000, 0x4000, 1, 0},
      {"b.1", 0xa000, 0x9000, 0x2000, 0, 7},   {"a.2", 0x3000, 0x1000, 0x4000, 0, 0},
      {"d.0", 0x1000, 0x1000, 0x4000, 0, 9},
  };
  std::vector<std::string> asked;
  auto audit = [&](const std::vector<std::string>& stale_first) {
    asked.clear();
    return AuditByMapping(records, [&](const InPlaceRecord& r) {
      asked.push_back(r.name);
      return std::find(stale_first.begin(), stale_first.end(), r.name) != stale_first.end();
    });
  };
  EXPECT_THAT(audit({}), IsEmpty());
  EXPECT_THAT(asked, ElementsAre("a.0", "b.0", "c.0", "d.0")) << "the first parameter of each mapping";
  EXPECT_THAT(audit({"a.0"}), ElementsAre("a.0", "a.1", "a.2"));
  EXPECT_THAT(audit({"b.0", "d.0"}), ElementsAre("b.0", "b.1", "d.0"));
  EXPECT_THAT(asked, ElementsAre("a.0", "b.0", "c.0", "d.0"));
}

}  // namespace
}  // namespace refit::client
