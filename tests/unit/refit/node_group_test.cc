// Engine groups through the node (node_group.cc), in-process (node_fixture.h): a group version's
// commit split at the resume (the engine paused and copied until the coordinator resumes it), its
// abort after the copy (the version the engine held written back from staging and resumed), the
// deadline of a copied member, and the refusals a member gives to anything but the group.
#include "node_fixture.h"

namespace refit {
namespace node_test {

class NodeGroupTest : public NodeTest {
 protected:
  void SetUp() override {
    hold_ = 2;
    group_.name = "g";
    group_.members = 2;
    group_.member = 0;
    group_.decision_timeout = absl::Seconds(3);
    NodeTest::SetUp();
  }
  // Prepares `tag` (stage-only) and copies it as the group's coordinator commits it: returns the
  // commit, its engine paused.
  std::shared_ptr<Commit> Copy(const std::vector<uint8_t>& payload, const std::string& tag) {
    EXPECT_EQ(Stage(payload, tag).outcome, Outcome::kStaged);
    absl::StatusOr<std::shared_ptr<Commit>> c = node_->StartGroupCommit(tag, absl::ZeroDuration());
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return nullptr;
    (*c)->Run();
    EXPECT_TRUE(node_->FinishGroupCopy(**c));
    return *c;
  }
  const RefitReport& Resume(const std::string& tag) {
    absl::StatusOr<std::shared_ptr<Commit>> c = node_->StartGroupResume(tag);
    EXPECT_TRUE(c.ok()) << c.status();
    (*c)->RunResume();
    return node_->FinishCommit(**c);
  }
  const RefitReport& Abort(const std::string& tag, bool expired) {
    absl::StatusOr<Node::GroupRestore> r = node_->StartGroupAbort(tag, expired);
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_NE(r->commit, nullptr);
    r->commit->RunRestore(r->before.get(), "aborted by the test");
    return node_->FinishCommit(*r->commit);
  }
};

TEST_F(NodeGroupTest, ACopiedVersionHoldsTheEnginePausedUntilTheGroupResumes) {
  ScriptedControl* control;
  Register(&control);
  EXPECT_THAT(node_->Ready().message(), HasSubstr("joining"));
  const std::vector<uint8_t> v1 = Payload(41);
  std::shared_ptr<Commit> c = Copy(v1, "v1");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(node_->group().phase(), GroupPhase::kCopied);
  EXPECT_EQ(EngineBytes(), v1);                       // copied
  EXPECT_THAT(control->calls, ElementsAre("pause"));  // and still paused: no resume sent
  EXPECT_TRUE(node_->committing());
  EXPECT_EQ(node_->version(), 0u);
  const RefitReport& r = Resume("v1");
  EXPECT_EQ(r.outcome, Outcome::kCommitted) << r.reason;
  EXPECT_THAT(r.reason, HasSubstr("group version 'v1'"));
  EXPECT_THAT(control->calls, ElementsAre("pause", "resume:1"));
  EXPECT_THAT(control->tags, ElementsAre("v1"));
  EXPECT_EQ(node_->group().tag(), "v1");
  EXPECT_EQ(node_->group().phase(), GroupPhase::kIdle);
  EXPECT_TRUE(node_->Ready().ok());
  EXPECT_THAT(VersionList(), ElementsAre("current:v1"));
}

TEST_F(NodeGroupTest, AnAbortAfterTheCopyRestoresTheVersionTheEngineHeld) {
  ScriptedControl* control;
  Register(&control);
  const std::vector<uint8_t> v1 = Payload(51), v2 = Payload(52);
  ASSERT_NE(Copy(v1, "v1"), nullptr);
  ASSERT_EQ(Resume("v1").outcome, Outcome::kCommitted);
  ASSERT_NE(Copy(v2, "v2"), nullptr);
  EXPECT_EQ(EngineBytes(), v2);
  const RefitReport& r = Abort("v2", false);
  EXPECT_EQ(r.outcome, Outcome::kAborted) << r.reason;
  EXPECT_THAT(r.reason, HasSubstr("restored to version 1 ('v1')"));
  EXPECT_EQ(EngineBytes(), v1);  // byte for byte what it held
  // Resumed at the version and tag it held: no version was made.
  EXPECT_THAT(control->calls, ElementsAre("pause", "resume:1", "pause", "resume:1"));
  EXPECT_THAT(control->tags, ElementsAre("v1", "v1"));
  EXPECT_EQ(node_->version(), 1u);
  EXPECT_EQ(node_->tag(), "v1");
  EXPECT_FALSE(node_->group().dirty());
  EXPECT_THAT(VersionList(), ElementsAre("current:v1"));  // v2 dropped
  EXPECT_FALSE(node_->engine()->dirty);
}

TEST_F(NodeGroupTest, PastItsDeadlineACopiedMemberRestoresAndTheGroupIsDirty) {
  ScriptedControl* control;
  Register(&control);
  const std::vector<uint8_t> v1 = Payload(61), v2 = Payload(62);
  ASSERT_NE(Copy(v1, "v1"), nullptr);
  ASSERT_EQ(Resume("v1").outcome, Outcome::kCommitted);
  ASSERT_NE(Copy(v2, "v2"), nullptr);
  clock_.Advance(absl::Seconds(2));
  EXPECT_FALSE(node_->group().Expired());
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(node_->group().Expired());
  EXPECT_EQ(Abort("v2", /*expired=*/true).outcome, Outcome::kAborted);
  EXPECT_EQ(EngineBytes(), v1);
  EXPECT_TRUE(node_->group().dirty());
  EXPECT_THAT(node_->Ready().message(), HasSubstr("dirty"));
  // The coordinator's resume, late, is refused.
  EXPECT_EQ(node_->StartGroupResume("v2").status().code(), absl::StatusCode::kFailedPrecondition);
  // The next group version cleans the group.
  ASSERT_NE(Copy(Payload(63), "v3"), nullptr);
  EXPECT_EQ(Resume("v3").outcome, Outcome::kCommitted);
  EXPECT_TRUE(node_->Ready().ok());
}

TEST_F(NodeGroupTest, WithoutAKeptVersionToRestoreTheEngineStaysPausedAndDirty) {
  ScriptedControl* control;
  Register(&control);
  ASSERT_NE(Copy(Payload(71), "v1"), nullptr);  // the engine's version 0 was never staged
  const RefitReport& r = Abort("v1", false);
  EXPECT_EQ(r.outcome, Outcome::kFailed);
  EXPECT_THAT(r.reason, HasSubstr("stays paused and dirty"));
  EXPECT_THAT(control->calls, ElementsAre("pause"));  // never resumed
  EXPECT_TRUE(node_->engine()->dirty);
  EXPECT_TRUE(node_->group().dirty());
}

TEST_F(NodeGroupTest, AnAbortBeforeTheCopyDropsThePreparedVersion) {
  Register();
  ASSERT_EQ(Stage(Payload(81), "v1").outcome, Outcome::kStaged);
  absl::StatusOr<Node::GroupRestore> r = node_->StartGroupAbort("v1", false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->commit, nullptr);
  EXPECT_TRUE(VersionList().empty());
}

TEST_F(NodeGroupTest, AMemberCommitsNothingOnItsOwn) {
  Register();
  Manifest m = ManifestOf(kParams, false, "direct");
  EXPECT_THAT(node_->Begin(m, absl::Now()).status().message(), HasSubstr("refits are stage-only"));
  ASSERT_EQ(Stage(Payload(91), "v1").outcome, Outcome::kStaged);
  EXPECT_THAT(node_->StartVersionCommit("v1").status().message(), HasSubstr("committed by the group's coordinator"));
  EXPECT_EQ(node_->StartRollback().status().code(), absl::StatusCode::kFailedPrecondition);
}

// Late join through the node: the peers said the group serves v7.

TEST_F(NodeGroupTest, AFreshEngineOfAJoiningMemberIsHeldPausedUntilTheNextGroupVersion) {
  ScriptedControl* control;
  Register(&control);                            // a fresh engine: version 0, no tag
  EXPECT_TRUE(node_->GroupJoinHolds().empty());  // the group's version is unknown: nothing held
  node_->GroupPeersReported({{1, "v7"}});
  std::vector<Node::JoinHold> holds = node_->GroupJoinHolds();
  ASSERT_EQ(holds.size(), 1u);
  EXPECT_EQ(holds[0].who, "the engine");
  EXPECT_EQ(holds[0].control.get(), control);
  ASSERT_TRUE(holds[0].control->Pause(absl::Seconds(1)).ok());  // what the server does with it
  EXPECT_TRUE(node_->engine()->dirty);
  EXPECT_TRUE(node_->GroupJoinHolds().empty());  // held once
  EXPECT_THAT(node_->group().reason(), HasSubstr("group g is at version 'v7'; this member's engine holds ''"));
  EXPECT_FALSE(node_->Ready().ok());
  // The group's next version lands on the held engine through the group commit.
  const std::vector<uint8_t> v8 = Payload(21);
  ASSERT_NE(Copy(v8, "v8"), nullptr);
  const RefitReport& r = Resume("v8");
  EXPECT_EQ(r.outcome, Outcome::kCommitted) << r.reason;
  EXPECT_EQ(EngineBytes(), v8);
  EXPECT_THAT(control->calls, ElementsAre("pause", "pause", "resume:1"));
  EXPECT_FALSE(node_->engine()->dirty);
  EXPECT_EQ(node_->group().phase(), GroupPhase::kIdle);
  EXPECT_EQ(node_->group().tag(), "v8");
  EXPECT_TRUE(node_->Ready().ok());
}

TEST_F(NodeGroupTest, AnEngineHoldingTheGroupsVersionJoinsWithoutARefit) {
  ScriptedControl* control;
  Register(&control, 3, false, "v7");
  node_->GroupPeersReported({{1, "v7"}});
  EXPECT_TRUE(node_->GroupJoinHolds().empty());
  EXPECT_EQ(node_->group().phase(), GroupPhase::kIdle);
  EXPECT_EQ(node_->group().tag(), "v7");
  EXPECT_TRUE(node_->Ready().ok());
  EXPECT_TRUE(control->calls.empty());  // never paused
}

TEST_F(NodeGroupTest, ADirtyEngineOfAJoiningMemberIsNotPausedAgain) {
  ScriptedControl* control;
  Register(&control, 3, true, "v7");  // lost its daemon inside a commit window: paused already
  node_->GroupPeersReported({{1, "v7"}});
  EXPECT_TRUE(node_->GroupJoinHolds().empty());
  EXPECT_EQ(node_->group().phase(), GroupPhase::kJoining);
  EXPECT_TRUE(control->calls.empty());
}

// Late join while no peer answers (group.addresses with group.peers_unreachable: hold).
class NodeGroupAskTest : public NodeGroupTest {
 protected:
  void SetUp() override {
    group_.ask_peers = true;
    NodeGroupTest::SetUp();
  }
};

TEST_F(NodeGroupAskTest, NoPeerAnsweredHoldsAFreshEngineUntilOneDoes) {
  ScriptedControl* control;
  Register(&control);
  node_->GroupPeersReported({}, /*answered=*/false);
  std::vector<Node::JoinHold> holds = node_->GroupJoinHolds();
  ASSERT_EQ(holds.size(), 1u);
  EXPECT_FALSE(holds[0].release);
  ASSERT_TRUE(holds[0].control->Pause(absl::Seconds(1)).ok());
  EXPECT_FALSE(node_->engine()->dirty);  // held until a peer answers, not for a refit
  EXPECT_THAT(node_->group().reason(), HasSubstr("no peer of group g answered"));
  EXPECT_TRUE(node_->GroupJoinHolds().empty());  // held once
  // The peers answer, joining themselves (the whole group restarted): nothing is known, it runs.
  node_->GroupPeersReported({}, /*answered=*/true);
  holds = node_->GroupJoinHolds();
  ASSERT_EQ(holds.size(), 1u);
  EXPECT_TRUE(holds[0].release);
  EXPECT_EQ(holds[0].version, 0u);
  EXPECT_EQ(holds[0].tag, "");
  ASSERT_TRUE(holds[0].control->Resume(holds[0].version, holds[0].tag, absl::Seconds(1)).ok());
  EXPECT_THAT(control->calls, ElementsAre("pause", "resume:0"));
  EXPECT_TRUE(node_->GroupJoinHolds().empty());  // released once
  EXPECT_EQ(node_->group().phase(), GroupPhase::kJoining);
  EXPECT_THAT(node_->group().reason(), HasSubstr("the peers that answered know none either"));
}

TEST_F(NodeGroupAskTest, AnEngineHeldUnansweredThatHoldsTheGroupsVersionJoinsOnceAPeerAnswers) {
  ScriptedControl* control;
  Register(&control, 3, false, "v7");
  node_->GroupPeersReported({}, false);
  ASSERT_EQ(node_->GroupJoinHolds().size(), 1u);
  node_->GroupPeersReported({{1, "v7"}}, true);
  std::vector<Node::JoinHold> holds = node_->GroupJoinHolds();
  ASSERT_EQ(holds.size(), 1u);
  EXPECT_TRUE(holds[0].release);
  EXPECT_EQ(holds[0].version, 3u);
  EXPECT_EQ(holds[0].tag, "v7");
  EXPECT_EQ(node_->group().phase(), GroupPhase::kIdle);
  EXPECT_TRUE(node_->Ready().ok());
}

TEST_F(NodeGroupAskTest, AnEngineHeldUnansweredThatHoldsAnotherVersionStaysPausedUntilTheNextGroupVersion) {
  ScriptedControl* control;
  Register(&control);  // fresh
  node_->GroupPeersReported({}, false);
  std::vector<Node::JoinHold> holds = node_->GroupJoinHolds();
  ASSERT_EQ(holds.size(), 1u);
  ASSERT_TRUE(holds[0].control->Pause(absl::Seconds(1)).ok());
  node_->GroupPeersReported({{1, "v7"}}, true);
  EXPECT_TRUE(node_->GroupJoinHolds().empty());  // paused already: it stays so, now dirty
  EXPECT_TRUE(node_->engine()->dirty);
  EXPECT_THAT(node_->group().reason(), HasSubstr("group g is at version 'v7'; this member's engine holds ''"));
  const std::vector<uint8_t> v8 = Payload(21);
  ASSERT_NE(Copy(v8, "v8"), nullptr);
  EXPECT_EQ(Resume("v8").outcome, Outcome::kCommitted);
  EXPECT_EQ(EngineBytes(), v8);
  EXPECT_THAT(control->calls, ElementsAre("pause", "pause", "resume:1"));
  EXPECT_EQ(node_->group().phase(), GroupPhase::kIdle);
}

TEST_F(NodeGroupAskTest, AGroupVersionCommittedWhileHeldUnansweredTakesTheHoldOver) {
  ScriptedControl* control;
  Register(&control);
  node_->GroupPeersReported({}, false);
  std::vector<Node::JoinHold> holds = node_->GroupJoinHolds();
  ASSERT_EQ(holds.size(), 1u);
  ASSERT_TRUE(holds[0].control->Pause(absl::Seconds(1)).ok());
  ASSERT_NE(Copy(Payload(5), "v8"), nullptr);
  EXPECT_EQ(Resume("v8").outcome, Outcome::kCommitted);
  node_->GroupPeersReported({{1, "v8"}}, true);
  EXPECT_TRUE(node_->GroupJoinHolds().empty());  // nothing left to release: the commit resumed it
  EXPECT_THAT(control->calls, ElementsAre("pause", "pause", "resume:1"));
}

class NodeGroupServeTest : public NodeGroupTest {
 protected:
  void SetUp() override {
    group_.ask_peers = true;
    group_.hold_unanswered = false;
    NodeGroupTest::SetUp();
  }
};

TEST_F(NodeGroupServeTest, NoPeerAnsweredLeavesTheEngineRunningWithServe) {
  ScriptedControl* control;
  Register(&control);
  node_->GroupPeersReported({}, false);
  EXPECT_TRUE(node_->GroupJoinHolds().empty());
  EXPECT_TRUE(control->calls.empty());
  EXPECT_FALSE(node_->Ready().ok());  // still joining
}

}  // namespace node_test
}  // namespace refit
