// VersionStore (version_store.h): what a stage-only begin may hold, what gives way when a session
// needs room, how versions rotate as they commit, and whose buffers the next session reuses.
#include "refit/version_store.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/memory.h"

namespace refit {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::shared_ptr<StagedVersion> Version(StagedVersion::State state, std::string tag, uint64_t bytes,
                                       bool with_pool = false) {
  auto v = std::make_shared<StagedVersion>();
  v->state = state;
  v->tag = std::move(tag);
  v->bytes = bytes;
  if (with_pool) v->pool = std::make_unique<StagingPool>(storage::NewHostMemory());
  return v;
}

std::vector<std::string> Listed(const VersionStore& store) {
  std::vector<std::string> out;
  for (const VersionInfo& v : store.List()) out.push_back(absl::StrCat(v.state, ":", v.tag, ":", v.version));
  return out;
}

TEST(VersionStoreTest, NothingIsHeldWithoutHold) {
  VersionStore store(0);
  EXPECT_EQ(store.CheckStageOnly("a", false).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.Held("a").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.Previous().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(VersionStoreTest, StageOnlyRefusalsNameTheirReason) {
  VersionStore store(2);
  EXPECT_EQ(store.CheckStageOnly("", false).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.CheckStageOnly("a", true).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(store.CheckStageOnly("a", false).ok());
  store.Keep(Version(StagedVersion::State::kHeld, "a", 10));
  EXPECT_EQ(store.CheckStageOnly("a", false).code(), absl::StatusCode::kAlreadyExists);
  store.Keep(Version(StagedVersion::State::kHeld, "b", 10));
  absl::Status full = store.CheckStageOnly("c", false);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("2 of hold: 2 versions are held (a, b)"));
  EXPECT_EQ(store.bytes(), 20u);
}

// Retained committed versions give way (previous first, then current); held ones never do.
TEST(VersionStoreTest, RoomIsMadeFromThePreviousThenTheCurrentNeverTheHeld) {
  VersionStore store(1);
  store.Keep(Version(StagedVersion::State::kHeld, "h", 40));
  store.Keep(Version(StagedVersion::State::kCurrent, "c", 30));
  store.Keep(Version(StagedVersion::State::kPrevious, "p", 30));
  absl::StatusOr<uint64_t> room = store.MakeRoom(30, 120);
  ASSERT_TRUE(room.ok()) << room.status();
  EXPECT_EQ(*room, 50u);
  EXPECT_THAT(Listed(store), ElementsAre("held:h:0", "current:c:0")) << "the previous gave way";
  room = store.MakeRoom(60, 120);
  ASSERT_TRUE(room.ok());
  EXPECT_EQ(*room, 80u);
  EXPECT_THAT(Listed(store), ElementsAre("held:h:0"));
  absl::StatusOr<uint64_t> none = store.MakeRoom(100, 120);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(none.status().message(), HasSubstr("h 40 bytes"));
  EXPECT_THAT(Listed(store), ElementsAre("held:h:0"));
}

TEST(VersionStoreTest, CommittedVersionsRotateCurrentToPreviousAndDropTheOldPrevious) {
  VersionStore store(2);
  auto first = Version(StagedVersion::State::kCurrent, "s1", 10);
  first->version = 1;
  store.SessionCommitted(first);
  auto second = Version(StagedVersion::State::kCurrent, "s2", 10);
  second->version = 2;
  store.SessionCommitted(second);
  EXPECT_THAT(Listed(store), ElementsAre("current:s2:2", "previous:s1:1"));
  store.SessionCommitted(nullptr);  // a partial refit: the old current is still a whole earlier state
  EXPECT_THAT(Listed(store), ElementsAre("previous:s2:2"));

  // A held version committed becomes current; rolling back to the previous swaps the two.
  auto held = Version(StagedVersion::State::kHeld, "h", 10);
  store.Keep(held);
  store.KeptCommitted(held, 4);
  EXPECT_THAT(Listed(store), ElementsAre("current:h:4")) << "the old previous (s2) was dropped";
  auto older = Version(StagedVersion::State::kPrevious, "old", 10);
  store.Keep(older);
  absl::StatusOr<std::shared_ptr<StagedVersion>> previous = store.Previous();
  ASSERT_TRUE(previous.ok());
  store.KeptCommitted(*previous, 5);
  EXPECT_THAT(Listed(store), ElementsAre("current:old:5", "previous:h:4"));
}

TEST(VersionStoreTest, HeldIsFoundByTagOrNamesTheHeldTags) {
  VersionStore store(2);
  store.Keep(Version(StagedVersion::State::kHeld, "a", 1));
  store.Keep(Version(StagedVersion::State::kCurrent, "c", 1));
  EXPECT_TRUE(store.Held("a").ok());
  absl::Status missing = store.Held("c").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("(held: a)"));
  EXPECT_EQ(store.Previous().status().code(), absl::StatusCode::kFailedPrecondition);
}

// A dropped version's pool serves the next session, unless a commit in flight still holds the
// version; a session's unkept pool is taken only while none is spare.
TEST(VersionStoreTest, ADroppedVersionsPoolIsSpareUnlessACommitHoldsIt) {
  VersionStore store(1);
  store.Keep(Version(StagedVersion::State::kPrevious, "p", 10, /*with_pool=*/true));
  ASSERT_TRUE(store.MakeRoom(100, 100).ok());
  std::unique_ptr<StagingPool> spare = store.TakeSparePool();
  EXPECT_NE(spare, nullptr);
  EXPECT_EQ(store.TakeSparePool(), nullptr);

  auto in_flight = Version(StagedVersion::State::kPrevious, "q", 10, /*with_pool=*/true);
  store.Keep(in_flight);  // a commit of it holds `in_flight`
  ASSERT_TRUE(store.MakeRoom(100, 100).ok());
  EXPECT_EQ(store.TakeSparePool(), nullptr);
  EXPECT_NE(in_flight->pool, nullptr) << "the commit's version keeps its buffers";

  store.GiveBackPool(std::move(spare));
  auto another = std::make_unique<StagingPool>(storage::NewHostMemory());
  store.GiveBackPool(std::move(another));
  EXPECT_NE(store.TakeSparePool(), nullptr);
  EXPECT_EQ(store.TakeSparePool(), nullptr) << "at most one is spare";
}

}  // namespace
}  // namespace refit
