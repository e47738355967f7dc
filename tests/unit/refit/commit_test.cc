// The commit protocol through the node, in-process (node_fixture.h): every branch of a commit
// (Commit's phases: validate, prepare, audit, pause, copy, verify, resume) ends with one typed
// outcome, and the engine's bytes, version and dirty flag say what the protocol promises.
#include "node_fixture.h"

namespace refit {
namespace node_test {

TEST_F(NodeTest, CommitPausesCopiesResumesAndAdvancesTheVersion) {
  ScriptedControl* control;
  Register(&control);
  std::vector<uint8_t> p = Payload(1);
  const RefitReport& r = CommitNow(Send(p, kParams));
  EXPECT_EQ(r.outcome, Outcome::kCommitted) << r.reason;
  EXPECT_EQ(r.cause, EndCause::kNone);
  EXPECT_EQ(r.version, 1u);
  EXPECT_TRUE(ReportStatus(r).ok());
  EXPECT_EQ(EngineBytes(), p);
  EXPECT_THAT(control->calls, ElementsAre("pause", "resume:1"));
  EXPECT_EQ(node_->version(), 1u);
  EXPECT_FALSE(node_->session_active());
  EXPECT_EQ(node_->committed(), 1u);
  ASSERT_EQ(reports_.size(), 1u);

  // The next refit is version 2.
  std::vector<uint8_t> q = Payload(9);
  EXPECT_EQ(CommitNow(Send(q, kParams)).version, 2u);
  EXPECT_EQ(EngineBytes(), q);
}

TEST_F(NodeTest, IncompleteRefitIsRefusedBeforeThePause) {
  ScriptedControl* control;
  Register(&control);
  const std::vector<uint8_t> before = EngineBytes();
  absl::StatusOr<BeginResult> begun = node_->Begin(ManifestOf(kParams), absl::Now());
  ASSERT_TRUE(begun.ok());
  // Nothing announced: every tensor is missing.
  const RefitReport& r = CommitNow(begun->session_id);
  EXPECT_EQ(r.outcome, Outcome::kRefused);
  EXPECT_EQ(r.cause, EndCause::kIncomplete);
  EXPECT_THAT(r.reason, HasSubstr("w.0"));
  EXPECT_EQ(ReportStatus(r).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(control->calls.empty());
  EXPECT_EQ(EngineBytes(), before);
  EXPECT_EQ(node_->version(), 0u);
}

// The commit validates once every tensor has arrived, while the last bucket may still convert (a
// GPU's); a conversion that fails after that still refuses the refit, naming the tensor, before
// the engine is paused.
TEST_F(NodeTest, AConversionThatFailsAfterTheCommitValidatedIsStillRefused) {
  make_converter_ = [] { return std::make_unique<LateFailingConverter>("w.1", absl::Milliseconds(200)); };
  ScriptedControl* control = nullptr;
  Register(&control);
  const RefitReport& r = CommitNow(Send(Payload(3), kParams));
  EXPECT_EQ(r.outcome, Outcome::kRefused);
  EXPECT_THAT(r.reason, HasSubstr("tensor 'w.1': NaN in the input"));
  EXPECT_TRUE(control->calls.empty()) << "never paused";
  EXPECT_EQ(EngineBytes(), std::vector<uint8_t>(kBytes * kParams, 0xAB));
}

TEST_F(NodeTest, PauseErrorLeavesTheEngineUntouched) {
  ScriptedControl* control;
  Register(&control);
  control->pause_status = absl::UnavailableError("the engine disconnected during pause");
  const std::vector<uint8_t> before = EngineBytes();
  const RefitReport& r = CommitNow(Send(Payload(2), kParams));
  EXPECT_EQ(r.outcome, Outcome::kFailed);
  EXPECT_EQ(r.cause, EndCause::kEngineError);
  EXPECT_THAT(r.reason, HasSubstr("untouched"));
  EXPECT_EQ(ReportStatus(r).code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(control->calls, ElementsAre("pause"));
  EXPECT_EQ(EngineBytes(), before);
  EXPECT_FALSE(node_->engine()->dirty);
}

TEST_F(NodeTest, PauseTimeoutSendsTheOldVersionAndRefusesUntilTheEngineAnswers) {
  ScriptedControl* control;
  Register(&control, /*version=*/4);
  control->pause_hangs = true;
  const std::vector<uint8_t> before = EngineBytes();
  const RefitReport& r = CommitNow(Send(Payload(3), kParams));
  EXPECT_EQ(r.outcome, Outcome::kFailed);
  EXPECT_EQ(r.cause, EndCause::kEngineError);
  EXPECT_THAT(r.reason, HasSubstr("did not pause within"));
  // A resume with the version it has follows the pause, not waited for.
  EXPECT_THAT(control->calls, ElementsAre("pause", "resume:4:sent"));
  EXPECT_EQ(EngineBytes(), before);
  EXPECT_EQ(node_->version(), 4u);
  absl::StatusOr<BeginResult> next = node_->Begin(ManifestOf(kParams), absl::Now());
  EXPECT_EQ(next.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(next.status().message(), HasSubstr("did not answer"));
  EXPECT_FALSE(node_->Ready().ok());
  // The engine answers the late calls: refits are taken again.
  control->late = 0;
  control->pause_hangs = false;
  EXPECT_EQ(CommitNow(Send(Payload(4), kParams)).version, 5u);
}

// Found by the fault soak: a dirty engine (paused since an interrupted commit) whose pause then
// timed out was sent the undo-resume and served its mixed bytes as the old version.
TEST_F(NodeTest, PauseTimeoutOfADirtyEngineQueuesNoResume) {
  ScriptedControl* control;
  Register(&control, /*version=*/4, /*dirty=*/true);
  control->pause_hangs = true;
  const RefitReport& r = CommitNow(Send(Payload(3), kParams));
  EXPECT_EQ(r.outcome, Outcome::kFailed);
  EXPECT_EQ(r.cause, EndCause::kEngineError);
  EXPECT_THAT(r.reason, HasSubstr("stays paused and dirty"));
  EXPECT_THAT(control->calls, ElementsAre("pause"));
  EXPECT_TRUE(node_->engine()->dirty);
  // Once it answers, only a full refit brings it back.
  control->late = 0;
  control->pause_hangs = false;
  const RefitReport& full = CommitNow(Send(Payload(4), kParams));
  EXPECT_EQ(full.outcome, Outcome::kCommitted) << full.reason;
  EXPECT_FALSE(node_->engine()->dirty);
}

TEST_F(NodeTest, ResumeTimeoutKeepsTheNewVersionAndMarksTheEngineUnresponsive) {
  ScriptedControl* control;
  Register(&control);
  control->resume_hangs = true;
  std::vector<uint8_t> p = Payload(5);
  const RefitReport& r = CommitNow(Send(p, kParams));
  EXPECT_EQ(r.outcome, Outcome::kFailed);
  EXPECT_EQ(r.cause, EndCause::kEngineError);
  EXPECT_THAT(r.reason, HasSubstr("resume(1)"));
  EXPECT_EQ(EngineBytes(), p);  // the copy landed whole
  EXPECT_EQ(node_->version(), 1u);
  EXPECT_FALSE(node_->engine()->dirty);
  EXPECT_FALSE(node_->Ready().ok());
}

#if REFIT_FAILPOINTS
TEST_F(NodeTest, FailedCopyLeavesTheEnginePausedAndDirtyUntilAFullRefit) {
  failpoints_ = *FailpointSet::Parse("mid_commit=error");
  SetUp();  // the node takes the failpoints at construction
  ScriptedControl* control;
  Register(&control);
  const RefitReport& r = CommitNow(Send(Payload(6), kParams));
  EXPECT_EQ(r.outcome, Outcome::kFailed);
  EXPECT_THAT(r.reason, HasSubstr("dirty"));
  EXPECT_THAT(control->calls, ElementsAre("pause"));  // never resumed with mixed weights
  EXPECT_TRUE(node_->engine()->dirty);
  EXPECT_EQ(node_->version(), 0u);
  absl::StatusOr<BeginResult> partial = node_->Begin(ManifestOf(1, /*partial=*/true), absl::Now());
  EXPECT_EQ(partial.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(partial.status().message(), HasSubstr("dirty"));
}
#endif

TEST_F(NodeTest, TrainerTagsTravelToTheReportTheEngineAndItsResume) {
  ScriptedControl* control;
  Register(&control, /*version=*/0, /*dirty=*/false, "step-0");
  EXPECT_EQ(node_->tag(), "step-0");
  const RefitReport& r = CommitNow(Send(Payload(1), kParams, false, "step-10"));
  ASSERT_EQ(r.outcome, Outcome::kCommitted) << r.reason;
  EXPECT_EQ(r.tag, "step-10");
  EXPECT_EQ(r.version, 1u);  // refitd's own version still orders commits
  EXPECT_EQ(node_->tag(), "step-10");
  EXPECT_EQ(node_->engine()->tag, "step-10");
  EXPECT_THAT(control->tags, ElementsAre("step-10"));

  // A refused refit reports its tag; the engine keeps the one it serves.
  absl::StatusOr<BeginResult> begun = node_->Begin(ManifestOf(kParams, false, "step-20"), absl::Now());
  ASSERT_TRUE(begun.ok());
  const RefitReport& refused = CommitNow(begun->session_id);
  EXPECT_EQ(refused.outcome, Outcome::kRefused);
  EXPECT_EQ(refused.tag, "step-20");
  EXPECT_EQ(node_->tag(), "step-10");

  // Tags need not be ordered or unique: the version keeps counting.
  EXPECT_EQ(CommitNow(Send(Payload(2), kParams, false, "step-10")).version, 2u);
  EXPECT_EQ(CommitNow(Send(Payload(3), kParams)).tag, "");
  EXPECT_EQ(node_->tag(), "");
}

TEST_F(NodeTest, APauseTimeoutResumesWithTheTagTheEngineHas) {
  ScriptedControl* control;
  Register(&control, /*version=*/4, /*dirty=*/false, "step-4");
  control->pause_hangs = true;
  EXPECT_EQ(CommitNow(Send(Payload(3), kParams, false, "step-5")).outcome, Outcome::kFailed);
  EXPECT_THAT(control->calls, ElementsAre("pause", "resume:4:sent"));
  EXPECT_THAT(control->tags, ElementsAre("step-4"));
  EXPECT_EQ(node_->tag(), "step-4");
}


TEST_F(NodeTest, VerifyAfterCommitPassesAGoodCopy) {
  verify_ = true;
  SetUp();
  ScriptedControl* control;
  Register(&control);
  std::vector<uint8_t> p = Payload(11);
  const RefitReport& r = CommitNow(Send(p, kParams, false, "step-1"));
  EXPECT_EQ(r.outcome, Outcome::kCommitted) << r.reason;
  EXPECT_GE(r.times.verify_ms, 0.0);
  EXPECT_EQ(EngineBytes(), p);
  EXPECT_EQ(node_->verify_mismatches(), 0u);
  EXPECT_THAT(control->calls, ElementsAre("pause", "resume:1"));
}

#if REFIT_FAILPOINTS
TEST_F(NodeTest, VerifyAfterCommitCatchesACorruptedCopy) {
  failpoints_ = *FailpointSet::Parse("corrupt_copy=error@1");
  verify_ = true;
  SetUp();
  ScriptedControl* control;
  Register(&control, /*version=*/0, /*dirty=*/false, "step-0");
  std::vector<uint8_t> p = Payload(12);
  const RefitReport& r = CommitNow(Send(p, kParams, false, "step-1"));
  EXPECT_EQ(r.outcome, Outcome::kFailed);
  EXPECT_EQ(r.cause, EndCause::kVerifyMismatch);
  EXPECT_STREQ(EndCauseName(r.cause), "verify_mismatch");
  EXPECT_EQ(ReportStatus(r).code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.reason, HasSubstr("w.0"));
  EXPECT_THAT(r.reason, Not(HasSubstr("w.1")));
  EXPECT_THAT(r.reason, HasSubstr("dirty"));
  EXPECT_THAT(control->calls, ElementsAre("pause"));  // never resumed with the corrupt bytes
  EXPECT_TRUE(node_->engine()->dirty);
  EXPECT_EQ(node_->version(), 0u);
  EXPECT_EQ(node_->tag(), "step-0");
  EXPECT_EQ(node_->verify_mismatches(), 1u);
  EXPECT_NE(EngineBytes(), p);
  // A partial refit is refused; the next full refit (the failpoint fires once) lands clean.
  EXPECT_EQ(node_->Begin(ManifestOf(1, /*partial=*/true), absl::Now()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const RefitReport& again = CommitNow(Send(p, kParams, false, "step-1"));
  EXPECT_EQ(again.outcome, Outcome::kCommitted) << again.reason;
  EXPECT_EQ(EngineBytes(), p);
  EXPECT_FALSE(node_->engine()->dirty);
  EXPECT_EQ(node_->tag(), "step-1");
}

TEST_F(NodeTest, ACorruptedCopyGoesUnnoticedWithoutVerify) {
  failpoints_ = *FailpointSet::Parse("corrupt_copy=error@1");
  SetUp();
  Register();
  std::vector<uint8_t> p = Payload(13);
  const RefitReport& r = CommitNow(Send(p, kParams));
  EXPECT_EQ(r.outcome, Outcome::kCommitted) << r.reason;
  std::vector<uint8_t> want = p;
  want[0] ^= 0x01;  // the failpoint flips one bit of the first parameter
  EXPECT_EQ(EngineBytes(), want);
}
#endif

// resume_on_loop: RunCommit writes the engine's memory and leaves the resume to the loop thread,
// which sends it without blocking (StartLoopResume) and finishes the commit on its answer; a
// control that cannot resume from the loop resumes from the worker (RunResume).
TEST_F(NodeTest, TheResumeOnTheLoopFinishesTheCommitWhenTheEngineAnswers) {
  resume_on_loop_ = true;
  SetUp();
  ScriptedControl* control = nullptr;
  Register(&control);
  auto commit_until_resume = [&](uint8_t seed) {
    const uint64_t id = Send(Payload(seed), kParams, false, absl::StrCat("step-", static_cast<int>(seed)));
    absl::StatusOr<std::shared_ptr<Commit>> c = node_->StartCommit(id);
    EXPECT_TRUE(c.ok()) << c.status();
    (*c)->Run();
    EXPECT_TRUE((*c)->resume_pending());
    EXPECT_EQ(EngineBytes(), Payload(seed));  // written in the window, before the resume
    return *c;
  };
  std::shared_ptr<Commit> c = commit_until_resume(1);
  control->resumes_on_loop = true;
  bool done = false;
  ASSERT_TRUE(Commit::StartLoopResume(c, [&] { done = true; }));
  EXPECT_FALSE(done);
  EXPECT_EQ(control->calls.back(), "resume:1:loop");
  EXPECT_EQ(control->tags.back(), "step-1");
  control->AnswerResume(absl::OkStatus());
  EXPECT_TRUE(done);
  EXPECT_FALSE(c->resume_pending());
  const RefitReport& r = node_->FinishCommit(*c);
  EXPECT_EQ(r.outcome, Outcome::kCommitted) << r.reason;
  EXPECT_EQ(node_->version(), 1u);
  // Unanswered in time: the commit fails naming the resume; the engine holds the new version.
  c = commit_until_resume(2);
  ASSERT_TRUE(Commit::StartLoopResume(c, [] {}));
  control->AnswerResume(absl::DeadlineExceededError("no answer"));
  const RefitReport& late = node_->FinishCommit(*c);
  EXPECT_EQ(late.outcome, Outcome::kFailed);
  EXPECT_THAT(late.reason, HasSubstr("did not answer resume(2)"));
  // A control that cannot: nothing sent, the worker resumes.
  control->resumes_on_loop = false;
  c = commit_until_resume(3);
  const size_t calls = control->calls.size();
  EXPECT_FALSE(Commit::StartLoopResume(c, [] { ADD_FAILURE() << "not to be called"; }));
  EXPECT_EQ(control->calls.size(), calls);
  c->RunResume();
  EXPECT_EQ(control->calls.back(), "resume:3");
  EXPECT_EQ(node_->FinishCommit(*c).outcome, Outcome::kCommitted);
  EXPECT_EQ(node_->version(), 3u);
}

TEST_F(NodeTest, AStaleShmRegionIsRefusedNamingItsParameters) {
  ScriptedControl* control = nullptr;
  Register(&control);
  // The engine replaced its region under the same name: refitd's mapping is of the old object.
  region_.reset();  // unlinks the name
  std::unique_ptr<storage::ShmRegion> replaced = *storage::ShmRegion::Create(region_name_, kBytes * kParams);
  const RefitReport& r = CommitNow(Send(Payload(6), kParams));
  EXPECT_EQ(r.outcome, Outcome::kRefused);
  EXPECT_THAT(r.reason, HasSubstr("stale registration"));
  EXPECT_THAT(r.reason, HasSubstr("'w.0', 'w.1'"));
  EXPECT_THAT(r.reason, HasSubstr("replaced"));
  EXPECT_TRUE(control->calls.empty());  // never paused
  EXPECT_EQ(control->audits, 0);       // refitd's own audit refused first
  region_ = std::move(replaced);
}

TEST_F(NodeTest, TheEnginesAuditNamesStaleParametersAndTheRefitIsRefused) {
  ScriptedControl* control = nullptr;
  Register(&control);
  control->audit_stale = {"w.1"};
  const RefitReport& r = CommitNow(Send(Payload(7), kParams));
  EXPECT_EQ(r.outcome, Outcome::kRefused);
  EXPECT_THAT(r.reason, HasSubstr("parameter 'w.1'"));
  EXPECT_THAT(r.reason, HasSubstr("nothing was written"));
  EXPECT_THAT(control->calls, ElementsAre("pause", "resume:0"));  // resumed at the version it holds
  EXPECT_EQ(control->audits, 1);
  EXPECT_EQ(node_->version(), 0u);
  EXPECT_EQ(EngineBytes(), std::vector<uint8_t>(kBytes * kParams, 0xAB));
  control->audit_stale.clear();
  EXPECT_EQ(CommitNow(Send(Payload(8), kParams)).outcome, Outcome::kCommitted);
}


}  // namespace node_test
}  // namespace refit
