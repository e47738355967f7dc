// What a joining member takes from its peers' answers (server/group_peers.h): the versions the
// members of its group serve; peers that are joining, unreachable, in another group or at another
// index are left out, the misconfigured and unreachable ones named. And QueryGroupPeers against
// addresses where nothing listens: each answer names why.
#include "server/group_peers.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
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
                      1, absl::Milliseconds(500), "");
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_EQ(answers[0].member, 0u);
  EXPECT_EQ(answers[1].member, 2u);
  for (const PeerAnswer& a : answers) EXPECT_FALSE(a.error.empty()) << a.address;
}

TEST(GroupPeersTest, APeerThatNeverAnswersIsBoundedByTheTimeout) {
  // A socket that listens but never accepts: the connect succeeds (the backlog), the status call
  // is never answered.
  const std::string path = ::testing::TempDir() + "/silent." + std::to_string(::getpid()) + ".sock";
  ::unlink(path.c_str());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(path.size(), sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  const absl::Time start = absl::Now();
  std::vector<PeerAnswer> answers = QueryGroupPeers({"unix:" + path, "unix:/self"}, 1, absl::Milliseconds(300), "");
  const absl::Duration took = absl::Now() - start;
  ::close(fd);
  ::unlink(path.c_str());
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].error, "did not answer its status in time");
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Seconds(10));
}

TEST(GroupPeersTest, UnreachablePeersAreAskedAtOnce) {
  // A TCP listener whose accept queue is full and never drained: the kernel drops further SYNs,
  // so each peer's connect hangs until its timeout. Four such peers asked one after another
  // would take four timeouts.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 0), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  std::vector<int> fillers;
  for (int i = 0; i < 3; ++i) {
    const int c = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ASSERT_GE(c, 0);
    (void)::connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    fillers.push_back(c);
  }
  absl::SleepFor(absl::Milliseconds(100));
  const std::string peer = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  const absl::Time start = absl::Now();
  std::vector<PeerAnswer> answers = QueryGroupPeers({peer, peer, "unix:/self", peer, peer}, 2, absl::Seconds(1), "");
  const absl::Duration took = absl::Now() - start;
  for (int c : fillers) ::close(c);
  ::close(fd);
  ASSERT_EQ(answers.size(), 4u);
  for (const PeerAnswer& a : answers) EXPECT_FALSE(a.error.empty()) << a.member;
  EXPECT_GE(took, absl::Seconds(1));
  EXPECT_LT(took, absl::Seconds(3)) << "the peers were asked one after another";
}

}  // namespace
}  // namespace refit::server
