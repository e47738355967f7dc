// The committer against real POSIX shared-memory engine storage: engine bytes equal the offline
// engine layout, derived parameters come from staged data (never re-applied), and a partial
// commit touches only what it carries.
#include "refit/committer.h"

#include <unistd.h>

#include <cstring>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "fused_mxfp8_spec.h"
#include "refit/convert.h"
#include "refit/offline.h"
#include "refit/placement.h"
#include "storage/shm_region.h"
#include "storage/shm_storage.h"

namespace refit {
namespace {

using testing::kFusedMxfp8Spec;

uint16_t Bf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  b += 0x7FFFu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}

struct Tensor {
  std::string name;
  Shape shape;
  std::vector<uint16_t> v;
};

std::vector<Tensor> Make(float base) {
  std::vector<Tensor> t = {{"l.gate_proj.weight", {64, 64}, {}}, {"l.up_proj.weight", {32, 64}, {}},
                           {"l.norm.weight", {64}, {}}};
  for (Tensor& x : t) {
    int64_t n = 1;
    for (int64_t d : x.shape) n *= d;
    for (int64_t i = 0; i < n; ++i) x.v.push_back(Bf16(base * static_cast<float>((i * 37) % 101 - 50) / 64.0f));
  }
  return t;
}

class CommitterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = *spec::ParseModelSpec(kFusedMxfp8Spec);
    layout_ = Layout(Make(1.0f));
    std::vector<storage::ShmParam> shm;
    uint64_t off = 0;
    for (const ConvertedTensor& t : layout_) {
      shm.push_back({{t.name, t.dtype, t.shape, t.bytes.size()}, region_name_, off});
      off += (t.bytes.size() + 63) / 64 * 64;
    }
    region_ = *storage::ShmRegion::Create(region_name_, off);
    storage_ = *storage::ShmEngineStorage::Open(shm);
    planner_ = std::make_unique<Planner>(*Planner::Create(spec_, storage_->params()));
  }

  std::vector<ConvertedTensor> Layout(const std::vector<Tensor>& ts) {
    std::vector<InputTensor> in;
    std::vector<storage::ParamInfo> infos;
    for (const Tensor& t : ts) {
      in.push_back({t.name, DType::kBF16, t.shape, t.v.data()});
      infos.push_back({t.name, DType::kBF16, t.shape, t.v.size() * 2});
    }
    converted_ = *ConvertCheckpoint(spec_, in);
    std::map<std::string, const ConvertedTensor*> by;
    for (const auto& c : converted_) by[c.name] = &c;
    return *EngineLayout(spec_, infos, by);
  }

  // Stages `ts` the way a session does (into `pool`) and returns the produced parameters.
  absl::StatusOr<std::vector<size_t>> Stage(const std::vector<Tensor>& ts, Staging& staging) {
    std::set<size_t> produced;
    for (const Tensor& t : ts) {
      absl::StatusOr<TensorPlan> plan = planner_->Plan(t.name, DType::kBF16, t.shape);
      if (!plan.ok()) return plan.status();
      std::vector<formats::MutableBytes> outs;
      for (const Target& target : plan->targets) {
        outs.push_back({*staging.Allocate(target.key, target.spec.dtype, target.spec.shape, target.spec.bytes),
                        target.spec.bytes});
        produced.insert(target.engine_index);
      }
      absl::Status st = ConvertFull({plan->kind, plan->format, plan->transpose},
                                    formats::ConstTensor{DType::kBF16, t.shape, t.v.data()}, spec_.options,
                                    std::nullopt, outs, t.name);
      if (!st.ok()) return st;
    }
    return std::vector<size_t>(produced.begin(), produced.end());
  }

  // Stages `ts` and commits them.
  absl::StatusOr<CommitStats> Commit(const std::vector<Tensor>& ts) {
    StagingPool pool(storage::NewHostMemory());
    Staging staging(1 << 24, pool);
    absl::StatusOr<std::vector<size_t>> produced = Stage(ts, staging);
    if (!produced.ok()) return produced.status();
    return CommitStaged(*planner_, staging, *produced, *storage_);
  }

  std::vector<uint8_t> Read(const std::string& name) {
    int64_t i = planner_->IndexOf(name);
    std::vector<uint8_t> out(planner_->params()[i].nbytes);
    EXPECT_TRUE(storage_->ReadToHost(i, out.data()).ok());
    return out;
  }

  std::string region_name_ = absl::StrCat("/refit-committer-test-", getpid());
  spec::ModelSpec spec_;
  std::vector<ConvertedTensor> converted_, layout_;
  std::unique_ptr<storage::ShmRegion> region_;
  std::unique_ptr<storage::ShmEngineStorage> storage_;
  std::unique_ptr<Planner> planner_;
};

TEST_F(CommitterTest, RepeatedAndPartialCommitsRebuildFromStagedData) {
  const std::vector<Tensor> v1 = Make(1.0f);
  for (int round = 0; round < 3; ++round) {
    auto stats = Commit(v1);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->derived_written, 1u);
    for (const ConvertedTensor& t : layout_) EXPECT_EQ(Read(t.name), t.bytes) << t.name << " round " << round;
  }
  // gemma_weight = RN_bf16(w + 1), checked against the norm's own values (not applied twice).
  std::vector<uint8_t> g = Read("l.norm.gemma_weight");
  for (size_t i = 0; i < v1[2].v.size(); ++i) {
    uint32_t bits = static_cast<uint32_t>(v1[2].v[i]) << 16;
    float w;
    std::memcpy(&w, &bits, 4);
    uint16_t want = Bf16(w + 1.0f), got;
    std::memcpy(&got, g.data() + 2 * i, 2);
    ASSERT_EQ(got, want) << i;
  }
  // A partial commit of the norm alone: the norm and its derived change, the fused MLP not.
  const std::vector<Tensor> v2 = Make(0.5f);
  std::vector<ConvertedTensor> layout2 = Layout(v2);
  ASSERT_TRUE(Commit({v2[2]}).ok());
  for (const ConvertedTensor& t : layout2) {
    bool norm = t.name.rfind("l.norm.", 0) == 0;
    const ConvertedTensor* old = nullptr;
    for (const ConvertedTensor& o : layout_) {
      if (o.name == t.name) old = &o;
    }
    EXPECT_EQ(Read(t.name), norm ? t.bytes : old->bytes) << t.name;
  }
}

// Host memory that says it is device memory: staging "on the device" without a GPU, so that
// what the committer does for device staging runs here (the bytes are plain host bytes).
class HostMemoryAsDevice final : public storage::Memory {
 public:
  storage::MemoryKind kind() const override { return storage::MemoryKind::kDevice; }
  absl::StatusOr<std::shared_ptr<uint8_t>> Allocate(uint64_t bytes) override { return host_->Allocate(bytes); }
  absl::Status CopyWithin(void* dst, const void* src, uint64_t bytes) override {
    return host_->CopyWithin(dst, src, bytes);
  }
  absl::Status CopyToHost(void* dst, const void* src, uint64_t bytes) override {
    return host_->CopyWithin(dst, src, bytes);
  }
  absl::Status CopyFromHost(void* dst, const void* src, uint64_t bytes) override {
    return host_->CopyWithin(dst, src, bytes);
  }
  absl::Status CopyInAsync(void* dst, const void* src, uint64_t bytes) override {
    return host_->CopyWithin(dst, src, bytes);
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }

 private:
  std::unique_ptr<storage::Memory> host_ = storage::NewHostMemory();
};

// Device staging with pieces_in_place: the fused gate/up weight is written as its two staged
// pieces, each at its offset in the engine's parameter (no assembly copy before the pause); the
// swizzled scales (a layout step) and the derived parameter stay whole. Applying the writes gives
// the offline engine layout; without pieces_in_place every write is a whole parameter.
TEST_F(CommitterTest, PiecesInPlaceWriteEachFusedPieceAtItsOffset) {
  for (bool pieces : {false, true}) {
    SCOPED_TRACE(pieces ? "pieces in place" : "whole parameters");
    StagingPool pool(std::make_unique<HostMemoryAsDevice>());
    Staging staging(1 << 24, pool);
    absl::StatusOr<std::vector<size_t>> produced = Stage(Make(1.0f), staging);
    ASSERT_TRUE(produced.ok()) << produced.status();
    PrepareOptions options;
    options.pieces_in_place = pieces;
    absl::StatusOr<PreparedCommit> prepared = PrepareCommit(*planner_, staging, *produced, nullptr, options);
    ASSERT_TRUE(prepared.ok()) << prepared.status();
    std::map<std::string, std::vector<uint8_t>> engine;
    std::map<std::string, int> writes;
    for (const PreparedCommit::Write& w : prepared->writes) {
      const storage::ParamInfo& p = planner_->params()[w.index];
      std::vector<uint8_t>& bytes = engine.try_emplace(p.name, p.nbytes, uint8_t{0xA5}).first->second;
      ASSERT_LE(w.offset + w.bytes, p.nbytes) << p.name;
      std::memcpy(bytes.data() + w.offset, w.data, w.bytes);
      ++writes[p.name];
    }
    EXPECT_EQ(writes["l.gate_up_proj.weight"], pieces ? 2 : 1);
    EXPECT_EQ(writes["l.gate_up_proj.weight_scale_inv"], 1);
    EXPECT_EQ(writes["l.norm.gemma_weight"], 1);
    EXPECT_EQ(prepared->params, engine.size());
    ASSERT_EQ(engine.size(), layout_.size());
    for (const ConvertedTensor& t : layout_) EXPECT_EQ(engine[t.name], t.bytes) << t.name;
  }
}

// staging: direct: the keys PlanPlacement places are converted into the engine's memory, so
// the commit writes nothing for the fused weight and the norm (every piece in place) and writes
// only the swizzled scales and the derived parameter (built from the norm's in-place bytes).
// The engine then holds the offline engine layout.
TEST_F(CommitterTest, PiecesConvertedInPlaceAreNotWrittenAgain) {
  const std::vector<Tensor> ts = Make(2.0f);
  std::vector<std::shared_ptr<const TensorPlan>> plans;
  for (const Tensor& t : ts) plans.push_back(*planner_->SharedPlan(t.name, DType::kBF16, t.shape));
  StagingPool pool(storage::NewHostMemory());
  Staging staging(1 << 24, pool);
  staging.Place(PlanPlacement(*planner_, *storage_, plans));
  absl::StatusOr<std::vector<size_t>> produced = Stage(ts, staging);
  ASSERT_TRUE(produced.ok()) << produced.status();
  EXPECT_EQ(staging.in_place_bytes(), 96u * 64u + 64u * 2u);  // gate + up (MXFP8 bytes) and the norm
  absl::StatusOr<PreparedCommit> prepared = PrepareCommit(*planner_, staging, *produced);
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  std::set<std::string> written;
  for (const PreparedCommit::Write& w : prepared->writes) written.insert(planner_->params()[w.index].name);
  EXPECT_EQ(written, (std::set<std::string>{"l.gate_up_proj.weight_scale_inv", "l.norm.gemma_weight"}));
  EXPECT_EQ(prepared->params, 4u);
  ASSERT_TRUE(WritePrepared(*planner_, *prepared, *storage_).ok());
  for (const ConvertedTensor& t : Layout(ts)) EXPECT_EQ(Read(t.name), t.bytes) << t.name;
}

// PrepareOptions::only_placement (a commit prepared while the last conversions run): a commit
// that builds anything (here swizzled scales and a derived parameter) is kUnavailable, naming the
// parameter, with nothing allocated in the pool. One that only places staged pieces (a spec
// without layout steps or derived parameters, fused pieces written in place on device staging)
// gives the same writes as the ordinary prepare; on host staging its fused weight needs an
// assembly copy, so it too is kUnavailable.
TEST_F(CommitterTest, OnlyPlacementPreparesWhatReadsNoStagedBytesAndRefusesTheRest) {
  PrepareOptions only;
  only.pieces_in_place = true;
  only.only_placement = true;
  {
    StagingPool pool(std::make_unique<HostMemoryAsDevice>());
    Staging staging(1 << 24, pool);
    absl::StatusOr<std::vector<size_t>> produced = Stage(Make(1.0f), staging);
    ASSERT_TRUE(produced.ok()) << produced.status();
    const uint64_t pooled = pool.bytes();
    absl::StatusOr<PreparedCommit> prepared = PrepareCommit(*planner_, staging, *produced, nullptr, only);
    EXPECT_EQ(prepared.status().code(), absl::StatusCode::kUnavailable) << prepared.status();
    EXPECT_THAT(prepared.status().message(), ::testing::HasSubstr("is built at commit"));
    EXPECT_EQ(pool.bytes(), pooled);
  }
  // The same tensors under a spec that builds nothing.
  spec_ = *spec::ParseModelSpec(R"(model: m
rules:
  - match: "l.{p:gate,up}_proj.weight"
    target: "l.gate_up_proj.weight"
    format: mxfp8
    fuse: {capture: p, order: [gate, up]}
  - match: "l.norm.weight"
)");
  std::vector<storage::ParamInfo> infos;
  for (const ConvertedTensor& t : Layout(Make(1.0f))) infos.push_back({t.name, t.dtype, t.shape, t.bytes.size()});
  ASSERT_EQ(infos.size(), 3u);  // the fused weight, its scales, the norm
  planner_ = std::make_unique<Planner>(*Planner::Create(spec_, infos));
  for (bool device : {true, false}) {
    SCOPED_TRACE(device ? "device staging" : "host staging");
    StagingPool pool(device ? std::unique_ptr<storage::Memory>(std::make_unique<HostMemoryAsDevice>())
                            : storage::NewHostMemory());
    Staging staging(1 << 24, pool);
    absl::StatusOr<std::vector<size_t>> produced = Stage(Make(1.0f), staging);
    ASSERT_TRUE(produced.ok()) << produced.status();
    const uint64_t pooled = pool.bytes();
    absl::StatusOr<PreparedCommit> early = PrepareCommit(*planner_, staging, *produced, nullptr, only);
    if (!device) {
      EXPECT_EQ(early.status().code(), absl::StatusCode::kUnavailable) << early.status();
      EXPECT_THAT(early.status().message(), ::testing::HasSubstr("'l.gate_up_proj.weight'"));
      EXPECT_EQ(pool.bytes(), pooled);
      continue;
    }
    ASSERT_TRUE(early.ok()) << early.status();
    PrepareOptions ordinary;
    ordinary.pieces_in_place = true;
    absl::StatusOr<PreparedCommit> late = PrepareCommit(*planner_, staging, *produced, nullptr, ordinary);
    ASSERT_TRUE(late.ok()) << late.status();
    ASSERT_EQ(early->writes.size(), late->writes.size());
    EXPECT_EQ(early->writes.size(), 5u);  // gate and up of the weight and of its scales, the norm
    for (size_t i = 0; i < early->writes.size(); ++i) {
      EXPECT_EQ(early->writes[i].index, late->writes[i].index);
      EXPECT_EQ(early->writes[i].offset, late->writes[i].offset);
      EXPECT_EQ(early->writes[i].data, late->writes[i].data);
      EXPECT_EQ(early->writes[i].bytes, late->writes[i].bytes);
    }
    EXPECT_EQ(early->params, late->params);
    EXPECT_EQ(pool.bytes(), pooled);
  }
}

TEST_F(CommitterTest, SwizzledScalesAreTheEngineShape) {
  int64_t i = planner_->IndexOf("l.gate_up_proj.weight_scale_inv");
  ASSERT_GE(i, 0);
  EXPECT_EQ(planner_->params()[i].shape, (Shape{128, 4}));  // 96 rows x 2 blocks, padded
}

}  // namespace
}  // namespace refit
