// The fixture of the node's in-process tests (node_test.cc, commit_test.cc, node_versions_test.cc,
// direct_node_test.cc): real shared-memory engine storage, the real session threads and CPU
// converter, an in-process data plane and an engine control that answers (or fails, or never
// answers) as each test needs. Its classes live in refit::node_test, the namespace of those files'
// tests, so that one program may hold several of them (refit_node_hot_test).
#ifndef REFIT_TESTS_UNIT_REFIT_NODE_FIXTURE_H_
#define REFIT_TESTS_UNIT_REFIT_NODE_FIXTURE_H_

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/checksum.h"
#include "common/fake_clock.h"
#include "common/parallel_checksum.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "refit/cpu_converter.h"
#include "refit/node.h"
#include "spec/model_spec.h"
#include "storage/memory.h"
#include "storage/shm_region.h"
#include "storage/shm_storage.h"
#include "transport/memory/memory_receiver.h"

namespace refit {
namespace node_test {

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

inline std::vector<uint8_t> Payload(uint8_t seed) {
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
    options.group = group_;
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
  GroupOptions group_;           // NodeOptions::group (engine groups)
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


// Storage for w.0, w.1 in shm region `name` (as Register maps the test's region).
inline std::unique_ptr<storage::EngineStorage> ShmStorageIn(const std::string& name) {
  std::vector<storage::ShmParam> shm;
  for (int i = 0; i < kParams; ++i) shm.push_back({{absl::StrCat("w.", i), DType::kBF16, {kElems}, kBytes}, name, i * kBytes});
  absl::StatusOr<std::unique_ptr<storage::ShmEngineStorage>> s = storage::ShmEngineStorage::Open(shm);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
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


}  // namespace node_test
}  // namespace refit

#endif  // REFIT_TESTS_UNIT_REFIT_NODE_FIXTURE_H_
