// The node's session lifecycle, in-process (node_fixture.h): registration, begin refusals,
// session ids, deadlines and trainer ends, joined trainer ranks, invalid buckets, sleep and wake.
#include "node_fixture.h"

namespace refit {
namespace node_test {

TEST_F(NodeTest, AnInvalidTagIsRefusedAtBeginNamingIt) {
  Register();
  for (const std::string& bad : {std::string("step 1"), std::string("a\nb"), std::string("x/y"),
                                 std::string(kMaxTagBytes + 1, 'a'), std::string("t\0u", 3)}) {
    absl::StatusOr<BeginResult> begun = node_->Begin(ManifestOf(kParams, false, bad), absl::Now());
    EXPECT_EQ(begun.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(begun.status().message(), HasSubstr("manifest tag")) << bad;
  }
  EXPECT_FALSE(node_->session_active());
  EXPECT_TRUE(node_->Begin(ManifestOf(kParams, false, std::string(kMaxTagBytes, 'a')), absl::Now()).ok());
}


TEST_F(NodeTest, EngineLeavingDuringTheCommitIsAnOutcomeAndANewEngineMayRegister) {
  ScriptedControl* control;
  const uint64_t id = Register(&control);
  absl::Notification gate;
  control->pause_gate = &gate;
  control->pause_status = absl::UnavailableError("the engine disconnected during pause");
  const uint64_t session = Send(Payload(7), kParams);
  absl::StatusOr<std::shared_ptr<Commit>> c = node_->StartCommit(session);
  ASSERT_TRUE(c.ok());
  std::thread worker([&] { (*c)->Run(); });
  // Inside the window the engine's registration goes away, and another engine registers.
  while (!control->pause_called) absl::SleepFor(absl::Milliseconds(1));
  node_->UnregisterEngine(id);
  EXPECT_EQ(node_->engine(), nullptr);
  ScriptedControl* next;
  EXPECT_NE(Register(&next), id);
  gate.Notify();
  worker.join();
  const RefitReport& r = node_->FinishCommit(**c);
  EXPECT_EQ(r.outcome, Outcome::kFailed);
  EXPECT_EQ(r.cause, EndCause::kEngineError);
  EXPECT_FALSE(node_->session_active());
  // The new engine takes refits.
  EXPECT_EQ(CommitNow(Send(Payload(8), kParams)).outcome, Outcome::kCommitted);
  EXPECT_THAT(next->calls, ElementsAre("pause", "resume:1"));
}

TEST_F(NodeTest, EngineUnregisteringBeforeTheCommitAbortsTheSession) {
  const uint64_t id = Register();
  Send(Payload(1), kParams);
  node_->UnregisterEngine(id);
  EXPECT_FALSE(node_->session_active());
  ASSERT_EQ(reports_.size(), 1u);
  EXPECT_EQ(reports_[0].outcome, Outcome::kAborted);
  EXPECT_EQ(reports_[0].cause, EndCause::kEngineError);
  EXPECT_EQ(reports_[0].reason, "engine unregistered");
}

TEST_F(NodeTest, ASecondEngineIsRefusedWhileOneIsRegistered) {
  Register();
  EngineSetup setup;
  std::vector<storage::ShmParam> shm = {{{"w.0", DType::kBF16, {kElems}, kBytes}, region_name_, 0}};
  setup.storage = *storage::ShmEngineStorage::Open(shm);
  setup.planner = std::make_unique<Planner>(*Planner::Create(spec_, setup.storage->params()));
  setup.pool = std::make_unique<StagingPool>(storage::NewHostMemory());
  setup.converter = std::make_unique<CpuConverter>();
  setup.control = std::make_unique<ScriptedControl>();
  absl::StatusOr<uint64_t> second = node_->RegisterEngine(std::move(setup));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("already registered"));
}

// Codes, and the causes a trainer acts on: no engine and busy are both Unavailable, told apart by
// their causes; a partial refit of a dirty engine is the dirty engine's refusal.
TEST_F(NodeTest, BeginRefusalsCarryTheirCodes) {
  absl::Status none = node_->Begin(ManifestOf(kParams), absl::Now()).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CauseOf(none), EndCause::kEngineError);
  Register();
  Manifest wrong = ManifestOf(kParams);
  wrong.model = "other";
  absl::Status st = node_->Begin(wrong, absl::Now()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("'other'"));
  Manifest unknown = ManifestOf(kParams);
  unknown.tensors.push_back({"nope", DType::kBF16, {kElems}, 0, kBytes});
  st = node_->Begin(unknown, absl::Now()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("'nope'"));
  ASSERT_TRUE(node_->Begin(ManifestOf(kParams), absl::Now()).ok());
  st = node_->Begin(ManifestOf(kParams), absl::Now()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(st.message(), HasSubstr("busy"));
  EXPECT_EQ(CauseOf(st), EndCause::kBusy);
  EXPECT_EQ(CauseOf(node_->Begin(wrong, absl::Now()).status()), EndCause::kBusy) << "busy before the model is checked";
}

TEST_F(NodeTest, APartialRefitOfADirtyEngineIsRefusedAsTheDirtyEngines) {
  Register(nullptr, /*version=*/3, /*dirty=*/true);
  absl::Status st = node_->Begin(ManifestOf(1, /*partial=*/true), absl::Now()).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CauseOf(st), EndCause::kEngineDirty);
  EXPECT_TRUE(node_->Begin(ManifestOf(kParams), absl::Now()).ok()) << "a full refit is taken";
}

// A tensor list's key stands for the list (the daemon's manifest key: a hash of every field): a
// begin of the key the planner accepted last is neither checked nor planned again. A refused list
// is never remembered, and a list of another key is checked, as is any list after the engine
// registers again (a new planner).
TEST_F(NodeTest, TheTensorListOfTheKeyAcceptedLastIsNotPlannedAgain) {
  constexpr uint64_t kGood = 0x600d, kBad = 0xbad;
  Register();
  Manifest unknown = ManifestOf(kParams);
  unknown.tensors.push_back({"nope", DType::kBF16, {kElems}, 0, kBytes});
  for (int round = 0; round < 2; ++round) {
    EXPECT_THAT(node_->Begin(unknown, absl::Now(), kBad).status().message(), HasSubstr("'nope'"));
  }
  absl::StatusOr<BeginResult> good = node_->Begin(ManifestOf(kParams), absl::Now(), kGood);
  ASSERT_TRUE(good.ok()) << good.status();
  ASSERT_TRUE(node_->AbortActive("next"));
  EXPECT_THAT(node_->Begin(unknown, absl::Now(), kBad).status().message(), HasSubstr("'nope'"));
  // The key accepted last is taken as its list: planning is skipped (what arrives is still
  // checked at commit).
  absl::StatusOr<BeginResult> by_key = node_->Begin(unknown, absl::Now(), kGood);
  EXPECT_TRUE(by_key.ok()) << by_key.status();
  ASSERT_TRUE(node_->AbortActive("next"));
  ASSERT_TRUE(node_->UnregisterEngine(node_->engine()->id));
  Register();
  EXPECT_THAT(node_->Begin(unknown, absl::Now(), kGood).status().message(), HasSubstr("'nope'"));
}

// A trainer may choose its session's id (so that it knows its data-plane tags before the
// answer): taken when below 2^32 and none of the node's recent sessions had it.
TEST_F(NodeTest, ATrainerChosenSessionIdIsTakenUnlessRecentOrTooLarge) {
  Register();
  absl::StatusOr<BeginResult> chosen = node_->Begin(ManifestOf(kParams), absl::Now(), 0, 0x1234);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_EQ(chosen->session_id, 0x1234u);
  ASSERT_TRUE(node_->AbortActive("next"));
  absl::Status again = node_->Begin(ManifestOf(kParams), absl::Now(), 0, 0x1234).status();
  EXPECT_EQ(again.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(again.message(), HasSubstr("session id 4660 was one of this daemon's recent sessions"));
  absl::Status large = node_->Begin(ManifestOf(kParams), absl::Now(), 0, uint64_t{1} << 32).status();
  EXPECT_EQ(large.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(large.message(), HasSubstr("below 2^32"));
  absl::StatusOr<BeginResult> own = node_->Begin(ManifestOf(kParams), absl::Now());
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_NE(own->session_id, 0x1234u);
  EXPECT_EQ(own->session_id >> 32, 0u);
}

TEST_F(NodeTest, DeadlineAndTrainerEndsAreTyped) {
  Register();
  absl::StatusOr<BeginResult> a = node_->Begin(ManifestOf(kParams), absl::Now());
  ASSERT_TRUE(a.ok());
  // The deadline is the manifest's (or the limit's) milliseconds after Begin, on the node's clock.
  clock_.Advance(absl::Milliseconds(a->deadline_ms) - absl::Nanoseconds(1));
  EXPECT_TRUE(node_->Poll(a->session_id));
  EXPECT_TRUE(node_->session_active());
  clock_.Advance(absl::Nanoseconds(1));
  EXPECT_FALSE(node_->Poll(a->session_id));
  EXPECT_FALSE(node_->session_active());
  EXPECT_EQ(reports_.back().cause, EndCause::kDeadlineExceeded);
  EXPECT_EQ(ReportStatus(reports_.back()).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_GE(receiver_.disconnects(), 1);

  absl::StatusOr<BeginResult> b = node_->Begin(ManifestOf(kParams), absl::Now());
  ASSERT_TRUE(b.ok());
  node_->EndByTrainer(b->session_id, EndCause::kClientAbort, "trainer aborted: test");
  EXPECT_EQ(reports_.back().outcome, Outcome::kAborted);
  EXPECT_EQ(reports_.back().cause, EndCause::kClientAbort);
  EXPECT_EQ(ReportStatus(reports_.back()).code(), absl::StatusCode::kAborted);

  absl::StatusOr<BeginResult> c = node_->Begin(ManifestOf(kParams), absl::Now());
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(node_->AbortActive("operator abort: test"));
  EXPECT_EQ(reports_.back().cause, EndCause::kClientAbort);
  EXPECT_FALSE(node_->AbortActive("nothing"));
  // A session that ended is named with how it ended.
  absl::Status gone = node_->Join(c->session_id).status();
  EXPECT_EQ(gone.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(gone.message(), HasSubstr("operator abort"));
}

TEST_F(NodeTest, JoinedRanksCountAsOpenUntilTheyDetach) {
  Register();
  EXPECT_EQ(node_->open_members(), 0u);
  absl::StatusOr<BeginResult> a = node_->Begin(ManifestOf(kParams), absl::Now());
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(node_->Join(a->session_id).ok());
  ASSERT_TRUE(node_->Join(a->session_id).ok());
  EXPECT_EQ(node_->open_members(), 2u);
  ASSERT_TRUE(node_->Detach(a->session_id).ok());
  EXPECT_EQ(node_->open_members(), 1u);
  ASSERT_TRUE(node_->Detach(a->session_id).ok());
  EXPECT_EQ(node_->open_members(), 0u);
  absl::Status extra = node_->Detach(a->session_id);
  EXPECT_EQ(extra.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(extra.message(), HasSubstr("no joined rank left"));
  EXPECT_EQ(node_->Detach(a->session_id + 1).code(), absl::StatusCode::kFailedPrecondition);
  // A joined rank that leaves without detaching ends the session; nothing stays open.
  ASSERT_TRUE(node_->Join(a->session_id).ok());
  node_->EndByTrainer(a->session_id, EndCause::kDisconnected, "a joined trainer rank disconnected before detaching");
  EXPECT_EQ(reports_.back().outcome, Outcome::kAborted);
  EXPECT_EQ(node_->open_members(), 0u);
}

// Each trainer rank numbers its buckets in its own range (Session::SeqBase): a joined rank knows
// its bucket's tag before the announce is answered, and its bytes may already be on the data plane.
TEST_F(NodeTest, TrainerRanksNumberTheirBucketsInRangesOfTheirOwn) {
  Register();
  const std::vector<uint8_t> payload = Payload(7);
  absl::StatusOr<BeginResult> a = node_->Begin(ManifestOf(kParams), absl::Now());
  ASSERT_TRUE(a.ok());
  absl::StatusOr<uint32_t> first = node_->Join(a->session_id);
  absl::StatusOr<uint32_t> second = node_->Join(a->session_id);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(*first, 1u);
  EXPECT_EQ(*second, 2u);
  // Rank 0 sends w.0 as bucket 0 (numbered by refitd); rank 2 sends w.1 as its first bucket, its
  // bytes on the data plane before the announce.
  std::vector<uint8_t> w0(payload.begin(), payload.begin() + kBytes);
  std::vector<uint8_t> w1(payload.begin() + kBytes, payload.begin() + 2 * kBytes);
  const uint32_t rank2 = Session::SeqBase(2);
  receiver_.Put(Session::Tag(a->session_id, rank2), &w1);
  BucketHeader h1;
  h1.seq = rank2;
  h1.nbytes = kBytes;
  h1.checksum = Checksum64(w1.data(), kBytes);
  h1.tensors.push_back({"w.1", DType::kBF16, {kElems}, 0, kBytes});
  absl::StatusOr<uint32_t> seq1 = node_->Announce(a->session_id, h1, 2);
  ASSERT_TRUE(seq1.ok()) << seq1.status();
  EXPECT_EQ(*seq1, rank2);
  receiver_.Put(Session::Tag(a->session_id, 0), &w0);
  BucketHeader h0;
  h0.seq = Session::kAssignSeq;
  h0.nbytes = kBytes;
  h0.checksum = Checksum64(w0.data(), kBytes);
  h0.tensors.push_back({"w.0", DType::kBF16, {kElems}, 0, kBytes});
  absl::StatusOr<uint32_t> seq0 = node_->Announce(a->session_id, h0, 0);
  ASSERT_TRUE(seq0.ok()) << seq0.status();
  EXPECT_EQ(*seq0, 0u);
  ASSERT_TRUE(node_->Detach(a->session_id).ok());
  ASSERT_TRUE(node_->Detach(a->session_id).ok());
  const RefitReport& r = CommitNow(a->session_id);
  EXPECT_EQ(r.outcome, Outcome::kCommitted) << r.reason;
  EXPECT_EQ(EngineBytes(), payload);

  // A number outside the rank's range (or out of order in it) fails the session naming the one
  // expected.
  absl::StatusOr<BeginResult> b = node_->Begin(ManifestOf(kParams), absl::Now());
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(node_->Join(b->session_id).ok());
  BucketHeader wrong = h0;
  wrong.seq = 1;  // rank 0's range; rank 1's next is SeqBase(1)
  absl::StatusOr<uint32_t> refused = node_->Announce(b->session_id, wrong, 1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr(absl::StrCat("expected ", Session::SeqBase(1))));
  EXPECT_FALSE(node_->session_active());
}

TEST_F(NodeTest, InvalidBucketEndsTheSessionAsInvalidInput) {
  Register();
  absl::StatusOr<BeginResult> a = node_->Begin(ManifestOf(kParams), absl::Now());
  ASSERT_TRUE(a.ok());
  BucketHeader h;
  h.seq = 3;  // out of order
  h.nbytes = kBytes;
  h.tensors.push_back({"w.0", DType::kBF16, {kElems}, 0, kBytes});
  absl::StatusOr<uint32_t> seq = node_->Announce(a->session_id, h);
  EXPECT_EQ(seq.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(node_->session_active());
  EXPECT_EQ(reports_.back().cause, EndCause::kInvalidInput);
}

// A trainer told parallelChecksum (Daemon.begin) announces ParallelChecksum64, an older one
// Checksum64: each bucket is verified by the kind it names, and a sum of the other kind (or of
// other bytes) ends the session as invalid input with the engine untouched.
TEST_F(NodeTest, BucketsAreVerifiedByTheChecksumKindTheyName) {
  Register();
  uint8_t seed = 40;
  for (ChecksumKind kind : {ChecksumKind::kChecksum64, ChecksumKind::kParallel64}) {
    for (bool right : {true, false}) {
      SCOPED_TRACE(absl::StrCat(kind == ChecksumKind::kParallel64 ? "parallel64" : "checksum64",
                                right ? ", its own sum" : ", the other kind's sum"));
      const std::vector<uint8_t> before = EngineBytes();
      const std::vector<uint8_t> payload = Payload(++seed);
      absl::StatusOr<BeginResult> begun = node_->Begin(ManifestOf(kParams), absl::Now());
      ASSERT_TRUE(begun.ok()) << begun.status();
      BucketHeader h = Bucket(begun->session_id, payload, kParams);
      const uint64_t parallel = ParallelChecksum64(payload.data(), h.nbytes);
      const uint64_t serial = Checksum64(payload.data(), h.nbytes);
      ASSERT_NE(parallel, serial);
      h.checksum_kind = kind;
      h.checksum = (kind == ChecksumKind::kParallel64) == right ? parallel : serial;
      ASSERT_TRUE(node_->Announce(begun->session_id, h).ok());
      const RefitReport& r = CommitNow(begun->session_id);
      if (right) {
        EXPECT_EQ(r.outcome, Outcome::kCommitted) << r.reason;
        EXPECT_EQ(EngineBytes(), payload);
      } else {
        // The bucket is refused as bad input: the session ends before any commit.
        EXPECT_EQ(r.outcome, Outcome::kAborted);
        EXPECT_EQ(r.cause, EndCause::kInvalidInput);
        EXPECT_THAT(r.reason, HasSubstr("bucket 0: checksum"));
        EXPECT_THAT(r.reason, HasSubstr("does not match the announced"));
        EXPECT_EQ(EngineBytes(), before);
      }
    }
  }
}

TEST_F(NodeTest, RefitWhileAsleepIsStagedAndCommitsAtTheWakeAtNewAddresses) {
  ScriptedControl* control = nullptr;
  const uint64_t engine = Register(&control);
  ASSERT_TRUE(node_->Sleep(engine).ok());
  EXPECT_TRUE(node_->asleep());
  EXPECT_THAT(node_->Checksums().status().message(), HasSubstr("asleep"));
  const std::vector<uint8_t> payload = Payload(5);
  const uint64_t id = Send(payload, kParams, false, "step-1");
  const RefitReport& staged = CommitNow(id);
  EXPECT_EQ(staged.outcome, Outcome::kStaged) << staged.reason;
  EXPECT_EQ(staged.reason, kStagedForWake);
  EXPECT_TRUE(control->calls.empty());  // nothing paused, nothing written
  EXPECT_EQ(node_->awaiting_wake_session(), id);
  EXPECT_EQ(EngineBytes(), std::vector<uint8_t>(kBytes * kParams, 0xAB));
  // The trainer may go away; another refit waits for the staged one.
  node_->EndByTrainer(id, EndCause::kDisconnected, "trainer disconnected");
  EXPECT_EQ(node_->awaiting_wake_session(), id);
  EXPECT_FALSE(node_->Poll(id));
  EXPECT_EQ(node_->awaiting_wake_session(), id);
  absl::StatusOr<BeginResult> busy = node_->Begin(ManifestOf(kParams), absl::Now());
  EXPECT_THAT(busy.status().message(), HasSubstr("waiting for the engine to wake"));

  // Woken at new addresses: another region.
  const std::string moved = region_name_ + "-moved";
  std::unique_ptr<storage::ShmRegion> region2 = *storage::ShmRegion::Create(moved, kBytes * kParams);
  absl::StatusOr<std::shared_ptr<Commit>> woken = node_->Wake(engine, ShmStorageIn(moved));
  ASSERT_TRUE(woken.ok()) << woken.status();
  ASSERT_NE(*woken, nullptr);
  EXPECT_FALSE(node_->asleep());
  (*woken)->Run();
  const RefitReport& r = node_->FinishCommit(**woken);
  EXPECT_EQ(r.outcome, Outcome::kCommitted) << r.reason;
  EXPECT_EQ(r.session_id, id);
  EXPECT_EQ(r.tag, "step-1");
  EXPECT_EQ(node_->version(), 1u);
  EXPECT_THAT(control->calls, ElementsAre("pause", "resume:1"));
  EXPECT_EQ(control->audits, 1);
  EXPECT_EQ(std::vector<uint8_t>(region2->data(), region2->data() + region2->size()), payload);
  EXPECT_EQ(EngineBytes(), std::vector<uint8_t>(kBytes * kParams, 0xAB));  // the old addresses untouched
  EXPECT_EQ(node_->awaiting_wake_session(), 0u);
  EXPECT_FALSE(node_->session_active());
}

TEST_F(NodeTest, WakeAtTheSameAddressesCommitsTheStagedRefit) {
  const uint64_t engine = Register();
  ASSERT_TRUE(node_->Sleep(engine).ok());
  const std::vector<uint8_t> payload = Payload(9);
  EXPECT_EQ(CommitNow(Send(payload, kParams)).outcome, Outcome::kStaged);
  absl::StatusOr<std::shared_ptr<Commit>> woken = node_->Wake(engine, ShmStorageIn(region_name_));
  ASSERT_TRUE(woken.ok() && *woken != nullptr) << woken.status();
  (*woken)->Run();
  EXPECT_EQ(node_->FinishCommit(**woken).outcome, Outcome::kCommitted);
  EXPECT_EQ(EngineBytes(), payload);
  // Sleep and wake with nothing staged: no commit.
  ASSERT_TRUE(node_->Sleep(engine).ok());
  absl::StatusOr<std::shared_ptr<Commit>> again = node_->Wake(engine, ShmStorageIn(region_name_));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, nullptr);
  EXPECT_EQ(CommitNow(Send(Payload(10), kParams)).outcome, Outcome::kCommitted);
  EXPECT_EQ(EngineBytes(), Payload(10));
}

TEST_F(NodeTest, WakeWithOtherParametersIsRefusedNamingThem) {
  const uint64_t engine = Register();
  EXPECT_THAT(node_->Wake(engine, ShmStorageIn(region_name_)).status().message(), HasSubstr("not asleep"));
  ASSERT_TRUE(node_->Sleep(engine).ok());
  std::vector<storage::ShmParam> shm = {{{"w.0", DType::kBF16, {kElems}, kBytes}, region_name_, 0},
                                        {{"w.9", DType::kBF16, {kElems}, kBytes}, region_name_, kBytes}};
  absl::StatusOr<std::shared_ptr<Commit>> woken = node_->Wake(engine, *storage::ShmEngineStorage::Open(shm));
  EXPECT_EQ(woken.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(woken.status().message(), HasSubstr("'w.9'"));
  EXPECT_TRUE(node_->asleep());
}

TEST_F(NodeTest, RefitsWhileAsleepAreRefusedWhenConfigured) {
  refuse_asleep_ = true;
  SetUp();
  const uint64_t engine = Register();
  // A session begun awake, the engine falling asleep before its commit: refused, untouched.
  const uint64_t id = Send(Payload(3), kParams);
  ASSERT_TRUE(node_->Sleep(engine).ok());
  const RefitReport& r = CommitNow(id);
  EXPECT_EQ(r.outcome, Outcome::kRefused);
  EXPECT_THAT(r.reason, HasSubstr("asleep_refits: refuse"));
  absl::StatusOr<BeginResult> begun = node_->Begin(ManifestOf(kParams), absl::Now());
  EXPECT_EQ(begun.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(begun.status().message(), HasSubstr("asleep"));
  ASSERT_TRUE(node_->Wake(engine, ShmStorageIn(region_name_)).ok());
  EXPECT_EQ(CommitNow(Send(Payload(4), kParams)).outcome, Outcome::kCommitted);
  EXPECT_EQ(EngineBytes(), Payload(4));
}


}  // namespace node_test
}  // namespace refit
