// The node's session lifecycle and commit protocol, in-process: real shared-memory engine
// storage, the real session threads and CPU converter, an in-process data plane and an engine
// control that answers (or fails, or never answers) as each test needs. Every branch of the commit
// ends with one typed outcome, and the engine's bytes, version and dirty flag say what the
// protocol promises.
#include "refit/node.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/checksum.h"
#include "common/fake_clock.h"
#include "refit/cpu_converter.h"
#include "spec/model_spec.h"
#include "storage/memory.h"
#include "storage/shm_region.h"
#include "storage/shm_storage.h"
#include "transport/memory/memory_receiver.h"

namespace refit {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kSpec[] = R"(model: m
rules:
  - match: "w.{i}"
    format: passthrough
    partial: true
)";
constexpr int kParams = 2;
constexpr int64_t kElems = 256;
constexpr uint64_t kBytes = kElems * 2;

// The engine's side of pause/resume, scripted per test. Pause and resume may block on a gate
// (to act while a commit is inside the window).
class ScriptedControl final : public EngineControl {
 public:
  absl::Status Pause(absl::Duration timeout) override {
    calls.push_back("pause");
    pause_called = true;
    if (pause_gate != nullptr) pause_gate->WaitForNotification();
    if (pause_hangs) return Late(timeout);
    return pause_status;
  }
  absl::Status Resume(uint64_t version, const std::string& tag, absl::Duration timeout) override {
    calls.push_back(absl::StrCat("resume:", version, timeout == absl::ZeroDuration() ? ":sent" : ""));
    tags.push_back(tag);
    if (resume_hangs || timeout == absl::ZeroDuration()) return Late(timeout);
    return resume_status;
  }
  bool Responsive() const override { return late == 0; }
  // resumes_on_loop: takes the resume, whose answer the test gives by calling loop_resumed.
  bool StartResume(uint64_t version, const std::string& tag, absl::Duration timeout,
                   std::function<void(absl::Status)> done) override {
    if (!resumes_on_loop) return false;
    calls.push_back(absl::StrCat("resume:", version, ":loop"));
    tags.push_back(tag);
    (void)timeout;
    loop_resumed = std::move(done);
    return true;
  }
  std::vector<std::string> PausedStale() override {
    ++audits;
    return audit_stale;
  }

  absl::Status Late(absl::Duration timeout) {
    ++late;
    return absl::DeadlineExceededError(absl::StrCat("no answer within ", absl::FormatDuration(timeout)));
  }

  std::vector<std::string> calls;
  std::vector<std::string> tags;  // each resume's tag
  absl::Status pause_status, resume_status;
  bool pause_hangs = false, resume_hangs = false;
  absl::Notification* pause_gate = nullptr;
  std::atomic<int> late{0};
  std::atomic<bool> pause_called{false};
  std::vector<std::string> audit_stale;  // what the engine's audit names
  int audits = 0;
  bool resumes_on_loop = false;
  // Answers StartResume's request (once: the callback holds its commit).
  void AnswerResume(absl::Status status) {
    std::function<void(absl::Status)> done = std::move(loop_resumed);
    loop_resumed = nullptr;
    done(std::move(status));
  }
  std::function<void(absl::Status)> loop_resumed;
};

// A converter whose failures surface only when its bucket completes, as a GPU's do (a NaN input
// found by the kernel): each bucket completes `delay` after it was issued and reports `failing`.
class LateFailingConverter final : public Converter {
 public:
  LateFailingConverter(std::string failing, absl::Duration delay) : failing_(std::move(failing)), delay_(delay) {}
  storage::MemoryKind staging_kind() const override { return storage::MemoryKind::kHost; }
  absl::Status Convert(const TensorPlan& plan, const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                       std::span<const formats::MutableBytes> outs, const formats::QuantizeOptions& options) override {
    return cpu_.Convert(plan, desc, src, src_kind, outs, options);
  }
  std::vector<std::pair<std::string, absl::Status>> Sync() override { return {}; }
  std::vector<std::pair<std::string, absl::Status>> WaitBucket(uint64_t) override {
    absl::SleepFor(delay_);
    return {{failing_, absl::InvalidArgumentError(absl::StrCat("tensor '", failing_, "': NaN in the input"))}};
  }

 private:
  CpuConverter cpu_;
  std::string failing_;
  absl::Duration delay_;
};

std::vector<uint8_t> Payload(uint8_t seed) {
  std::vector<uint8_t> p(kBytes * kParams);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(seed + i * 7);
  return p;
}

class NodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = *spec::ParseModelSpec(kSpec);
    region_name_ = absl::StrCat("/refit-node-test-", getpid(), "-", counter_++);
    region_ = *storage::ShmRegion::Create(region_name_, kBytes * kParams);
    std::memset(region_->data(), 0xAB, region_->size());
    ring_ = *BucketRing::Create(2, 1 << 16, *ring_memory_);
    NodeOptions options;
    options.model = "m";
    options.pause_timeout = absl::Milliseconds(50);
    options.resume_timeout = absl::Milliseconds(50);
    options.failpoints = failpoints_.get();
    options.clock = &clock_;
    options.verify_after_commit = verify_;
    options.hold = hold_;
    options.refuse_while_asleep = refuse_asleep_;
    options.direct = direct_;
    options.resume_on_loop = resume_on_loop_;
    if (staging_limit_ != 0) options.limits.staging_bytes = staging_limit_;
    NodeHooks hooks;
    hooks.on_report = [this](const RefitReport& r) { reports_.push_back(r); };
    hooks.on_converted = [this](const std::map<std::string, uint64_t>&, uint64_t) { converted_.fetch_add(1); };
    node_ = std::make_unique<Node>(options, receiver_, *ring_, hooks);
  }

  // Registers an engine whose parameters w.0, w.1 live in the test's shm region.
  uint64_t Register(ScriptedControl** control_out = nullptr, uint64_t version = 0, bool dirty = false,
                    std::string tag = "") {
    std::vector<storage::ShmParam> shm;
    for (int i = 0; i < kParams; ++i) {
      shm.push_back({{absl::StrCat("w.", i), DType::kBF16, {kElems}, kBytes}, region_name_, i * kBytes});
    }
    EngineSetup setup;
    setup.storage = *storage::ShmEngineStorage::Open(shm);
    setup.planner = std::make_unique<Planner>(*Planner::Create(spec_, setup.storage->params()));
    setup.pool = std::make_unique<StagingPool>(storage::NewHostMemory());
    setup.new_pool = [this] {
      ++pools_made_;
      return std::make_unique<StagingPool>(storage::NewHostMemory());
    };
    setup.converter = make_converter_ ? make_converter_() : std::make_unique<CpuConverter>();
    auto control = std::make_unique<ScriptedControl>();
    if (control_out != nullptr) *control_out = control.get();
    setup.control = std::move(control);
    setup.version = version;
    setup.dirty = dirty;
    setup.tag = std::move(tag);
    absl::StatusOr<uint64_t> id = node_->RegisterEngine(std::move(setup));
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : 0;
  }

  Manifest ManifestOf(int tensors, bool partial = false, std::string tag = "") {
    Manifest m;
    m.model = "m";
    m.partial = partial;
    m.tag = std::move(tag);
    for (int i = 0; i < tensors; ++i) m.tensors.push_back({absl::StrCat("w.", i), DType::kBF16, {kElems}, 0, kBytes});
    return m;
  }

  // Begins a session and sends `tensors` of `payload` in one bucket.
  uint64_t Send(const std::vector<uint8_t>& payload, int tensors, bool partial = false, std::string tag = "",
                bool stage_only = false) {
    Manifest m = ManifestOf(tensors, partial, std::move(tag));
    m.stage_only = stage_only;
    absl::StatusOr<BeginResult> begun = node_->Begin(m, absl::Now());
    EXPECT_TRUE(begun.ok()) << begun.status();
    if (!begun.ok()) return 0;
    absl::StatusOr<uint32_t> seq = node_->Announce(begun->session_id, Bucket(begun->session_id, payload, tensors));
    EXPECT_TRUE(seq.ok()) << seq.status();
    return begun->session_id;
  }

  // Bucket 0 of `session`: the first `tensors` of `payload` (w.0, w.1, ...), its bytes put on the
  // data plane.
  BucketHeader Bucket(uint64_t session, const std::vector<uint8_t>& payload, int tensors) {
    BucketHeader h;
    h.seq = 0;
    h.nbytes = kBytes * tensors;
    h.checksum = Checksum64(payload.data(), h.nbytes);
    for (int i = 0; i < tensors; ++i) h.tensors.push_back({absl::StrCat("w.", i), DType::kBF16, {kElems}, i * kBytes, kBytes});
    sent_ = std::vector<uint8_t>(payload.begin(), payload.begin() + static_cast<long>(h.nbytes));
    receiver_.Put(Session::Tag(session, 0), &sent_);
    return h;
  }

  // The whole commit on this thread (the loop's and the worker's steps in order).
  const RefitReport& CommitNow(uint64_t session) {
    absl::StatusOr<std::shared_ptr<Commit>> c = node_->StartCommit(session);
    EXPECT_TRUE(c.ok()) << c.status();
    (*c)->Run();
    return node_->FinishCommit(**c);
  }

  std::vector<uint8_t> EngineBytes() const { return {region_->data(), region_->data() + region_->size()}; }

  static inline int counter_ = 0;
  spec::ModelSpec spec_;
  std::string region_name_;
  std::unique_ptr<storage::ShmRegion> region_;
  std::unique_ptr<storage::Memory> ring_memory_ = storage::NewHostMemory();
  std::unique_ptr<BucketRing> ring_;
  transport::MemoryReceiver receiver_;
  std::unique_ptr<FailpointSet> failpoints_;
  bool verify_ = false;  // NodeOptions::verify_after_commit (set, then SetUp() again)
  uint32_t hold_ = 0;            // NodeOptions::hold
  bool refuse_asleep_ = false;   // NodeOptions::refuse_while_asleep
  bool direct_ = false;          // NodeOptions::direct (staging: direct)
  bool resume_on_loop_ = false;  // NodeOptions::resume_on_loop
  std::atomic<int> converted_{0};  // buckets converted (NodeHooks::on_converted)
  int pools_made_ = 0;           // EngineSetup::new_pool calls
  uint64_t staging_limit_ = 0;   // limits.staging_bytes when nonzero
  std::function<std::unique_ptr<Converter>()> make_converter_;  // Register's; a CpuConverter when unset

  // Stage-only refit of `payload` under `tag`.
  const RefitReport& Stage(const std::vector<uint8_t>& payload, const std::string& tag) {
    return CommitNow(Send(payload, kParams, false, tag, /*stage_only=*/true));
  }
  // Commits a kept version: `tag`, or the rollback target when `tag` is empty.
  const RefitReport& CommitKept(const std::string& tag) {
    absl::StatusOr<std::shared_ptr<Commit>> c = tag.empty() ? node_->StartRollback() : node_->StartVersionCommit(tag);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return node_->last_report();
    (*c)->Run();
    return node_->FinishCommit(**c);
  }
  std::vector<std::string> VersionList() const {
    std::vector<std::string> out;
    for (const VersionInfo& v : node_->Versions()) out.push_back(absl::StrCat(v.state, ":", v.tag));
    return out;
  }
  FakeClock clock_;  // declared before node_: outlives it
  std::unique_ptr<Node> node_;
  std::vector<RefitReport> reports_;
  std::vector<uint8_t> sent_;
};

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

TEST_F(NodeTest, BeginRefusalsCarryTheirCodes) {
  EXPECT_EQ(node_->Begin(ManifestOf(kParams), absl::Now()).status().code(), absl::StatusCode::kUnavailable);
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

// ---- sleep and wake, and the registration audit ----

// Storage for w.0, w.1 in shm region `name` (as Register maps the test's region).
std::unique_ptr<storage::EngineStorage> ShmStorageIn(const std::string& name) {
  std::vector<storage::ShmParam> shm;
  for (int i = 0; i < kParams; ++i) shm.push_back({{absl::StrCat("w.", i), DType::kBF16, {kElems}, kBytes}, name, i * kBytes});
  absl::StatusOr<std::unique_ptr<storage::ShmEngineStorage>> s = storage::ShmEngineStorage::Open(shm);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
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

// ---- staging: direct ----

class DirectNodeTest : public NodeTest {
 protected:
  void SetUp() override {
    direct_ = true;
    NodeTest::SetUp();
  }
  // Begins a session; the engine pauses first (the server's begin: Start/Run/FinishDirectPause).
  absl::StatusOr<uint64_t> BeginDirect(const Manifest& m) {
    absl::StatusOr<BeginResult> begun = node_->Begin(m, absl::Now());
    if (!begun.ok()) return begun.status();
    EXPECT_TRUE(begun->pause_first);
    absl::StatusOr<std::shared_ptr<DirectPause>> pause = node_->StartDirectPause(begun->session_id);
    if (!pause.ok()) return pause.status();
    (*pause)->Run();
    if (absl::Status st = node_->FinishDirectPause(*pause); !st.ok()) return st;
    return begun->session_id;
  }
  // Sends `tensors` of `payload` in one bucket and waits until it is converted.
  void SendBucket(uint64_t session, const std::vector<uint8_t>& payload, int tensors) {
    const int before = converted_.load();
    ASSERT_TRUE(node_->Announce(session, Bucket(session, payload, tensors)).ok());
    for (int i = 0; i < 5000 && converted_.load() == before; ++i) absl::SleepFor(absl::Milliseconds(1));
    ASSERT_GT(converted_.load(), before) << "the bucket was not converted";
  }
};

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

}  // namespace
}  // namespace refit
