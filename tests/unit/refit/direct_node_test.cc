// staging: direct through the node, in-process (node_fixture.h): the pause at begin (and the
// early pause as a begin arrives), conversion straight into the engine's memory, and what a
// session that ends before its commit leaves the engine.
#include "node_fixture.h"

namespace refit {
namespace node_test {

// The engine pauses when the session begins; every tensor is converted straight into its memory,
// so the commit copies nothing and resumes it: one pause, one resume, the new bytes.
TEST_F(DirectNodeTest, ConvertsIntoTheEngineAndTheCommitCopiesNothing) {
  ScriptedControl* control;
  Register(&control);
  absl::StatusOr<uint64_t> session = BeginDirect(ManifestOf(kParams));
  ASSERT_TRUE(session.ok()) << session.status();
  EXPECT_THAT(control->calls, ElementsAre("pause"));
  EXPECT_EQ(control->audits, 1);  // the engine's audit, answered with the pause
  const std::vector<uint8_t> p = Payload(3);
  SendBucket(*session, p, kParams);
  EXPECT_EQ(EngineBytes(), p) << "converted into the engine's memory before the commit";
  const RefitReport& r = CommitNow(*session);
  EXPECT_EQ(r.outcome, Outcome::kCommitted) << r.reason;
  EXPECT_EQ(r.bytes_in_place, kBytes * kParams);
  EXPECT_EQ(EngineBytes(), p);
  EXPECT_THAT(control->calls, ElementsAre("pause", "resume:1"));
  EXPECT_GE(r.times.pause_ms, r.times.commit_ms);
  EXPECT_FALSE(node_->engine()->dirty);
  // And again: version 2.
  const std::vector<uint8_t> q = Payload(4);
  session = BeginDirect(ManifestOf(kParams));
  ASSERT_TRUE(session.ok());
  SendBucket(*session, q, kParams);
  EXPECT_EQ(CommitNow(*session).version, 2u);
  EXPECT_EQ(EngineBytes(), q);
}

// A bucket announced before the engine has paused (the server hands the session to a pipelined
// begin's announces while the engine pauses): received, but converted only once the pause
// placed the session, and then into the engine's memory: nothing goes through staging.
TEST_F(DirectNodeTest, ABucketAnnouncedBeforeThePauseIsConvertedIntoTheEngineAfterIt) {
  ScriptedControl* control;
  Register(&control);
  absl::StatusOr<BeginResult> begun = node_->Begin(ManifestOf(kParams), absl::Now());
  ASSERT_TRUE(begun.ok()) << begun.status();
  ASSERT_TRUE(begun->pause_first);
  const std::vector<uint8_t> p = Payload(3);
  ASSERT_TRUE(node_->Announce(begun->session_id, Bucket(begun->session_id, p, kParams)).ok());
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(converted_.load(), 0) << "converted before the engine paused";
  EXPECT_THAT(control->calls, ::testing::IsEmpty());
  absl::StatusOr<std::shared_ptr<DirectPause>> pause = node_->StartDirectPause(begun->session_id);
  ASSERT_TRUE(pause.ok()) << pause.status();
  (*pause)->Run();
  ASSERT_TRUE(node_->FinishDirectPause(*pause).ok());
  for (int i = 0; i < 5000 && converted_.load() == 0; ++i) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_GT(converted_.load(), 0) << "the bucket was not converted after the pause";
  EXPECT_EQ(EngineBytes(), p);
  const RefitReport& r = CommitNow(begun->session_id);
  EXPECT_EQ(r.outcome, Outcome::kCommitted) << r.reason;
  EXPECT_EQ(r.bytes_in_place, kBytes * kParams);
  EXPECT_THAT(control->calls, ElementsAre("pause", "resume:1"));
}

// The early pause (the server's begin for a manifest like the last one placed): none before a
// manifest placed anything, nor for another manifest key; adopted by the session, it is the
// session's one pause; not taken (the begin refused), it is undone: the engine resumed at the
// version it holds, and begins are refused as busy until the undo finished.
TEST_F(DirectNodeTest, AnEarlyPauseIsAdoptedOrUndone) {
  ScriptedControl* control;
  Register(&control);
  constexpr uint64_t kKey = 42;
  EXPECT_EQ(node_->StartEarlyPause(kKey), nullptr) << "no manifest placed anything yet";
  absl::StatusOr<uint64_t> session = BeginDirect(ManifestOf(kParams));
  ASSERT_TRUE(session.ok()) << session.status();
  node_->NotePlacing(kKey);
  SendBucket(*session, Payload(3), kParams);
  ASSERT_EQ(CommitNow(*session).outcome, Outcome::kCommitted);
  EXPECT_THAT(control->calls, ElementsAre("pause", "resume:1"));
  EXPECT_EQ(node_->StartEarlyPause(kKey + 1), nullptr) << "another manifest";

  // Adopted: begin's session takes the pause that ran while it planned.
  std::shared_ptr<DirectPause> early = node_->StartEarlyPause(kKey);
  ASSERT_NE(early, nullptr);
  EXPECT_EQ(node_->StartEarlyPause(kKey), nullptr) << "one early pause at a time";
  EXPECT_EQ(node_->Begin(ManifestOf(kParams), absl::Now()).status().code(), absl::StatusCode::kUnavailable)
      << "another begin while this one's planning is to come";
  early->Run();
  node_->EndEarlyWindow();
  absl::StatusOr<BeginResult> begun = node_->Begin(ManifestOf(kParams), absl::Now());
  ASSERT_TRUE(begun.ok()) << begun.status();
  ASSERT_TRUE(begun->pause_first);
  EXPECT_EQ(node_->StartEarlyPause(kKey), nullptr) << "a session is active";
  absl::StatusOr<std::shared_ptr<DirectPause>> adopted = node_->StartDirectPause(begun->session_id, early);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_EQ(*adopted, early);
  ASSERT_TRUE(node_->FinishDirectPause(*adopted).ok());
  const std::vector<uint8_t> p = Payload(4);
  SendBucket(begun->session_id, p, kParams);
  EXPECT_EQ(CommitNow(begun->session_id).version, 2u);
  EXPECT_EQ(EngineBytes(), p);
  EXPECT_THAT(control->calls, ElementsAre("pause", "resume:1", "pause", "resume:2"));

  // Not taken: the begin is refused (another model); the engine resumes untouched at version 2.
  early = node_->StartEarlyPause(kKey);
  ASSERT_NE(early, nullptr);
  early->Run();
  node_->EndEarlyWindow();
  Manifest other = ManifestOf(kParams);
  other.model = "another";
  EXPECT_EQ(node_->Begin(other, absl::Now()).status().code(), absl::StatusCode::kInvalidArgument);
  node_->StartUndoEarlyPause();
  absl::StatusOr<BeginResult> meanwhile = node_->Begin(ManifestOf(kParams), absl::Now());
  EXPECT_EQ(meanwhile.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(meanwhile.status().message(), HasSubstr("being resumed after a refused begin"));
  early->pause().Undo();
  node_->FinishUndoEarlyPause();
  EXPECT_THAT(control->calls, ElementsAre("pause", "resume:1", "pause", "resume:2", "pause", "resume:2"));
  EXPECT_EQ(EngineBytes(), p);
  EXPECT_FALSE(node_->engine()->dirty);
  session = BeginDirect(ManifestOf(kParams));
  ASSERT_TRUE(session.ok()) << session.status();
}

// The colocated loop: the engine sleeps after its rollout and wakes (new mappings, the same
// parameters) right before the next refit's begin. That begin still pauses early (not asleep; the
// manifest is the one placed before), and its session places the same keys (the places shared,
// not planned again) at the new mappings.
TEST_F(DirectNodeTest, AfterAWakeTheSameManifestPausesEarlyAndPlacesAtTheNewMappings) {
  ScriptedControl* control;
  const uint64_t engine = Register(&control);
  constexpr uint64_t kKey = 42;
  absl::StatusOr<uint64_t> session = BeginDirect(ManifestOf(kParams));
  ASSERT_TRUE(session.ok()) << session.status();
  node_->NotePlacing(kKey);
  SendBucket(*session, Payload(3), kParams);
  ASSERT_EQ(CommitNow(*session).outcome, Outcome::kCommitted);
  std::shared_ptr<const Placement> before = node_->engine()->placement_memo.placement;
  ASSERT_NE(before, nullptr);

  ASSERT_TRUE(node_->Sleep(engine).ok());
  EXPECT_EQ(node_->StartEarlyPause(kKey), nullptr) << "asleep";
  const std::string moved = region_name_ + "-moved";
  std::unique_ptr<storage::ShmRegion> region2 = *storage::ShmRegion::Create(moved, kBytes * kParams);
  absl::StatusOr<std::shared_ptr<Commit>> woken = node_->Wake(engine, ShmStorageIn(moved));
  ASSERT_TRUE(woken.ok()) << woken.status();

  std::shared_ptr<DirectPause> early = node_->StartEarlyPause(kKey);
  ASSERT_NE(early, nullptr) << "the same manifest into the same registration, woken";
  early->Run();
  node_->EndEarlyWindow();
  absl::StatusOr<BeginResult> begun = node_->Begin(ManifestOf(kParams), absl::Now());
  ASSERT_TRUE(begun.ok()) << begun.status();
  ASSERT_TRUE(begun->pause_first);
  std::shared_ptr<const Placement> after = node_->engine()->placement_memo.placement;
  ASSERT_NE(after, nullptr);
  EXPECT_NE(after, before);
  EXPECT_EQ(after->places, before->places) << "rebased, not planned again";
  EXPECT_EQ(after->size(), static_cast<size_t>(kParams));
  absl::StatusOr<std::shared_ptr<DirectPause>> adopted = node_->StartDirectPause(begun->session_id, early);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  ASSERT_TRUE(node_->FinishDirectPause(*adopted).ok());
  SendBucket(begun->session_id, Payload(4), kParams);
  const RefitReport& r = CommitNow(begun->session_id);
  EXPECT_EQ(r.outcome, Outcome::kCommitted) << r.reason;
  EXPECT_EQ(r.bytes_in_place, kBytes * kParams);
  EXPECT_EQ(std::vector<uint8_t>(region2->data(), region2->data() + region2->size()), Payload(4));
  EXPECT_EQ(EngineBytes(), Payload(3)) << "the old mappings untouched";
  EXPECT_THAT(control->calls, ElementsAre("pause", "resume:1", "pause", "resume:2"));
}

// An RL loop's begins plan the same tensors into the same registration: the placement planned for
// the first is taken again (not planned anew); other plans, or a registration woken at new
// addresses, get their own, and each refit lands where the engine's parameters are now.
TEST_F(DirectNodeTest, TheLastPlacementIsTakenAgainForTheSamePlansInTheSameRegistration) {
  ScriptedControl* control;
  const uint64_t engine = Register(&control);
  auto refit = [&](const Manifest& m, uint8_t seed) {
    absl::StatusOr<uint64_t> session = BeginDirect(m);
    EXPECT_TRUE(session.ok()) << session.status();
    if (!session.ok()) return std::shared_ptr<const Placement>();
    SendBucket(*session, Payload(seed), static_cast<int>(m.tensors.size()));
    std::shared_ptr<const Placement> placed = node_->engine()->placement_memo.placement;
    EXPECT_EQ(CommitNow(*session).outcome, Outcome::kCommitted);
    return placed;
  };
  std::shared_ptr<const Placement> first = refit(ManifestOf(kParams), 3);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->size(), static_cast<size_t>(kParams));
  EXPECT_EQ(refit(ManifestOf(kParams), 4), first) << "the same plans, the same registration";
  EXPECT_EQ(EngineBytes(), Payload(4));

  // Other plans (a partial refit of the first parameter): planned anew, and placed only it.
  std::shared_ptr<const Placement> partial = refit(ManifestOf(1, /*partial=*/true), 5);
  ASSERT_NE(partial, nullptr);
  EXPECT_NE(partial, first);
  EXPECT_EQ(partial->size(), 1u);
  std::vector<uint8_t> expected = Payload(4);
  std::copy_n(Payload(5).begin(), kBytes, expected.begin());
  EXPECT_EQ(EngineBytes(), expected);

  // Asleep and woken at new addresses (another region): the same places, at the new addresses.
  std::shared_ptr<const Placement> before = refit(ManifestOf(kParams), 6);
  ASSERT_TRUE(node_->Sleep(engine).ok());
  const std::string moved = region_name_ + "-moved";
  std::unique_ptr<storage::ShmRegion> region2 = *storage::ShmRegion::Create(moved, kBytes * kParams);
  absl::StatusOr<std::shared_ptr<Commit>> woken = node_->Wake(engine, ShmStorageIn(moved));
  ASSERT_TRUE(woken.ok()) << woken.status();
  std::shared_ptr<const Placement> after = refit(ManifestOf(kParams), 7);
  ASSERT_NE(after, nullptr);
  EXPECT_NE(after, before);
  EXPECT_EQ(after->places, before->places);
  EXPECT_NE(after->bases, before->bases);
  EXPECT_EQ(std::vector<uint8_t>(region2->data(), region2->data() + region2->size()), Payload(7));
  EXPECT_EQ(EngineBytes(), Payload(6)) << "the old addresses untouched";
}

// A refit refused after some tensors were converted in place: the engine holds a mix, so it stays
// paused (no resume) and dirty; a partial refit is refused; the next full refit lands and resumes.
TEST_F(DirectNodeTest, ARefusedRefitLeavesTheEnginePausedAndDirtyUntilAFullRefitLands) {
  ScriptedControl* control;
  Register(&control);
  absl::StatusOr<uint64_t> session = BeginDirect(ManifestOf(kParams));
  ASSERT_TRUE(session.ok()) << session.status();
  const std::vector<uint8_t> before = EngineBytes();
  const std::vector<uint8_t> p = Payload(5);
  SendBucket(*session, p, 1);  // w.1 never comes
  const RefitReport& r = CommitNow(*session);
  EXPECT_EQ(r.outcome, Outcome::kRefused);
  EXPECT_THAT(r.reason, HasSubstr("w.1"));
  EXPECT_THAT(r.reason, HasSubstr("stays paused and dirty"));
  EXPECT_THAT(control->calls, ElementsAre("pause"));  // not resumed
  EXPECT_TRUE(node_->engine()->dirty);
  const std::vector<uint8_t> now = EngineBytes();  // w.0 new, w.1 as before
  EXPECT_EQ(std::vector<uint8_t>(now.begin(), now.begin() + kBytes), std::vector<uint8_t>(p.begin(), p.begin() + kBytes));
  EXPECT_EQ(std::vector<uint8_t>(now.begin() + kBytes, now.end()), std::vector<uint8_t>(before.begin() + kBytes, before.end()));
  absl::StatusOr<BeginResult> partial = node_->Begin(ManifestOf(1, /*partial=*/true), absl::Now());
  EXPECT_EQ(partial.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::vector<uint8_t> q = Payload(6);
  session = BeginDirect(ManifestOf(kParams));
  ASSERT_TRUE(session.ok()) << session.status();
  SendBucket(*session, q, kParams);
  const RefitReport& ok = CommitNow(*session);
  EXPECT_EQ(ok.outcome, Outcome::kCommitted) << ok.reason;
  EXPECT_EQ(EngineBytes(), q);
  EXPECT_FALSE(node_->engine()->dirty);
  EXPECT_EQ(control->calls.back(), "resume:1");
}

// A trainer that goes away after its first bucket was converted in place: the engine stays
// paused and dirty. One that goes away before anything was written: the engine is resumed at
// the version it holds, untouched.
TEST_F(DirectNodeTest, AnAbortAfterWritingLeavesItDirtyBeforeWritingResumesIt) {
  ScriptedControl* control;
  Register(&control);
  const std::vector<uint8_t> before = EngineBytes();
  absl::StatusOr<uint64_t> session = BeginDirect(ManifestOf(kParams));
  ASSERT_TRUE(session.ok());
  node_->EndByTrainer(*session, EndCause::kDisconnected, "trainer disconnected");
  EXPECT_THAT(control->calls, ElementsAre("pause", "resume:0:sent"));
  EXPECT_FALSE(node_->engine()->dirty);
  EXPECT_EQ(EngineBytes(), before);
  EXPECT_THAT(node_->last_report().reason, HasSubstr("nothing was written in place"));

  // (The sent resume left the scripted engine "late"; a real one answers it.)
  control->late = 0;
  session = BeginDirect(ManifestOf(kParams));
  ASSERT_TRUE(session.ok()) << session.status();
  SendBucket(*session, Payload(7), 1);
  node_->EndByTrainer(*session, EndCause::kDisconnected, "trainer disconnected");
  EXPECT_EQ(node_->last_report().outcome, Outcome::kAborted);
  EXPECT_THAT(node_->last_report().reason, HasSubstr("stays paused and dirty"));
  EXPECT_TRUE(node_->engine()->dirty);
  EXPECT_EQ(control->calls.back(), "pause");
}

// A pause that fails ends the session before anything is converted, naming why; the engine's
// weights are untouched. Sleep is refused while a session converts into the engine.
TEST_F(DirectNodeTest, APauseThatFailsEndsTheSessionAndSleepWaitsForTheSession) {
  ScriptedControl* control;
  const uint64_t engine = Register(&control);
  control->pause_status = absl::UnavailableError("the engine is shutting down");
  absl::StatusOr<uint64_t> session = BeginDirect(ManifestOf(kParams));
  EXPECT_EQ(session.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(session.status().message(), HasSubstr("did not pause"));
  EXPECT_FALSE(node_->session_active());
  EXPECT_EQ(node_->last_report().outcome, Outcome::kFailed);
  control->pause_status = absl::OkStatus();
  session = BeginDirect(ManifestOf(kParams));
  ASSERT_TRUE(session.ok());
  EXPECT_EQ(node_->Sleep(engine).code(), absl::StatusCode::kUnavailable);
  SendBucket(*session, Payload(8), kParams);
  EXPECT_EQ(CommitNow(*session).outcome, Outcome::kCommitted);
  EXPECT_TRUE(node_->Sleep(engine).ok());
}

// A manifest that names nothing placeable begins without a pause (its tensors are staged as
// without staging: direct).
TEST_F(DirectNodeTest, NothingToPlaceMeansNoPauseAtBegin) {
  ScriptedControl* control;
  Register(&control);
  absl::StatusOr<BeginResult> begun = node_->Begin(ManifestOf(0), absl::Now());
  ASSERT_TRUE(begun.ok());
  EXPECT_FALSE(begun->pause_first);
  EXPECT_TRUE(control->calls.empty());
}


}  // namespace node_test
}  // namespace refit
