// GroupMember, the engine-group member's state machine (docs/architecture.md "Engine groups"),
// with an injected clock: the phases of one group version, refusals out of order, the deadline of
// a copied member, and joining after a start or an engine that registered elsewhere.
#include "refit/group_member.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/fake_clock.h"

namespace refit {
namespace {

using ::testing::HasSubstr;

GroupOptions TwoMembers() {
  GroupOptions o;
  o.name = "engine-a";
  o.members = 2;
  o.member = 1;
  o.decision_timeout = absl::Seconds(5);
  return o;
}

// Lands group version `tag` on `m` (copied, then resumed).
void Land(GroupMember& m, const std::string& tag) {
  ASSERT_TRUE(m.StartCommit(tag, absl::ZeroDuration()).ok());
  m.Copied();
  ASSERT_TRUE(m.StartResume(tag).ok());
  m.Resumed(true);
}

TEST(GroupMemberTest, ADaemonStartsJoiningAndIsReadyOnceAGroupVersionLands) {
  FakeClock clock;
  GroupMember m(TwoMembers(), &clock);
  EXPECT_TRUE(m.enabled());
  EXPECT_EQ(m.phase(), GroupPhase::kJoining);
  EXPECT_THAT(m.Ready().message(), HasSubstr("joining"));
  ASSERT_TRUE(m.StartCommit("v1", absl::ZeroDuration()).ok());
  EXPECT_EQ(m.phase(), GroupPhase::kCopying);
  m.Copied();
  EXPECT_EQ(m.phase(), GroupPhase::kCopied);
  EXPECT_EQ(m.DeadlineLeft(), absl::Seconds(5));  // the config's decision timeout
  ASSERT_TRUE(m.StartResume("v1").ok());
  m.Resumed(true);
  EXPECT_EQ(m.phase(), GroupPhase::kIdle);
  EXPECT_EQ(m.tag(), "v1");
  EXPECT_TRUE(m.Ready().ok());
  EXPECT_EQ(m.commits(), 1u);
}

TEST(GroupMemberTest, NoGroupIsAlwaysReadyAndRefusesGroupCommits) {
  FakeClock clock;
  GroupMember m(GroupOptions{}, &clock);
  EXPECT_FALSE(m.enabled());
  EXPECT_TRUE(m.Ready().ok());
  EXPECT_EQ(m.StartCommit("v1", absl::ZeroDuration()).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(GroupMemberTest, OneVersionAtATimeAndResumeOnlyOfTheCopiedOne) {
  FakeClock clock;
  GroupMember m(TwoMembers(), &clock);
  Land(m, "v0");
  ASSERT_TRUE(m.StartCommit("v1", absl::Seconds(1)).ok());
  EXPECT_THAT(m.StartCommit("v2", absl::Seconds(1)).message(), HasSubstr("'v1' is copying"));
  EXPECT_EQ(m.StartResume("v1").code(), absl::StatusCode::kFailedPrecondition);  // not copied yet
  m.Copied();
  EXPECT_THAT(m.StartResume("v2").message(), HasSubstr("cannot resume 'v2'"));
  EXPECT_FALSE(m.StartRestore("v2", false));  // another version: nothing to restore
  EXPECT_TRUE(m.StartRestore("v1", false));
  EXPECT_EQ(m.phase(), GroupPhase::kRestoring);
  m.Restored(true, "");
  EXPECT_EQ(m.phase(), GroupPhase::kIdle);
  EXPECT_FALSE(m.dirty());  // the coordinator's abort leaves the group clean
  EXPECT_EQ(m.aborts(), 1u);
}

TEST(GroupMemberTest, ACopiedMemberPastItsDeadlineRestoresAndMarksTheGroupDirty) {
  FakeClock clock;
  GroupMember m(TwoMembers(), &clock);
  Land(m, "v0");
  ASSERT_TRUE(m.StartCommit("v1", absl::Milliseconds(800)).ok());
  m.Copied();
  clock.Advance(absl::Milliseconds(799));
  EXPECT_FALSE(m.Expired());
  EXPECT_EQ(m.DeadlineLeft(), absl::Milliseconds(1));
  clock.Advance(absl::Milliseconds(1));
  EXPECT_TRUE(m.Expired());
  ASSERT_TRUE(m.StartRestore("v1", /*expired=*/true));
  m.Restored(true, "");
  EXPECT_TRUE(m.dirty());
  EXPECT_THAT(m.reason(), HasSubstr("before this member's deadline"));
  EXPECT_EQ(m.expiries(), 1u);
  EXPECT_THAT(m.Ready().message(), HasSubstr("dirty"));
  // The coordinator's late resume is refused: it learns the group is dirty.
  EXPECT_THAT(m.StartResume("v1").message(), HasSubstr("group dirty"));
  // The next group version cleans it.
  ASSERT_TRUE(m.StartCommit("v2", absl::ZeroDuration()).ok());
  m.Copied();
  ASSERT_TRUE(m.StartResume("v2").ok());
  m.Resumed(true);
  EXPECT_FALSE(m.dirty());
  EXPECT_TRUE(m.Ready().ok());
}

TEST(GroupMemberTest, ARestoreThatFailsLeavesTheGroupDirty) {
  FakeClock clock;
  GroupMember m(TwoMembers(), &clock);
  ASSERT_TRUE(m.StartCommit("v1", absl::ZeroDuration()).ok());
  m.Copied();
  ASSERT_TRUE(m.StartRestore("v1", false));
  m.Restored(false, "the version it held is not kept in staging");
  EXPECT_TRUE(m.dirty());
  EXPECT_THAT(m.reason(), HasSubstr("not kept in staging"));
}

TEST(GroupMemberTest, AnAbortWhileCopyingIsRememberedForTheEndOfTheCopy) {
  FakeClock clock;
  GroupMember m(TwoMembers(), &clock);
  ASSERT_TRUE(m.StartCommit("v1", absl::ZeroDuration()).ok());
  EXPECT_FALSE(m.RequestAbort("v0"));
  EXPECT_TRUE(m.RequestAbort("v1"));
  EXPECT_TRUE(m.abort_requested());
  m.Copied();
  EXPECT_TRUE(m.StartRestore("v1", false));
  m.Restored(true, "");
  ASSERT_TRUE(m.StartCommit("v2", absl::ZeroDuration()).ok());
  EXPECT_FALSE(m.abort_requested());  // per version
}

TEST(GroupMemberTest, AnEngineRegisteringWithAnotherVersionJoinsAgain) {
  FakeClock clock;
  GroupMember m(TwoMembers(), &clock);
  ASSERT_TRUE(m.StartCommit("v1", absl::ZeroDuration()).ok());
  m.Copied();
  ASSERT_TRUE(m.StartResume("v1").ok());
  m.Resumed(true);
  m.EngineRegistered("v1", false);  // the same engine again, at the group's version: still ready
  EXPECT_EQ(m.phase(), GroupPhase::kIdle);
  m.EngineRegistered("v0", false);
  EXPECT_EQ(m.phase(), GroupPhase::kJoining);
  EXPECT_THAT(m.reason(), HasSubstr("holding 'v0'"));
  ASSERT_TRUE(m.StartCommit("v2", absl::ZeroDuration()).ok());
  m.Copied();
  ASSERT_TRUE(m.StartResume("v2").ok());
  m.Resumed(true);
  m.EngineRegistered("v2", /*dirty=*/true);
  EXPECT_EQ(m.phase(), GroupPhase::kJoining);
  EXPECT_THAT(m.reason(), HasSubstr("dirty"));
}

TEST(GroupMemberTest, AnAbortedVersionLeavesAJoiningMemberJoining) {
  FakeClock clock;
  GroupMember m(TwoMembers(), &clock);
  ASSERT_TRUE(m.StartCommit("v1", absl::ZeroDuration()).ok());
  m.CommitEnded();
  EXPECT_EQ(m.phase(), GroupPhase::kJoining);
  ASSERT_TRUE(m.StartCommit("v1", absl::ZeroDuration()).ok());
  m.Copied();
  ASSERT_TRUE(m.StartRestore("v1", false));
  m.Restored(true, "");
  EXPECT_EQ(m.phase(), GroupPhase::kJoining);
  EXPECT_FALSE(m.Ready().ok());
}

// Late join: the peers' answers (GroupMember::PeersReported).

TEST(GroupMemberTest, AnEngineHoldingThePeersVersionJoinsWithoutARefit) {
  FakeClock clock;
  GroupMember m(TwoMembers(), &clock);
  EXPECT_FALSE(m.group_version_known());
  EXPECT_FALSE(m.JoinHeld("v7", false));  // nothing known yet: still joining
  m.PeersReported({{0, "v7"}});
  EXPECT_TRUE(m.group_version_known());
  EXPECT_EQ(m.group_version(), "v7");
  EXPECT_THAT(m.reason(), HasSubstr("group engine-a is at version 'v7'"));
  EXPECT_FALSE(m.MustHold("v7", false));
  EXPECT_FALSE(m.JoinHeld("v7", true));  // dirty: only a refit lands on it
  EXPECT_EQ(m.phase(), GroupPhase::kJoining);
  EXPECT_TRUE(m.JoinHeld("v7", false));
  EXPECT_EQ(m.phase(), GroupPhase::kIdle);
  EXPECT_EQ(m.tag(), "v7");
  EXPECT_TRUE(m.Ready().ok());
  EXPECT_EQ(m.commits(), 0u);  // no group version was committed here
}

TEST(GroupMemberTest, AnEngineOnAnotherVersionIsHeldUntilTheNextGroupVersionLands) {
  FakeClock clock;
  GroupMember m(TwoMembers(), &clock);
  EXPECT_FALSE(m.MustHold("", false));  // the group's version unknown: nothing is held
  m.PeersReported({{0, "v7"}});
  EXPECT_TRUE(m.MustHold("", false));  // a fresh engine (initial weights)
  EXPECT_THAT(m.reason(), HasSubstr("group engine-a is at version 'v7'; this member's engine holds ''"));
  EXPECT_THAT(m.Ready().message(), HasSubstr("kept paused"));
  EXPECT_TRUE(m.MustHold("v6", false));
  // The peers asked again (another rank registers): the engine held before is dirty now, paused
  // already, and the reason still says it is kept paused.
  m.PeersReported({{0, "v7"}});
  EXPECT_FALSE(m.MustHold("v6", true));  // dirty: the engine is paused already
  EXPECT_THAT(m.Ready().message(), HasSubstr("kept paused"));
  EXPECT_THAT(m.reason(), HasSubstr("this member's engine holds 'v6', dirty"));
  EXPECT_FALSE(m.JoinHeld("v6", false));
  // The trainer's next group version lands through the group commit: the member serves it.
  Land(m, "v8");
  EXPECT_EQ(m.phase(), GroupPhase::kIdle);
  EXPECT_EQ(m.tag(), "v8");
  EXPECT_TRUE(m.Ready().ok());
  EXPECT_FALSE(m.MustHold("v6", false));  // not joining: nothing to hold
}

TEST(GroupMemberTest, PeersOnDifferentVersionsHoldEveryEngineAndJoinNone) {
  FakeClock clock;
  GroupOptions o = TwoMembers();
  o.members = 3;
  o.member = 2;
  GroupMember m(o, &clock);
  m.PeersReported({{0, "v7"}, {1, "v6"}});
  EXPECT_TRUE(m.group_version_known());
  EXPECT_EQ(m.group_version(), "");
  EXPECT_THAT(m.reason(), HasSubstr("member 0 serves 'v7', member 1 serves 'v6'"));
  EXPECT_TRUE(m.MustHold("v7", false));
  EXPECT_THAT(m.reason(), HasSubstr("at version unknown (member 0 serves 'v7'"));
  EXPECT_FALSE(m.JoinHeld("v7", false));
  EXPECT_EQ(m.phase(), GroupPhase::kJoining);
}

TEST(GroupMemberTest, NoPeerAnsweringChangesNothing) {
  FakeClock clock;
  GroupMember m(TwoMembers(), &clock);
  const std::string before = m.reason();
  m.PeersReported({});
  EXPECT_FALSE(m.group_version_known());
  EXPECT_EQ(m.reason(), before);
  EXPECT_FALSE(m.MustHold("", false));
  // A later answer is taken.
  m.PeersReported({{0, "v2"}});
  EXPECT_EQ(m.group_version(), "v2");
}

TEST(GroupMemberTest, AMemberWithoutAGroupIgnoresPeers) {
  FakeClock clock;
  GroupMember m(GroupOptions{}, &clock);
  m.PeersReported({{0, "v7"}});
  EXPECT_FALSE(m.group_version_known());
  EXPECT_FALSE(m.MustHold("", false));
  EXPECT_FALSE(m.JoinHeld("v7", false));
}

}  // namespace
}  // namespace refit
