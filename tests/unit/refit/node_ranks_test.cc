// Engine ranks in-process: a node whose spec declares tensor_parallel.size 2 without a rank,
// each rank a real shared-memory engine storage with a scripted pause/resume. Registration
// refusals name the field; a refit waits for every rank; one refit writes every rank its part;
// a rank a commit fails on is dirty until it registers again and a full refit lands; each rank
// sleeps and wakes on its own, and a refit staged while any sleeps commits at the last wake.
// Under tensor_parallel.size engine the first rank to register gives the engine's size (a single
// engine without tp fields, TP=4, then TP=2 once every rank has gone), and a rank of another size
// is refused naming tp_size.
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/checksum.h"
#include "refit/cpu_converter.h"
#include "refit/node.h"
#include "spec/model_spec.h"
#include "storage/memory.h"
#include "storage/shm_region.h"
#include "storage/shm_storage.h"
#include "transport/memory/memory_receiver.h"

namespace refit {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class Control final : public EngineControl {
 public:
  absl::Status Pause(absl::Duration) override {
    Log("pause");
    return pause_status;
  }
  absl::Status Resume(uint64_t version, const std::string&, absl::Duration) override {
    Log(absl::StrCat("resume:", version));
    if (on_resume) on_resume();
    return resume_status;
  }
  bool Responsive() const override { return true; }
  std::vector<std::string> Calls() {
    absl::MutexLock lock(&mu);
    return calls;
  }
  void Log(std::string c) {
    absl::MutexLock lock(&mu);
    calls.push_back(std::move(c));
  }
  absl::Mutex mu;
  std::vector<std::string> calls;
  absl::Status pause_status, resume_status;
  std::function<void()> on_resume;
};

struct Param {
  std::string name;
  Shape shape;  // the rank's
};

uint64_t Bytes(const Shape& s) { return *DenseBytes(DType::kBF16, s); }

// A tensor of `shape` whose bytes are a function of `seed` and the position.
std::vector<uint8_t> Pattern(const Shape& shape, uint8_t seed) {
  std::vector<uint8_t> b(Bytes(shape));
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(seed * 31 + i * 7 + (i >> 8));
  return b;
}

class NodeRanksTest : public ::testing::Test {
 protected:
  void Start(const std::string& yaml, std::vector<Param> params, bool direct = false) {
    spec_ = *spec::ParseModelSpec(yaml);
    params_ = std::move(params);
    ring_ = *BucketRing::Create(2, 1 << 16, *ring_memory_);
    NodeOptions options;
    options.model = "m";
    options.pause_timeout = absl::Milliseconds(200);
    options.resume_timeout = absl::Milliseconds(200);
    options.spec = &spec_;
    options.refuse_while_asleep = refuse_asleep_;
    options.direct = direct;
    options.make_staging = [](EngineSetup& setup) {
      setup.pool = std::make_unique<StagingPool>(storage::NewHostMemory());
      setup.new_pool = [] { return std::make_unique<StagingPool>(storage::NewHostMemory()); };
      setup.converter = std::make_unique<CpuConverter>();
      return absl::OkStatus();
    };
    node_ = std::make_unique<Node>(options, receiver_, *ring_, NodeHooks{});
  }

  // Engine rank `rank`'s storage: a fresh shm region holding params_ (0xAB everywhere).
  EngineSetup Setup(int rank, RankPlacement placement, std::vector<Param> params = {}) {
    EngineSetup setup;
    setup.storage = Map(rank, std::move(params));
    auto control = std::make_unique<Control>();
    controls_[rank] = control.get();
    setup.control = std::move(control);
    setup.placement = placement;
    return setup;
  }
  // Rank `rank`'s parameters (params_ when empty) in a fresh shm region (0xAB everywhere), as a
  // registration or a wake at new addresses brings them.
  std::unique_ptr<storage::EngineStorage> Map(int rank, std::vector<Param> params = {}) {
    if (params.empty()) params = params_;
    names_[rank] = absl::StrCat("/refit-ranks-test-", getpid(), "-", counter_++);
    uint64_t total = 0;
    for (const Param& p : params) total += Bytes(p.shape);
    regions_[rank] = *storage::ShmRegion::Create(names_[rank], total);
    std::memset(regions_[rank]->data(), 0xAB, total);
    return MapAgain(rank, std::move(params));
  }
  // The same region again (a wake at the same addresses).
  std::unique_ptr<storage::EngineStorage> MapAgain(int rank, std::vector<Param> params = {}) {
    if (params.empty()) params = params_;
    std::vector<storage::ShmParam> shm;
    uint64_t off = 0;
    for (const Param& p : params) {
      shm.push_back({{p.name, DType::kBF16, p.shape, Bytes(p.shape)}, names_[rank], off});
      off += Bytes(p.shape);
    }
    return *storage::ShmEngineStorage::Open(shm);
  }
  static RankPlacement Place(int rank, int size = 2, int ep_rank = 0, int ep_size = 0) {
    RankPlacement p;
    p.tp_rank = rank;
    p.tp_size = size;
    p.ep_rank = ep_rank;
    p.ep_size = ep_size;
    p.model = "m";
    return p;
  }
  uint64_t Register(int rank, int ep_size = 0) {
    absl::StatusOr<uint64_t> id =
        node_->RegisterEngine(Setup(rank, Place(rank, 2, ep_size > 1 ? rank : 0, ep_size)));
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : 0;
  }

  // One refit of `tensors` (name, full shape, seed) in one bucket, committed on this thread.
  const RefitReport& Refit(const std::vector<std::pair<std::string, Shape>>& tensors, uint8_t seed,
                           bool partial = false) {
    const uint64_t id = Send(tensors, seed, partial);
    return id == 0 ? node_->last_report() : CommitNow(id);
  }
  // Its session begun and its bucket sent (0 when begin failed).
  uint64_t Send(const std::vector<std::pair<std::string, Shape>>& tensors, uint8_t seed, bool partial = false) {
    Manifest m;
    m.model = "m";
    m.partial = partial;
    BucketHeader h;
    sent_.clear();
    for (const auto& [name, shape] : tensors) {
      std::vector<uint8_t> b = Pattern(shape, static_cast<uint8_t>(seed + sent_.size()));
      h.tensors.push_back({name, DType::kBF16, shape, sent_.size(), b.size()});
      m.tensors.push_back({name, DType::kBF16, shape, 0, b.size()});
      sent_.insert(sent_.end(), b.begin(), b.end());
    }
    absl::StatusOr<BeginResult> begun = node_->Begin(m, absl::Now());
    EXPECT_TRUE(begun.ok()) << begun.status();
    if (!begun.ok()) return 0;
    if (begun->pause_first) {
      // staging: direct: every rank pauses before anything converts into its memory.
      absl::StatusOr<std::shared_ptr<DirectPause>> pause = node_->StartDirectPause(begun->session_id);
      EXPECT_TRUE(pause.ok()) << pause.status();
      if (!pause.ok()) return 0;
      (*pause)->Run();
      EXPECT_TRUE(node_->FinishDirectPause(*pause).ok());
    }
    h.nbytes = sent_.size();
    h.checksum = Checksum64(sent_.data(), sent_.size());
    receiver_.Put(Session::Tag(begun->session_id, 0), &sent_);
    EXPECT_TRUE(node_->Announce(begun->session_id, h).ok());
    return begun->session_id;
  }
  const RefitReport& CommitNow(uint64_t session_id) {
    absl::StatusOr<std::shared_ptr<Commit>> c = node_->StartCommit(session_id);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return node_->last_report();
    return Run(*c);
  }
  const RefitReport& Run(const std::shared_ptr<Commit>& c) {
    c->Run();
    return node_->FinishCommit(*c);
  }
  // The sent bytes of tensor `index` of the last refit.
  std::vector<uint8_t> Sent(size_t offset, uint64_t bytes) const {
    return {sent_.begin() + static_cast<long>(offset), sent_.begin() + static_cast<long>(offset + bytes)};
  }
  std::vector<uint8_t> Engine(int rank, uint64_t offset, uint64_t bytes) const {
    const uint8_t* d = regions_.at(rank)->data();
    return {d + offset, d + offset + bytes};
  }

  static inline int counter_ = 0;
  spec::ModelSpec spec_;
  std::vector<Param> params_;
  std::unique_ptr<storage::Memory> ring_memory_ = storage::NewHostMemory();
  std::unique_ptr<BucketRing> ring_;
  transport::MemoryReceiver receiver_;
  bool refuse_asleep_ = false;
  std::map<int, std::string> names_;
  std::map<int, std::unique_ptr<storage::ShmRegion>> regions_;
  std::map<int, Control*> controls_;
  std::vector<uint8_t> sent_;
  std::unique_ptr<Node> node_;
};

constexpr char kTp2[] = R"(model: m
tensor_parallel: {size: 2}
rules:
  - match: "col"
    format: passthrough
    shard: {dim: 0}
  - match: "norm"
    format: passthrough
)";

TEST_F(NodeRanksTest, RegistrationsUnlikeTheSpecAreRefusedNamingTheField) {
  Start(kTp2, {{"col", {8, 16}}, {"norm", {16}}});
  ASSERT_TRUE(node_->ranked());
  auto refused = [&](RankPlacement p, std::vector<Param> params = {}) {
    absl::StatusOr<uint64_t> id = node_->RegisterEngine(Setup(9, p, params));
    EXPECT_FALSE(id.ok());
    return std::string(id.status().message());
  };
  RankPlacement none;  // a registration from before engine ranks
  EXPECT_THAT(refused(none), HasSubstr("tp_size: this daemon's spec declares tensor_parallel.size 2"));
  EXPECT_THAT(refused(Place(0, 4)), HasSubstr("tp_size: the engine registers tensor-parallel size 4"));
  EXPECT_THAT(refused(Place(2)), HasSubstr("tp_rank: 2 is outside tensor_parallel.size 2"));
  RankPlacement other = Place(0);
  other.model = "other";
  EXPECT_THAT(refused(other), HasSubstr("model: the engine registers for 'other'"));
  EXPECT_THAT(refused(Place(0, 2, 0, 2)), HasSubstr("ep_size: the engine registers expert-parallel size 2"));
  EXPECT_THAT(refused(Place(1, 2, 1)), HasSubstr("ep_rank"));

  Register(0);
  absl::StatusOr<uint64_t> again = node_->RegisterEngine(Setup(5, Place(0)));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(again.status().message(), HasSubstr("tp_rank: engine rank 0 is already registered"));
  EXPECT_THAT(refused(Place(1), {{"col", {4, 16}}, {"norm", {16}}}),
              HasSubstr("params: engine rank 1 registers 'col' as BF16[4,16], engine rank 0 as BF16[8,16]"));
  EXPECT_THAT(refused(Place(1), {{"col", {8, 16}}}), HasSubstr("params: engine rank 1 lacks 'norm'"));

  // A refit before every rank is in is refused at begin, naming the missing rank.
  EXPECT_EQ(node_->engine(), nullptr);
  Manifest m;
  m.model = "m";
  m.tensors.push_back({"norm", DType::kBF16, {16}, 0, 32});
  absl::StatusOr<BeginResult> begun = node_->Begin(m, absl::Now());
  EXPECT_EQ(begun.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(begun.status().message(), HasSubstr("engine rank 1 of tensor_parallel.size 2 is not registered"));
  EXPECT_THAT(std::string(node_->Ready().message()), HasSubstr("engine rank 1 of"));
  EXPECT_FALSE(node_->session_active());

  Register(1);
  ASSERT_NE(node_->engine(), nullptr);
  std::vector<RankStatus> ranks = node_->Ranks();
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_TRUE(ranks[0].registered && ranks[1].registered);
  EXPECT_EQ(ranks[1].params, 2u);
  EXPECT_TRUE(node_->Ready().ok());
}

TEST_F(NodeRanksTest, OneRefitWritesEveryRankItsPartAndAllSwitchTogether) {
  Start(kTp2, {{"col", {8, 16}}, {"norm", {16}}});
  Register(0);
  Register(1);
  for (uint8_t seed : {1, 2, 3}) {
    const RefitReport& r = Refit({{"col", {16, 16}}, {"norm", {16}}}, seed);
    ASSERT_EQ(r.outcome, Outcome::kCommitted) << r.reason;
    EXPECT_EQ(r.version, seed);
    // Rank r holds rows [8r, 8r + 8) of col; both hold the whole norm.
    EXPECT_EQ(Engine(0, 0, 256), Sent(0, 256));
    EXPECT_EQ(Engine(1, 0, 256), Sent(256, 256));
    EXPECT_EQ(Engine(0, 256, 32), Sent(512, 32));
    EXPECT_EQ(Engine(1, 256, 32), Sent(512, 32));
  }
  EXPECT_THAT(controls_[0]->Calls(), ElementsAre("pause", "resume:1", "pause", "resume:2", "pause", "resume:3"));
  EXPECT_THAT(controls_[1]->Calls(), ElementsAre("pause", "resume:1", "pause", "resume:2", "pause", "resume:3"));
  for (const RankStatus& s : node_->Ranks()) EXPECT_EQ(s.version, 3u);
}

// staging: direct over engine ranks: each rank's own shard is converted straight into its memory
// while every rank is paused; the part both share is staged once and copied to each in the commit.
TEST_F(NodeRanksTest, DirectStagingConvertsEachRanksShardIntoItsOwnMemory) {
  Start(kTp2, {{"col", {8, 16}}, {"norm", {16}}}, /*direct=*/true);
  Register(0);
  Register(1);
  for (uint8_t seed : {1, 2}) {
    const RefitReport& r = Refit({{"col", {16, 16}}, {"norm", {16}}}, seed);
    ASSERT_EQ(r.outcome, Outcome::kCommitted) << r.reason;
    EXPECT_EQ(r.version, seed);
    EXPECT_EQ(r.bytes_in_place, 512u) << "each rank's 256 bytes of col in place; norm staged";
    EXPECT_EQ(Engine(0, 0, 256), Sent(0, 256));
    EXPECT_EQ(Engine(1, 0, 256), Sent(256, 256));
    EXPECT_EQ(Engine(0, 256, 32), Sent(512, 32));
    EXPECT_EQ(Engine(1, 256, 32), Sent(512, 32));
  }
  EXPECT_THAT(controls_[0]->Calls(), ElementsAre("pause", "resume:1", "pause", "resume:2"));
  EXPECT_THAT(controls_[1]->Calls(), ElementsAre("pause", "resume:1", "pause", "resume:2"));
}

TEST_F(NodeRanksTest, ARankTheCommitFailsOnIsDirtyUntilItRegistersAgainAndAFullRefitLands) {
  Start(kTp2 + std::string("defaults: {partial: true}\n"), {{"col", {8, 16}}, {"norm", {16}}});
  Register(0);
  const uint64_t rank1 = Register(1);
  ASSERT_EQ(Refit({{"col", {16, 16}}, {"norm", {16}}}, 1).outcome, Outcome::kCommitted);
  // Rank 1 dies inside the window: its resume fails and its registration drops meanwhile.
  controls_[1]->resume_status = absl::UnavailableError("the engine disconnected during resume");
  controls_[1]->on_resume = [&] { node_->UnregisterEngine(rank1); };
  const RefitReport& failed = Refit({{"col", {16, 16}}, {"norm", {16}}}, 2);
  EXPECT_EQ(failed.outcome, Outcome::kFailed);
  EXPECT_EQ(failed.cause, EndCause::kEngineError);
  EXPECT_THAT(failed.reason, HasSubstr("rank1"));
  std::vector<RankStatus> ranks = node_->Ranks();
  EXPECT_FALSE(ranks[1].registered);
  EXPECT_TRUE(ranks[1].left_dirty);
  // Refits are refused naming it until it registers again.
  Manifest m;
  m.model = "m";
  m.tensors.push_back({"norm", DType::kBF16, {16}, 0, 32});
  absl::StatusOr<BeginResult> begun = node_->Begin(m, absl::Now());
  EXPECT_THAT(begun.status().message(), HasSubstr("engine rank 1 of tensor_parallel.size 2 is not registered"));
  EXPECT_THAT(begun.status().message(), HasSubstr("rank 1 left dirty during a failed commit"));
  // It restarts (version 0, fresh memory): the node is one mixed engine, so only a full refit lands.
  Register(1);
  ASSERT_NE(node_->engine(), nullptr);
  EXPECT_TRUE(node_->engine()->dirty);
  m.partial = true;
  begun = node_->Begin(m, absl::Now());
  EXPECT_EQ(begun.status().code(), absl::StatusCode::kFailedPrecondition);
  const RefitReport& landed = Refit({{"col", {16, 16}}, {"norm", {16}}}, 3);
  ASSERT_EQ(landed.outcome, Outcome::kCommitted) << landed.reason;
  EXPECT_EQ(Engine(1, 0, 256), Sent(256, 256));
  for (const RankStatus& s : node_->Ranks()) {
    EXPECT_FALSE(s.dirty);
    EXPECT_FALSE(s.left_dirty);
    EXPECT_EQ(s.version, landed.version);
  }
}

TEST_F(NodeRanksTest, ExpertParallelRanksHoldTheirExpertsWhole) {
  Start(R"(model: m
tensor_parallel: {size: 2}
expert_parallel: {size: 2}
rules:
  - match: "e.{i}.w"
    target: "experts.w"
    format: passthrough
    stack: {capture: i, count: 4}
  - match: "attn"
    format: passthrough
    shard: {dim: 0}
)",
        {{"experts.w", {2, 4, 8}}, {"attn", {4, 8}}});
  Register(0, 2);
  Register(1, 2);
  const RefitReport& r =
      Refit({{"e.0.w", {4, 8}}, {"e.1.w", {4, 8}}, {"e.2.w", {4, 8}}, {"e.3.w", {4, 8}}, {"attn", {8, 8}}}, 7);
  ASSERT_EQ(r.outcome, Outcome::kCommitted) << r.reason;
  EXPECT_EQ(Engine(0, 0, 128), Sent(0, 128));    // experts 0, 1
  EXPECT_EQ(Engine(1, 0, 128), Sent(128, 128));  // experts 2, 3
  EXPECT_EQ(Engine(0, 128, 64), Sent(256, 64));  // attn rows 0-3
  EXPECT_EQ(Engine(1, 128, 64), Sent(320, 64));  // attn rows 4-7
}

// tensor_parallel.size engine: the engine's first rank gives the size.
constexpr char kEngineSized[] = R"(model: m
tensor_parallel: {size: engine}
rules:
  - match: "col"
    format: passthrough
    shard: {dim: 0}
  - match: "norm"
    format: passthrough
)";

TEST_F(NodeRanksTest, TheFirstRankGivesTheEnginesSizeWhenTheSpecLeavesItToTheEngine) {
  Start(kEngineSized, {{"col", {4, 16}}, {"norm", {16}}});
  EXPECT_FALSE(node_->ranked());
  EXPECT_TRUE(node_->RanksFor(Place(0, 4)));
  EXPECT_FALSE(node_->RanksFor(RankPlacement{}));
  // A refused first registration fixes no size.
  RankPlacement other = Place(0, 4);
  other.model = "other";
  EXPECT_FALSE(node_->RegisterEngine(Setup(0, other)).ok());
  EXPECT_FALSE(node_->ranked());

  std::vector<uint64_t> ids;
  for (int r : {0, 1, 2}) {
    absl::StatusOr<uint64_t> id = node_->RegisterEngine(Setup(r, Place(r, 4)));
    ASSERT_TRUE(id.ok()) << r << ": " << id.status();
    ids.push_back(*id);
  }
  EXPECT_TRUE(node_->ranked());
  EXPECT_EQ(node_->spec()->tp_size, 4);
  EXPECT_EQ(node_->Ranks().size(), 4u);
  // The size is fixed: a rank of another size is refused, naming tp_size and where the size came from.
  absl::StatusOr<uint64_t> two = node_->RegisterEngine(Setup(3, Place(3, 2)));
  EXPECT_THAT(std::string(two.status().message()),
              HasSubstr("tp_size: the engine registers tensor-parallel size 2, the engine's tensor_parallel.size is "
                        "4 (the spec's is 'engine': the first rank to register fixed it"));
  EXPECT_THAT(std::string(node_->RegisterEngine(Setup(3, RankPlacement{})).status().message()),
              HasSubstr("tp_size: this daemon's engine declares tensor_parallel.size 4"));
  EXPECT_THAT(std::string(node_->Ready().message()), HasSubstr("engine rank 3 of tensor_parallel.size 4"));
  const uint64_t rank3 = *node_->RegisterEngine(Setup(3, Place(3, 4)));
  ASSERT_NE(node_->engine(), nullptr);

  // One refit writes each of the four ranks its quarter of col, and all of norm.
  const RefitReport& r = Refit({{"col", {16, 16}}, {"norm", {16}}}, 5);
  ASSERT_EQ(r.outcome, Outcome::kCommitted) << r.reason;
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(Engine(k, 0, 128), Sent(128 * static_cast<size_t>(k), 128)) << k;
    EXPECT_EQ(Engine(k, 128, 32), Sent(512, 32)) << k;
  }

  // Once every rank has gone, the next engine's first rank gives the size again: TP=2.
  EXPECT_TRUE(node_->UnregisterEngine(rank3));
  EXPECT_TRUE(node_->ranked()) << "three ranks are still in";
  EXPECT_FALSE(node_->RegisterEngine(Setup(3, Place(3, 2))).ok());
  for (uint64_t id : ids) EXPECT_TRUE(node_->UnregisterEngine(id));
  EXPECT_FALSE(node_->ranked());
  params_ = {{"col", {8, 16}}, {"norm", {16}}};
  Register(0);
  Register(1);
  EXPECT_EQ(node_->spec()->tp_size, 2);
  const RefitReport& again = Refit({{"col", {16, 16}}, {"norm", {16}}}, 6);
  ASSERT_EQ(again.outcome, Outcome::kCommitted) << again.reason;
  EXPECT_EQ(Engine(0, 0, 256), Sent(0, 256));
  EXPECT_EQ(Engine(1, 0, 256), Sent(256, 256));
}

// A single engine (a registration without tp fields, or tp_size 1) under tensor_parallel.size
// engine holds every parameter whole, as under a spec without tensor_parallel.
TEST_F(NodeRanksTest, ASingleEngineUnderAnEngineSizedSpecHoldsTheWholeModel) {
  for (int tp_size : {0, 1}) {
    Start(kEngineSized, {{"col", {16, 16}}, {"norm", {16}}});
    EXPECT_FALSE(node_->RanksFor(Place(0, tp_size)));
    EngineSetup setup = Setup(0, Place(0, tp_size));
    absl::StatusOr<Planner> planner = Planner::Create(spec_, setup.storage->params());
    ASSERT_TRUE(planner.ok()) << planner.status();
    setup.planner = std::make_unique<Planner>(std::move(*planner));
    setup.pool = std::make_unique<StagingPool>(storage::NewHostMemory());
    setup.new_pool = [] { return std::make_unique<StagingPool>(storage::NewHostMemory()); };
    setup.converter = std::make_unique<CpuConverter>();
    absl::StatusOr<uint64_t> id = node_->RegisterEngine(std::move(setup));
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_FALSE(node_->ranked());
    EXPECT_EQ(node_->spec()->tp_size, 1);
    const RefitReport& r = Refit({{"col", {16, 16}}, {"norm", {16}}}, 7);
    ASSERT_EQ(r.outcome, Outcome::kCommitted) << r.reason;
    EXPECT_EQ(Engine(0, 0, 544), Sent(0, 544));
    // Its size is 1 while it is registered: a rank of two is refused naming tp_size.
    EXPECT_THAT(std::string(node_->RegisterEngine(Setup(1, Place(1, 2))).status().message()),
                HasSubstr("tp_size: the engine registers tensor-parallel size 2, the engine's "
                          "tensor_parallel.size is 1"));
  }
}

TEST_F(NodeRanksTest, ExpertParallelSizeEngineSplitsTheExpertsAcrossTheEnginesRanks) {
  Start(R"(model: m
tensor_parallel: {size: engine}
expert_parallel: {size: engine}
rules:
  - match: "e.{i}.w"
    target: "experts.w"
    format: passthrough
    stack: {capture: i, count: 4}
  - match: "attn"
    format: passthrough
    shard: {dim: 0}
)",
        {{"experts.w", {2, 4, 8}}, {"attn", {4, 8}}});
  // Four experts do not split three ways: the first rank's size is refused naming ep_size, and
  // fixes nothing.
  EXPECT_THAT(std::string(node_->RegisterEngine(Setup(0, Place(0, 3, 0, 3))).status().message()),
              HasSubstr("ep_size: 4 experts"));
  EXPECT_FALSE(node_->ranked());
  EXPECT_THAT(
      std::string(node_->RegisterEngine(Setup(0, Place(0, 2))).status().message()),
      HasSubstr("ep_size: the engine registers expert-parallel size 1, the engine's expert_parallel.size is 2"));
  Register(0, 2);
  Register(1, 2);
  const RefitReport& r =
      Refit({{"e.0.w", {4, 8}}, {"e.1.w", {4, 8}}, {"e.2.w", {4, 8}}, {"e.3.w", {4, 8}}, {"attn", {8, 8}}}, 7);
  ASSERT_EQ(r.outcome, Outcome::kCommitted) << r.reason;
  EXPECT_EQ(Engine(0, 0, 128), Sent(0, 128));    // experts 0, 1
  EXPECT_EQ(Engine(1, 0, 128), Sent(128, 128));  // experts 2, 3
  EXPECT_EQ(Engine(0, 128, 64), Sent(256, 64));  // attn rows 0-3
  EXPECT_EQ(Engine(1, 128, 64), Sent(320, 64));  // attn rows 4-7
}

// kTp2's refit: col {16, 16} (rank r holds rows [8r, 8r + 8)) and norm {16} (every rank whole).
const std::vector<std::pair<std::string, Shape>> kTp2Refit = {{"col", {16, 16}}, {"norm", {16}}};

class NodeRanksSleepTest : public NodeRanksTest {
 protected:
  void SetUp() override { Start(kTp2, {{"col", {8, 16}}, {"norm", {16}}}); }
  // Every rank holds its part of the last refit sent.
  void ExpectRanksHoldTheLastRefit() {
    EXPECT_EQ(Engine(0, 0, 256), Sent(0, 256));
    EXPECT_EQ(Engine(1, 0, 256), Sent(256, 256));
    EXPECT_EQ(Engine(0, 256, 32), Sent(512, 32));
    EXPECT_EQ(Engine(1, 256, 32), Sent(512, 32));
  }
  std::vector<bool> Asleep() const {
    std::vector<bool> out;
    for (const RankStatus& s : node_->Ranks()) out.push_back(s.asleep);
    return out;
  }
};

TEST_F(NodeRanksSleepTest, ARefitWhileTheRanksSleepIsStagedAndCommitsOnEveryRankAtTheLastWake) {
  const uint64_t rank0 = Register(0);
  const uint64_t rank1 = Register(1);
  ASSERT_EQ(Refit(kTp2Refit, 1).outcome, Outcome::kCommitted);
  const std::vector<uint8_t> first = sent_;
  ASSERT_TRUE(node_->Sleep(rank0).ok());
  EXPECT_TRUE(node_->asleep());  // one rank asleep: the engine is
  EXPECT_THAT(Asleep(), ElementsAre(true, false));
  ASSERT_TRUE(node_->Sleep(rank1).ok());
  EXPECT_TRUE(node_->Sleep(rank1).ok());  // asleep already
  EXPECT_THAT(Asleep(), ElementsAre(true, true));
  EXPECT_EQ(node_->engine()->generation, 3u);
  EXPECT_THAT(std::string(node_->Checksums().status().message()), HasSubstr("asleep"));

  const RefitReport& staged = Refit(kTp2Refit, 2);
  EXPECT_EQ(staged.outcome, Outcome::kStaged) << staged.reason;
  EXPECT_EQ(staged.reason, kStagedForWake);
  const uint64_t session = staged.session_id;
  EXPECT_EQ(node_->awaiting_wake_session(), session);
  const std::vector<uint8_t> second = sent_;
  sent_ = first;
  ExpectRanksHoldTheLastRefit();  // nothing paused, nothing written
  EXPECT_THAT(controls_[0]->Calls(), ElementsAre("pause", "resume:1"));

  // Rank 0 wakes at new addresses: the engine still sleeps (rank 1 does), nothing commits.
  absl::StatusOr<std::shared_ptr<Commit>> woken = node_->Wake(rank0, Map(0));
  ASSERT_TRUE(woken.ok()) << woken.status();
  EXPECT_EQ(*woken, nullptr);
  EXPECT_TRUE(node_->asleep());
  EXPECT_THAT(Asleep(), ElementsAre(false, true));
  EXPECT_EQ(node_->awaiting_wake_session(), session);
  EXPECT_THAT(controls_[0]->Calls(), ElementsAre("pause", "resume:1"));
  absl::StatusOr<std::shared_ptr<Commit>> again = node_->Wake(rank0, MapAgain(0));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr("engine rank 0 is not asleep"));

  // Rank 1, the last asleep, wakes at the same addresses: the staged refit commits on both.
  woken = node_->Wake(rank1, MapAgain(1));
  ASSERT_TRUE(woken.ok()) << woken.status();
  ASSERT_NE(*woken, nullptr);
  EXPECT_FALSE(node_->asleep());
  const RefitReport& r = Run(*woken);
  EXPECT_EQ(r.outcome, Outcome::kCommitted) << r.reason;
  EXPECT_EQ(r.session_id, session);
  EXPECT_EQ(r.version, 2u);
  sent_ = second;
  ExpectRanksHoldTheLastRefit();
  for (int rank : {0, 1}) EXPECT_THAT(controls_[rank]->Calls(), ElementsAre("pause", "resume:1", "pause", "resume:2"));
  for (const RankStatus& s : node_->Ranks()) {
    EXPECT_EQ(s.version, 2u);
    EXPECT_FALSE(s.asleep);
  }
  EXPECT_EQ(node_->awaiting_wake_session(), 0u);
  EXPECT_FALSE(node_->session_active());
  EXPECT_EQ(node_->engine()->generation, 5u);
}

TEST_F(NodeRanksSleepTest, ARankSleepsAndWakesOnlyWhileNoCommitIsInFlight) {
  const uint64_t rank0 = Register(0);
  const uint64_t rank1 = Register(1);
  absl::StatusOr<std::shared_ptr<Commit>> c = node_->StartCommit(Send(kTp2Refit, 1));
  ASSERT_TRUE(c.ok()) << c.status();
  absl::Status busy = node_->Sleep(rank1);
  EXPECT_EQ(busy.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(busy.message(), HasSubstr("busy: a commit is in flight"));
  EXPECT_THAT(Asleep(), ElementsAre(false, false));
  ASSERT_EQ(Run(*c).outcome, Outcome::kCommitted);
  ExpectRanksHoldTheLastRefit();

  // Rank 0 asleep: a commit validates, and meanwhile rank 0's wake is busy too.
  ASSERT_TRUE(node_->Sleep(rank0).ok());
  c = node_->StartCommit(Send(kTp2Refit, 2));
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<std::shared_ptr<Commit>> woken = node_->Wake(rank0, MapAgain(0));
  EXPECT_EQ(woken.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(woken.status().message(), HasSubstr("busy: a commit is in flight"));
  ASSERT_EQ(Run(*c).outcome, Outcome::kStaged);
  woken = node_->Wake(rank0, MapAgain(0));
  ASSERT_TRUE(woken.ok() && *woken != nullptr) << woken.status();
  EXPECT_EQ(Run(*woken).outcome, Outcome::kCommitted);
  ExpectRanksHoldTheLastRefit();
}

TEST_F(NodeRanksSleepTest, AWakeWithOtherParametersIsRefusedNamingTheRank) {
  const uint64_t rank0 = Register(0);
  const uint64_t rank1 = Register(1);
  EXPECT_EQ(node_->Sleep(rank1 + 100).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(node_->Sleep(rank1).ok());
  absl::StatusOr<std::shared_ptr<Commit>> woken = node_->Wake(rank1, Map(1, {{"col", {8, 16}}, {"other", {16}}}));
  EXPECT_EQ(woken.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(woken.status().message(), HasSubstr("wake: parameter 1 is 'other' BF16[16]; engine rank 1 slept with "
                                                  "'norm' BF16[16]"));
  woken = node_->Wake(rank1, Map(1, {{"col", {8, 16}}}));
  EXPECT_THAT(woken.status().message(), HasSubstr("wake: engine rank 1 registered 1 parameters; it slept with 2"));
  EXPECT_THAT(Asleep(), ElementsAre(false, true));
  EXPECT_TRUE(node_->asleep());
  woken = node_->Wake(rank0, MapAgain(0));
  EXPECT_THAT(woken.status().message(), HasSubstr("engine rank 0 is not asleep"));
  woken = node_->Wake(rank1, Map(1));
  ASSERT_TRUE(woken.ok()) << woken.status();
  EXPECT_FALSE(node_->asleep());
  ASSERT_EQ(Refit(kTp2Refit, 3).outcome, Outcome::kCommitted);
  ExpectRanksHoldTheLastRefit();
}

TEST_F(NodeRanksSleepTest, RefitsWhileARankSleepsAreRefusedWhenConfigured) {
  refuse_asleep_ = true;
  SetUp();
  Register(0);
  const uint64_t rank1 = Register(1);
  // Begun awake, rank 1 falling asleep before the commit: refused, no rank touched.
  const uint64_t id = Send(kTp2Refit, 1);
  ASSERT_TRUE(node_->Sleep(rank1).ok());
  const RefitReport& r = CommitNow(id);
  EXPECT_EQ(r.outcome, Outcome::kRefused);
  EXPECT_THAT(r.reason, HasSubstr("asleep_refits: refuse"));
  EXPECT_EQ(Engine(0, 0, 256), std::vector<uint8_t>(256, 0xAB));
  Manifest m;
  m.model = "m";
  m.tensors.push_back({"norm", DType::kBF16, {16}, 0, 32});
  absl::StatusOr<BeginResult> begun = node_->Begin(m, absl::Now());
  EXPECT_EQ(begun.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(begun.status().message(), HasSubstr("asleep"));
  absl::StatusOr<std::shared_ptr<Commit>> woken = node_->Wake(rank1, MapAgain(1));
  ASSERT_TRUE(woken.ok()) << woken.status();
  EXPECT_EQ(*woken, nullptr);
  ASSERT_EQ(Refit(kTp2Refit, 2).outcome, Outcome::kCommitted);
  ExpectRanksHoldTheLastRefit();
}

TEST_F(NodeRanksSleepTest, ARankThatSleepsBeforeEveryRankIsInLeavesTheEngineAsleep) {
  const uint64_t rank0 = Register(0);
  ASSERT_TRUE(node_->Sleep(rank0).ok());
  EXPECT_EQ(node_->engine(), nullptr);
  EXPECT_THAT(Asleep(), ElementsAre(true, false));
  Register(1);
  ASSERT_NE(node_->engine(), nullptr);
  EXPECT_TRUE(node_->asleep());
  const RefitReport& staged = Refit(kTp2Refit, 1);
  EXPECT_EQ(staged.outcome, Outcome::kStaged) << staged.reason;
  absl::StatusOr<std::shared_ptr<Commit>> woken = node_->Wake(rank0, MapAgain(0));
  ASSERT_TRUE(woken.ok() && *woken != nullptr) << woken.status();
  EXPECT_EQ(Run(*woken).outcome, Outcome::kCommitted);
  ExpectRanksHoldTheLastRefit();
}

TEST_F(NodeRanksSleepTest, ARankThatLeavesAsleepEndsTheStagedRefitLikeARankThatLeaves) {
  const uint64_t rank0 = Register(0);
  const uint64_t rank1 = Register(1);
  ASSERT_TRUE(node_->Sleep(rank0).ok());
  ASSERT_TRUE(node_->Sleep(rank1).ok());
  ASSERT_EQ(Refit(kTp2Refit, 1).outcome, Outcome::kStaged);
  ASSERT_TRUE(node_->UnregisterEngine(rank1));
  EXPECT_EQ(node_->engine(), nullptr);
  EXPECT_FALSE(node_->session_active());
  EXPECT_EQ(node_->last_report().outcome, Outcome::kAborted);
  EXPECT_THAT(node_->last_report().reason, HasSubstr("engine unregistered"));
  EXPECT_FALSE(node_->Ranks()[1].registered);
  EXPECT_THAT(Asleep(), ElementsAre(true, false));
  EXPECT_EQ(node_->Wake(rank1, MapAgain(1)).status().code(), absl::StatusCode::kFailedPrecondition);
  // It registers again (awake): rank 0 still sleeps, and so does the engine until it wakes.
  Register(1);
  EXPECT_TRUE(node_->asleep());
  absl::StatusOr<std::shared_ptr<Commit>> woken = node_->Wake(rank0, MapAgain(0));
  ASSERT_TRUE(woken.ok()) << woken.status();
  EXPECT_EQ(*woken, nullptr);
  EXPECT_FALSE(node_->asleep());
  ASSERT_EQ(Refit(kTp2Refit, 2).outcome, Outcome::kCommitted);
  ExpectRanksHoldTheLastRefit();
}

TEST_F(NodeRanksSleepTest, ARankWhoseShmObjectWasReplacedIsRefusedNamingItUntilItSleepsAndWakes) {
  Register(0);
  const uint64_t rank1 = Register(1);
  ASSERT_EQ(Refit(kTp2Refit, 1).outcome, Outcome::kCommitted);
  // Rank 1 replaces its shm object under the same name without registering again.
  const uint64_t bytes = regions_[1]->size();
  regions_[1].reset();
  regions_[1] = *storage::ShmRegion::Create(names_[1], bytes);
  const RefitReport& refused = Refit(kTp2Refit, 2);
  EXPECT_EQ(refused.outcome, Outcome::kRefused);
  EXPECT_THAT(refused.reason, HasSubstr("rank1: stale registration"));
  EXPECT_EQ(Engine(1, 0, 256), std::vector<uint8_t>(256, 0));
  // A sleep and a wake register it again.
  ASSERT_TRUE(node_->Sleep(rank1).ok());
  ASSERT_TRUE(node_->Wake(rank1, MapAgain(1)).ok());
  ASSERT_EQ(Refit(kTp2Refit, 3).outcome, Outcome::kCommitted);
  ExpectRanksHoldTheLastRefit();
}

TEST(ModelSpecRanks, RankIsOptionalAndExpertParallelIsChecked) {
  absl::StatusOr<spec::ModelSpec> s = spec::ParseModelSpec("model: m\ntensor_parallel: {size: 4}\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->tp_size, 4);
  EXPECT_FALSE(s->tp_rank_given);
  s = spec::ParseModelSpec("model: m\ntensor_parallel: {size: 4, rank: 3}\n");
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->tp_rank_given);
  EXPECT_EQ(s->tp_rank, 3);
  s = spec::ParseModelSpec("model: m\ntensor_parallel: {size: 4}\nexpert_parallel: {size: 2}\n");
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("expert_parallel.size"));
  s = spec::ParseModelSpec(R"(model: m
tensor_parallel: {size: 2}
expert_parallel: {size: 2}
rules:
  - match: "e.{i}.w"
    target: "experts.w"
    stack: {capture: i, count: 3}
)");
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("do not split into expert_parallel.size 2"));
  s = spec::ParseModelSpec("model: m\ntensor_parallel: {size: 2}\n");
  absl::StatusOr<spec::ModelSpec> r1 = spec::ForRank(*s, 1);
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(r1->tp_rank, 1);
  EXPECT_FALSE(spec::ForRank(*s, 2).ok());
}

}  // namespace
}  // namespace refit
