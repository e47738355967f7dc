// What a joining member takes from its peers' answers (server/group_peers.h): the versions the
// members of its group serve; peers that are joining, unreachable, in another group or at another
// index are left out, the misconfigured and unreachable ones named. And QueryGroupPeers against
// addresses where nothing listens: each answer names why.
#include "server/group_peers.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace refit::server {
namespace {

using ::testing::ElementsAre;

PeerAnswer Answer(uint32_t member, std::string phase, std::string tag, std::string group = "g") {
  PeerAnswer a;
  a.member = member;
  a.address = "unix:/m" + std::to_string(member);
  a.group = std::move(group);
  a.said_member = member;
  a.phase = std::move(phase);
  a.tag = std::move(tag);
  return a;
}

TEST(GroupPeersTest, ServedVersionsAreThoseOfTheGroupsAnsweringMembers) {
  std::vector<PeerAnswer> answers = {Answer(0, "idle", "v7"), Answer(1, "joining", "v6"), Answer(2, "copied", "v7")};
  std::vector<std::string> problems;
  std::vector<GroupMember::PeerVersion> served = ServedVersions(answers, "g", problems);
  ASSERT_EQ(served.size(), 2u);
  EXPECT_EQ(served[0].member, 0u);
  EXPECT_EQ(served[0].tag, "v7");
  EXPECT_EQ(served[1].member, 2u);  // copying a new version, it still serves v7
  EXPECT_TRUE(problems.empty());
}

TEST(GroupPeersTest, MisconfiguredAndUnreachablePeersAreNamedAndLeftOut) {
  PeerAnswer other = Answer(0, "idle", "v7", "h");
  PeerAnswer none = Answer(1, "", "", "");
  PeerAnswer moved = Answer(2, "idle", "v7");
  moved.said_member = 3;
  PeerAnswer down = Answer(3, "", "");
  down.error = "cannot connect";
  std::vector<std::string> problems;
  EXPECT_TRUE(ServedVersions({other, none, moved, down}, "g", problems).empty());
  EXPECT_THAT(problems, ElementsAre("group.addresses[0] (unix:/m0) is in group 'h', not 'g'",
                                    "group.addresses[1] (unix:/m1) is in no engine group, not 'g'",
                                    "group.addresses[2] (unix:/m2) is member 3 of 'g', not member 2",
                                    "group.addresses[3] (unix:/m3): cannot connect"));
}

TEST(GroupPeersTest, AQueryOfPeersWhereNothingListensNamesEachAndSkipsItself) {
  const std::string dir = ::testing::TempDir();
  std::vector<PeerAnswer> answers =
      QueryGroupPeers({"unix:" + dir + "/absent0.sock", "unix:" + dir + "/self.sock", "unix:" + dir + "/absent2.sock"},
                      1, absl::Milliseconds(500));
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_EQ(answers[0].member, 0u);
  EXPECT_EQ(answers[1].member, 2u);
  for (const PeerAnswer& a : answers) EXPECT_FALSE(a.error.empty()) << a.address;
}

}  // namespace
}  // namespace refit::server
