// Versions kept in staging through the node (hold: K, docs/versions.md), in-process
// (node_fixture.h): stage-only refits held under tags, commits by tag and rollback, what gives way
// when staging is full, and kept versions dropped with their engine.
#include "node_fixture.h"

namespace refit {
namespace node_test {

TEST_F(NodeTest, HeldVersionsAreCommittedOutOfOrder) {
  hold_ = 3;
  SetUp();
  ScriptedControl* control;
  Register(&control);
  const std::vector<uint8_t> before = EngineBytes();
  const std::vector<uint8_t> a = Payload(21), b = Payload(22), c = Payload(23);
  for (const auto& [payload, tag] : {std::pair{a, "a"}, std::pair{b, "b"}, std::pair{c, "c"}}) {
    const RefitReport& r = Stage(payload, tag);
    EXPECT_EQ(r.outcome, Outcome::kStaged) << r.reason;
    EXPECT_STREQ(OutcomeName(r.outcome), "staged");
    EXPECT_TRUE(ReportStatus(r).ok());
    EXPECT_EQ(r.tag, tag);
    EXPECT_EQ(r.version, 0u);
  }
  EXPECT_EQ(EngineBytes(), before);  // staging only: nothing written, nothing paused
  EXPECT_TRUE(control->calls.empty());
  EXPECT_EQ(node_->staged(), 3u);
  std::vector<VersionInfo> held = node_->Versions();
  ASSERT_EQ(held.size(), 3u);
  for (const VersionInfo& v : held) {
    EXPECT_STREQ(v.state, "held");
    EXPECT_EQ(v.bytes, kBytes * kParams);
    EXPECT_NE(v.checksum, 0u);
  }
  EXPECT_NE(held[0].checksum, held[1].checksum);
  EXPECT_EQ(node_->staging_bytes(), 3 * kBytes * kParams);

  const RefitReport& rc = CommitKept("c");
  EXPECT_EQ(rc.outcome, Outcome::kCommitted) << rc.reason;
  EXPECT_EQ(rc.version, 1u);
  EXPECT_EQ(rc.tag, "c");
  EXPECT_EQ(EngineBytes(), c);
  EXPECT_EQ(node_->tag(), "c");
  EXPECT_THAT(VersionList(), ElementsAre("held:a", "held:b", "current:c"));
  EXPECT_EQ(CommitKept("a").version, 2u);
  EXPECT_EQ(EngineBytes(), a);
  EXPECT_EQ(CommitKept("b").version, 3u);
  EXPECT_EQ(EngineBytes(), b);
  EXPECT_THAT(VersionList(), ElementsAre("current:b", "previous:a"));  // c gave way
  EXPECT_THAT(control->tags, ElementsAre("c", "a", "b"));
  EXPECT_EQ(node_->committed(), 3u);
  // A committed held version is no longer held.
  EXPECT_EQ(node_->StartVersionCommit("c").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(NodeTest, RollbackRestoresThePreviousVersionsBytes) {
  hold_ = 1;
  SetUp();
  ScriptedControl* control;
  Register(&control);
  EXPECT_EQ(node_->StartRollback().status().code(), absl::StatusCode::kFailedPrecondition);
  const std::vector<uint8_t> p1 = Payload(31), p2 = Payload(32);
  ASSERT_EQ(CommitNow(Send(p1, kParams, false, "step-1")).outcome, Outcome::kCommitted);
  EXPECT_THAT(VersionList(), ElementsAre("current:step-1"));
  EXPECT_THAT(node_->StartRollback().status().message(), HasSubstr("nothing to roll back to"));
  ASSERT_EQ(CommitNow(Send(p2, kParams, false, "step-2")).outcome, Outcome::kCommitted);
  EXPECT_THAT(VersionList(), ElementsAre("current:step-2", "previous:step-1"));
  const RefitReport& r = CommitKept("");
  EXPECT_EQ(r.outcome, Outcome::kCommitted) << r.reason;
  EXPECT_THAT(r.reason, HasSubstr("rolled back"));
  EXPECT_EQ(r.version, 3u);  // a rollback is a new commit
  EXPECT_EQ(r.tag, "step-1");
  EXPECT_EQ(EngineBytes(), p1);
  EXPECT_EQ(node_->tag(), "step-1");
  EXPECT_THAT(VersionList(), ElementsAre("current:step-1", "previous:step-2"));
  // Rolling back again returns to step-2.
  EXPECT_EQ(CommitKept("").version, 4u);
  EXPECT_EQ(EngineBytes(), p2);
  // A partial refit on top: the whole step-2 becomes the rollback target.
  ASSERT_EQ(CommitNow(Send(Payload(33), 1, /*partial=*/true, "step-3")).outcome, Outcome::kCommitted);
  EXPECT_THAT(VersionList(), ElementsAre("previous:step-2"));
  CommitKept("");
  EXPECT_EQ(EngineBytes(), p2);
}

TEST_F(NodeTest, StagingThatCannotHoldAnotherVersionRefusesClearly) {
  hold_ = 3;
  staging_limit_ = kBytes * kParams * 5 / 2;  // room for two versions and a half
  SetUp();
  Register();
  ASSERT_EQ(Stage(Payload(41), "a").outcome, Outcome::kStaged);
  ASSERT_EQ(Stage(Payload(42), "b").outcome, Outcome::kStaged);
  Manifest m = ManifestOf(kParams, false, "c");
  m.stage_only = true;
  absl::StatusOr<BeginResult> refused = node_->Begin(m, absl::Now());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("staging cannot hold another version"));
  EXPECT_THAT(refused.status().message(), HasSubstr("a 1024 bytes, b 1024 bytes"));
  // An ordinary refit needs the room too.
  EXPECT_EQ(node_->Begin(ManifestOf(kParams), absl::Now()).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(node_->session_active());
  // Committing one makes it the current version, which gives way to the next refit.
  ASSERT_EQ(CommitKept("a").outcome, Outcome::kCommitted);
  EXPECT_EQ(Stage(Payload(43), "c").outcome, Outcome::kStaged);
  EXPECT_THAT(VersionList(), ElementsAre("held:b", "held:c"));
}

TEST_F(NodeTest, StageOnlyRefusalsNameTheirReason) {
  Register();
  Manifest m = ManifestOf(kParams, false, "a");
  m.stage_only = true;
  EXPECT_EQ(node_->Begin(m, absl::Now()).status().code(), absl::StatusCode::kFailedPrecondition);  // hold: 0
  EXPECT_EQ(node_->StartVersionCommit("a").status().code(), absl::StatusCode::kFailedPrecondition);
  hold_ = 1;
  SetUp();
  Register();
  m.tag = "";
  EXPECT_THAT(node_->Begin(m, absl::Now()).status().message(), HasSubstr("needs a tag"));
  m.tag = "a";
  m.partial = true;
  EXPECT_THAT(node_->Begin(m, absl::Now()).status().message(), HasSubstr("full refit"));
  ASSERT_EQ(Stage(Payload(51), "a").outcome, Outcome::kStaged);
  m.partial = false;
  absl::StatusOr<BeginResult> again = node_->Begin(m, absl::Now());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  m.tag = "b";
  absl::StatusOr<BeginResult> full = node_->Begin(m, absl::Now());
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.status().message(), HasSubstr("1 of hold: 1 versions are held (a)"));
  absl::StatusOr<std::shared_ptr<Commit>> unknown = node_->StartVersionCommit("zz");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("held: a"));
}

TEST_F(NodeTest, ANewRefitIsReceivedWhileAHeldVersionCommits) {
  hold_ = 2;
  SetUp();
  Register();
  const std::vector<uint8_t> a = Payload(61), b = Payload(62);
  ASSERT_EQ(Stage(a, "a").outcome, Outcome::kStaged);
  absl::StatusOr<std::shared_ptr<Commit>> held = node_->StartVersionCommit("a");
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_TRUE(node_->committing());
  // A second commit of a kept version waits its turn.
  EXPECT_EQ(node_->StartVersionCommit("a").status().code(), absl::StatusCode::kUnavailable);
  // A new session begins and receives meanwhile ...
  const uint64_t session = Send(b, kParams, false, "b");
  ASSERT_NE(session, 0u);
  // ... but its commit is refused until the held one is done.
  EXPECT_EQ(node_->StartCommit(session).status().code(), absl::StatusCode::kUnavailable);
  (*held)->Run();
  EXPECT_EQ(node_->FinishCommit(**held).outcome, Outcome::kCommitted);
  EXPECT_EQ(EngineBytes(), a);
  EXPECT_TRUE(node_->session_active());
  const RefitReport& r = CommitNow(session);
  EXPECT_EQ(r.outcome, Outcome::kCommitted) << r.reason;
  EXPECT_EQ(r.version, 2u);
  EXPECT_EQ(EngineBytes(), b);
  EXPECT_THAT(VersionList(), ElementsAre("current:b", "previous:a"));
}

TEST_F(NodeTest, ADroppedVersionsBuffersServeTheNextSession) {
  hold_ = 1;
  SetUp();
  Register();
  for (uint8_t seed = 91; seed < 95; ++seed) {
    const std::vector<uint8_t> p = Payload(seed);
    ASSERT_EQ(CommitNow(Send(p, kParams)).outcome, Outcome::kCommitted);
    EXPECT_EQ(EngineBytes(), p);
  }
  // Sessions 1-3 made pools; each commit from session 3 on dropped the version before the
  // previous one, whose pool the next session reused.
  EXPECT_EQ(pools_made_, 3);
  // A refused session's pool goes back too.
  absl::StatusOr<BeginResult> begun = node_->Begin(ManifestOf(kParams), absl::Now());
  ASSERT_TRUE(begun.ok());
  EXPECT_EQ(CommitNow(begun->session_id).outcome, Outcome::kRefused);
  ASSERT_EQ(CommitNow(Send(Payload(95), kParams)).outcome, Outcome::kCommitted);
  EXPECT_EQ(pools_made_, 3);
  EXPECT_EQ(EngineBytes(), Payload(95));
}

TEST_F(NodeTest, KeptVersionsAreDroppedWithTheirEngine) {
  hold_ = 2;
  SetUp();
  const uint64_t id = Register();
  ASSERT_EQ(Stage(Payload(71), "a").outcome, Outcome::kStaged);
  ASSERT_EQ(CommitNow(Send(Payload(72), kParams, false, "b")).outcome, Outcome::kCommitted);
  EXPECT_THAT(VersionList(), ElementsAre("held:a", "current:b"));
  node_->UnregisterEngine(id);
  EXPECT_TRUE(node_->Versions().empty());
  EXPECT_EQ(node_->staging_bytes(), 0u);
  Register();
  EXPECT_EQ(node_->StartVersionCommit("a").status().code(), absl::StatusCode::kNotFound);
}

#if REFIT_FAILPOINTS
TEST_F(NodeTest, AHeldVersionWhoseCommitFailedVerifyStaysHeldAndCommitsLater) {
  failpoints_ = *FailpointSet::Parse("corrupt_copy=error@1");
  verify_ = true;
  hold_ = 1;
  SetUp();
  ScriptedControl* control;
  Register(&control);
  const std::vector<uint8_t> a = Payload(81);
  ASSERT_EQ(Stage(a, "a").outcome, Outcome::kStaged);
  const RefitReport& bad = CommitKept("a");
  EXPECT_EQ(bad.outcome, Outcome::kFailed);
  EXPECT_EQ(bad.cause, EndCause::kVerifyMismatch);
  EXPECT_EQ(bad.tag, "a");
  EXPECT_TRUE(node_->engine()->dirty);
  EXPECT_EQ(node_->verify_mismatches(), 1u);
  EXPECT_THAT(VersionList(), ElementsAre("held:a"));  // nothing to resend: it is still staged
  const RefitReport& good = CommitKept("a");
  EXPECT_EQ(good.outcome, Outcome::kCommitted) << good.reason;
  EXPECT_EQ(EngineBytes(), a);
  EXPECT_FALSE(node_->engine()->dirty);
  EXPECT_THAT(control->calls, ElementsAre("pause", "pause", "resume:1"));
}
#endif


}  // namespace node_test
}  // namespace refit
