// Derived engine copies against the layout goldens (tests/golden/make_layout_goldens.py: FlashInfer
// 0.7.2.post1's shuffles run on the CPU, SGLang's MLA post_load_weights transcribed): a spec keeps
// the checkpoint-layout MoE weights and their TRT-LLM shuffled copies, and SGLang's w_kc / w_vc
// beside kv_b_proj; every commit rewrites the copies from the staged sources, offline and online
// agree, and a partial refit of one expert rewrites exactly that expert's parameters in every copy.
#include <unistd.h>

#include <cstring>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "formats/moe_shuffle.h"
#include "formats/safetensors.h"
#include "gtest/gtest.h"
#include "refit/committer.h"
#include "refit/convert.h"
#include "refit/converter.h"
#include "refit/offline.h"
#include "refit/planner.h"
#include "storage/shm_region.h"
#include "storage/shm_storage.h"

namespace refit {
namespace {

constexpr char kSpec[] = R"(model: m
rules:
  - match: "l.experts.{e}.w13_weight"
    target: "l.experts.w13_weight"
    format: passthrough
    stack: {capture: e, count: 2}
  - match: "l.experts.{e}.w13_weight_scale"
    target: "l.experts.w13_weight_scale"
    format: passthrough
    stack: {capture: e, count: 2}
  - match: "l.experts.{e}.w2_weight"
    format: passthrough
    partial: true
  - match: "l.experts.{e}.w2_weight_scale"
    format: passthrough
    partial: true
  - match: "l.attn.kv_b_proj.weight"
    format: passthrough
  - match: "l.dense.sf"
    format: passthrough
    layout: [{op: shuffle_matrix_sf_a, on: data}]
  - match: "l.attn_fp8.kv_b_proj.weight"
    format: passthrough
  - match: "l.attn_fp8.kv_b_proj.weight_scale_inv"
    format: passthrough
derived:
  - target: "l.experts.w13_weight_trtllm"
    from: "l.experts.w13_weight"
    op: layout
    layout:
      - {op: swap_halves, dim: -2}
      - {op: reorder_rows_for_gated_act_gemm}
      - {op: shuffle_matrix_a, epilogue_tile_m: 128}
  - target: "l.experts.w13_weight_scale_trtllm"
    from: "l.experts.w13_weight_scale"
    op: layout
    layout:
      - {op: swap_halves, dim: -2}
      - {op: reorder_rows_for_gated_act_gemm}
      - {op: shuffle_matrix_sf_a}
  - target: "l.experts.{e}.w2_weight_trtllm"
    from: "l.experts.{e}.w2_weight"
    op: layout
    layout: [{op: shuffle_matrix_a}]
  - target: "l.experts.{e}.w2_weight_scale_trtllm"
    from: "l.experts.{e}.w2_weight_scale"
    op: layout
    layout: [{op: shuffle_matrix_sf_a}]
  - {target: "l.attn.w_kc", from: "l.attn.kv_b_proj.weight", op: mla_w_kc, qk_nope_head_dim: 128, v_head_dim: 128}
  - {target: "l.attn.w_vc", from: "l.attn.kv_b_proj.weight", op: mla_w_vc, qk_nope_head_dim: 128, v_head_dim: 128}
  - target: "l.attn_fp8.w_kc"
    from: "l.attn_fp8.kv_b_proj.weight"
    scale: "l.attn_fp8.kv_b_proj.weight_scale_inv"
    op: mla_w_kc
    qk_nope_head_dim: 128
    v_head_dim: 128
  - target: "l.attn_fp8.w_vc"
    from: "l.attn_fp8.kv_b_proj.weight"
    scale: "l.attn_fp8.kv_b_proj.weight_scale_inv"
    op: mla_w_vc
    qk_nope_head_dim: 128
    v_head_dim: 128
)";

struct Golden {
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
};

class DerivedLayoutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto spec = spec::ParseModelSpec(kSpec);
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec_ = *spec;
    for (const char* file : {"moe_shuffle.safetensors", "mla_absorb.safetensors"}) {
      auto f = formats::SafetensorsFile::Open(std::string(REFIT_LAYOUT_GOLDEN_DIR) + "/" + file);
      ASSERT_TRUE(f.ok()) << f.status();
      for (const formats::SafetensorsEntry& e : (*f)->view().tensors()) {
        auto d = (*f)->view().Data(e);
        golden_[e.name] = Golden{e.dtype, e.shape, std::vector<uint8_t>(d.begin(), d.end())};
      }
    }
    // The trainer's tensors: expert slices of the golden inputs, kv_b_proj as it is.
    for (int e = 0; e < 2; ++e) {
      inputs_.push_back(Slice("in.nvfp4_w13.data", e, absl::StrCat("l.experts.", e, ".w13_weight")));
      inputs_.push_back(Slice("in.nvfp4_w13.scale", e, absl::StrCat("l.experts.", e, ".w13_weight_scale")));
      inputs_.push_back(Slice("in.nvfp4_w2.data", e, absl::StrCat("l.experts.", e, ".w2_weight")));
      inputs_.push_back(Slice("in.nvfp4_w2.scale", e, absl::StrCat("l.experts.", e, ".w2_weight_scale")));
    }
    inputs_.push_back(Whole("in.bf16.weight", "l.attn.kv_b_proj.weight"));
    inputs_.push_back(Slice("in.nvfp4_w2.scale", 0, "l.dense.sf"));  // a rule's own layout step
    inputs_.push_back(Whole("in.fp8.weight", "l.attn_fp8.kv_b_proj.weight"));
    inputs_.push_back(Whole("in.fp8.weight_scale_inv", "l.attn_fp8.kv_b_proj.weight_scale_inv"));
    std::vector<storage::ParamInfo> infos;
    for (const ConvertedTensor& t : inputs_) infos.push_back({t.name, t.dtype, t.shape, t.bytes.size()});
    auto params = EngineParamInfos(spec_, infos);
    ASSERT_TRUE(params.ok()) << params.status();
    std::vector<storage::ShmParam> shm;
    uint64_t off = 0;
    for (const storage::ParamInfo& p : *params) {
      shm.push_back({p, region_name_, off});
      off += (p.nbytes + 63) / 64 * 64;
    }
    region_ = *storage::ShmRegion::Create(region_name_, off);
    storage_ = *storage::ShmEngineStorage::Open(shm);
    auto planner = Planner::Create(spec_, storage_->params());
    ASSERT_TRUE(planner.ok()) << planner.status();
    planner_ = std::make_unique<Planner>(std::move(*planner));
  }

  ConvertedTensor Slice(const std::string& golden, int e, const std::string& name) {
    const Golden& g = golden_.at(golden);
    Shape shape(g.shape.begin() + 1, g.shape.end());
    const size_t n = g.bytes.size() / static_cast<size_t>(g.shape[0]);
    return {name, g.dtype, shape, std::vector<uint8_t>(g.bytes.begin() + e * n, g.bytes.begin() + (e + 1) * n)};
  }
  ConvertedTensor Whole(const std::string& golden, const std::string& name) {
    const Golden& g = golden_.at(golden);
    return {name, g.dtype, g.shape, g.bytes};
  }
  std::vector<uint8_t> Part(const std::string& golden, int e, int parts) {
    const Golden& g = golden_.at(golden);
    const size_t n = g.bytes.size() / static_cast<size_t>(parts);
    return std::vector<uint8_t>(g.bytes.begin() + e * n, g.bytes.begin() + (e + 1) * n);
  }

  absl::StatusOr<CommitStats> Commit(const std::vector<ConvertedTensor>& ts) {
    StagingPool pool(storage::NewHostMemory());
    Staging staging(1 << 24, pool);
    absl::StatusOr<std::vector<size_t>> produced = Stage(ts, staging);
    if (!produced.ok()) return produced.status();
    return CommitStaged(*planner_, staging, *produced, *storage_);
  }

  absl::StatusOr<std::vector<size_t>> Stage(const std::vector<ConvertedTensor>& ts, Staging& staging) {
    std::set<size_t> produced;
    for (const ConvertedTensor& t : ts) {
      absl::StatusOr<TensorPlan> plan = planner_->Plan(t.name, t.dtype, t.shape);
      if (!plan.ok()) return plan.status();
      for (const Target& target : plan->targets) {
        absl::StatusOr<uint8_t*> buf =
            staging.Allocate(target.key, target.spec.dtype, target.spec.shape, target.spec.bytes);
        if (!buf.ok()) return buf.status();
        if (target.spec.bytes != t.bytes.size()) return absl::InternalError("passthrough of another size");
        std::memcpy(*buf, t.bytes.data(), t.bytes.size());
        produced.insert(target.engine_index);
      }
    }
    return std::vector<size_t>(produced.begin(), produced.end());
  }

  std::vector<uint8_t> Read(const std::string& name) {
    int64_t i = planner_->IndexOf(name);
    EXPECT_GE(i, 0) << name;
    if (i < 0) return {};
    std::vector<uint8_t> out(planner_->params()[static_cast<size_t>(i)].nbytes);
    EXPECT_TRUE(storage_->ReadToHost(static_cast<size_t>(i), out.data()).ok());
    return out;
  }

  // Every derived copy against its golden.
  void ExpectGoldenCopies() {
    EXPECT_EQ(Read("l.experts.w13_weight_trtllm"), golden_.at("out.nvfp4_w13.data").bytes);
    EXPECT_EQ(Read("l.experts.w13_weight_scale_trtllm"), golden_.at("out.nvfp4_w13.scale").bytes);
    for (int e = 0; e < 2; ++e) {
      EXPECT_EQ(Read(absl::StrCat("l.experts.", e, ".w2_weight_trtllm")), Part("out.nvfp4_w2.data", e, 2)) << e;
      EXPECT_EQ(Read(absl::StrCat("l.experts.", e, ".w2_weight_scale_trtllm")), Part("out.nvfp4_w2.scale", e, 2)) << e;
    }
    EXPECT_EQ(Read("l.dense.sf"), Part("out.nvfp4_w2.scale", 0, 2));
    EXPECT_EQ(Read("l.attn.w_kc"), golden_.at("out.bf16.w_kc").bytes);
    EXPECT_EQ(Read("l.attn.w_vc"), golden_.at("out.bf16.w_vc").bytes);
    EXPECT_EQ(Read("l.attn_fp8.w_kc"), golden_.at("out.fp8.w_kc").bytes);
    EXPECT_EQ(Read("l.attn_fp8.w_vc"), golden_.at("out.fp8.w_vc").bytes);
  }

  std::string region_name_ = absl::StrCat("/refit-derived-layout-test-", getpid());
  spec::ModelSpec spec_;
  std::map<std::string, Golden> golden_;
  std::vector<ConvertedTensor> inputs_;
  std::unique_ptr<storage::ShmRegion> region_;
  std::unique_ptr<storage::ShmEngineStorage> storage_;
  std::unique_ptr<Planner> planner_;
};

TEST_F(DerivedLayoutTest, RegisteredShapesOfTheCopies) {
  auto shape = [&](const std::string& n) {
    return planner_->params()[static_cast<size_t>(planner_->IndexOf(n))].shape;
  };
  EXPECT_EQ(shape("l.experts.w13_weight_trtllm"), (Shape{2, 256, 128}));
  EXPECT_EQ(shape("l.experts.w13_weight_scale_trtllm"), (Shape{2, 256, 16}));
  EXPECT_EQ(shape("l.attn.w_kc"), (Shape{2, 512, 128}));
  EXPECT_EQ(shape("l.attn.w_vc"), (Shape{2, 128, 512}));
}

TEST_F(DerivedLayoutTest, OfflineEngineLayoutEqualsTheGoldens) {
  std::vector<storage::ParamInfo> infos;
  std::map<std::string, const ConvertedTensor*> by;
  for (const ConvertedTensor& t : inputs_) {
    infos.push_back({t.name, t.dtype, t.shape, t.bytes.size()});
    by[t.name] = &t;
  }
  auto layout = EngineLayout(spec_, infos, by);
  ASSERT_TRUE(layout.ok()) << layout.status();
  std::map<std::string, std::vector<uint8_t>> got;
  for (ConvertedTensor& t : *layout) got[t.name] = std::move(t.bytes);
  EXPECT_EQ(got["l.experts.w13_weight_trtllm"], golden_.at("out.nvfp4_w13.data").bytes);
  EXPECT_EQ(got["l.experts.w13_weight_scale_trtllm"], golden_.at("out.nvfp4_w13.scale").bytes);
  EXPECT_EQ(got["l.experts.1.w2_weight_scale_trtllm"], Part("out.nvfp4_w2.scale", 1, 2));
  EXPECT_EQ(got["l.attn.w_kc"], golden_.at("out.bf16.w_kc").bytes);
  EXPECT_EQ(got["l.attn_fp8.w_vc"], golden_.at("out.fp8.w_vc").bytes);
}

TEST_F(DerivedLayoutTest, EveryCommitRewritesBothCopiesFromStagedData) {
  for (int round = 0; round < 3; ++round) {
    auto stats = Commit(inputs_);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->derived_written, 10u);
    // The checkpoint-layout parameters as sent, and each copy as its oracle computes it (not
    // shuffled twice).
    EXPECT_EQ(Read("l.experts.w13_weight"), golden_.at("in.nvfp4_w13.data").bytes);
    EXPECT_EQ(Read("l.attn.kv_b_proj.weight"), golden_.at("in.bf16.weight").bytes);
    ExpectGoldenCopies();
  }
}

TEST_F(DerivedLayoutTest, PartialRefitOfOneExpertRewritesThatExpertInEveryCopy) {
  ASSERT_TRUE(Commit(inputs_).ok());
  std::map<std::string, std::vector<uint8_t>> before;
  for (const storage::ParamInfo& p : planner_->params()) before[p.name] = Read(p.name);
  // Expert 1 refit alone, with expert 0's values: its copies must become expert 0's goldens.
  ConvertedTensor w = Slice("in.nvfp4_w2.data", 0, "l.experts.1.w2_weight");
  ConvertedTensor s = Slice("in.nvfp4_w2.scale", 0, "l.experts.1.w2_weight_scale");
  auto st = Commit({w, s});
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->params_written, 2u);
  EXPECT_EQ(st->derived_written, 2u);
  const std::set<std::string> changed = {"l.experts.1.w2_weight", "l.experts.1.w2_weight_scale",
                                         "l.experts.1.w2_weight_trtllm", "l.experts.1.w2_weight_scale_trtllm"};
  for (const storage::ParamInfo& p : planner_->params()) {
    if (changed.count(p.name) == 0) {
      EXPECT_EQ(Read(p.name), before[p.name]) << p.name << " changed";
    }
  }
  EXPECT_EQ(Read("l.experts.1.w2_weight_trtllm"), Part("out.nvfp4_w2.data", 0, 2));
  EXPECT_EQ(Read("l.experts.1.w2_weight_scale_trtllm"), Part("out.nvfp4_w2.scale", 0, 2));
}

// Host memory that says it is device memory, and device ops that refuse every call: with device
// staging the row shuffles and the derived copies are built on the host from the staged bytes
// and uploaded, and need no device kernel.
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

class NoDeviceOps final : public DeviceOps {
 public:
  absl::Status ConvertPlanned(const TensorPlan&, const TensorDesc&, const uint8_t*, storage::MemoryKind,
                              std::span<const formats::MutableBytes>, const formats::QuantizeOptions&,
                              const PlannedAmax&) override {
    return Refuse();
  }
  absl::Status ResetAmax(float*) override { return Refuse(); }
  absl::Status AccumulateAmax(const TensorDesc&, const uint8_t*, storage::MemoryKind, const formats::QuantizeOptions&,
                              float*) override {
    return Refuse();
  }
  absl::Status Copy(uint8_t*, const uint8_t*, uint64_t, storage::MemoryKind) override { return Refuse(); }
  absl::Status Copy2D(uint8_t*, uint64_t, const uint8_t*, uint64_t, uint64_t, uint64_t) override { return Refuse(); }
  absl::Status Zero(uint8_t*, uint64_t) override { return Refuse(); }
  absl::Status Swizzle128x4(const uint8_t*, int64_t, int64_t, int64_t, uint8_t*, uint64_t) override { return Refuse(); }
  absl::Status PackUe8m0(const float*, int64_t, int64_t, int64_t, int32_t*, uint64_t, const std::string&) override {
    return Refuse();
  }
  absl::Status AddOne(const uint8_t*, DType, int64_t, uint8_t*) override { return Refuse(); }
  absl::Status Synchronize() override { return absl::OkStatus(); }

 private:
  static absl::Status Refuse() { return absl::InternalError("a device op was called"); }
};

TEST_F(DerivedLayoutTest, DeviceStagingBuildsTheShufflesOnTheHost) {
  StagingPool pool(std::make_unique<HostMemoryAsDevice>());
  Staging staging(1 << 24, pool);
  absl::StatusOr<std::vector<size_t>> produced = Stage(inputs_, staging);
  ASSERT_TRUE(produced.ok()) << produced.status();
  NoDeviceOps ops;
  absl::StatusOr<PreparedCommit> prepared = PrepareCommit(*planner_, staging, *produced, &ops);
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  std::map<std::string, std::vector<uint8_t>> engine;
  for (const PreparedCommit::Write& w : prepared->writes) {
    const storage::ParamInfo& p = planner_->params()[w.index];
    std::vector<uint8_t>& bytes = engine.try_emplace(p.name, p.nbytes, uint8_t{0xA5}).first->second;
    ASSERT_LE(w.offset + w.bytes, p.nbytes) << p.name;
    std::memcpy(bytes.data() + w.offset, w.data, w.bytes);
  }
  EXPECT_EQ(prepared->derived, 10u);
  EXPECT_EQ(engine["l.dense.sf"], Part("out.nvfp4_w2.scale", 0, 2));
  EXPECT_EQ(engine["l.experts.w13_weight_scale_trtllm"], golden_.at("out.nvfp4_w13.scale").bytes);
  EXPECT_EQ(engine["l.attn_fp8.w_kc"], golden_.at("out.fp8.w_kc").bytes);
}

TEST(DerivedLayoutSpec, RefusesWhatTheOpsCannotTake) {
  auto err = [](const std::string& derived) {
    auto s = spec::ParseModelSpec(std::string("model: m\nderived:\n") + derived);
    return s.ok() ? std::string("ok") : std::string(s.status().message());
  };
  EXPECT_NE(err("  - {target: a, from: b, op: layout}\n").find("op layout needs 'layout' steps"), std::string::npos);
  EXPECT_NE(err("  - {target: a, from: b, op: add_one, layout: [{op: shuffle_matrix_a}]}\n")
                .find("only op layout takes 'layout'"),
            std::string::npos);
  EXPECT_NE(err("  - {target: a, from: b, op: layout, layout: [{op: pack_ue8m0}]}\n").find("pack_ue8m0"),
            std::string::npos);
  EXPECT_NE(err("  - {target: a, from: b, op: layout, layout: [{op: swap_halves, dim: 0, epilogue_tile_m: 64}]}\n")
                .find("takes no 'epilogue_tile_m'"),
            std::string::npos);
  EXPECT_NE(err("  - {target: a, from: b, op: mla_w_kc}\n").find("qk_nope_head_dim"), std::string::npos);
  EXPECT_NE(err("  - {target: a, from: b, op: add_one, scale: c}\n").find("only the mla ops take 'scale'"),
            std::string::npos);
}

// The row permutations move the rows along `dim` (default -2), each row all the elements after
// it: gpt-oss's MXFP4 `_blocks` [E, N, K/32, 16] have their rows at dim 1, a bias [E, N] at -1
// (FlashInfer shuffles `w[e].view(uint8)` [N, K/2] and `bias[e].reshape(-1, 1)`).
TEST(DerivedLayoutSpec, RowPermutationsAlongAnotherDim) {
  auto spec = spec::ParseModelSpec(R"(model: m
rules:
  - {match: "l.blocks", format: passthrough}
  - {match: "l.bias", format: passthrough}
derived:
  - {target: "l.blocks_shuffled", from: "l.blocks", op: layout, layout: [{op: shuffle_matrix_a, dim: 1}]}
  - {target: "l.blocks_gated", from: "l.blocks", op: layout, layout: [{op: reorder_rows_for_gated_act_gemm, dim: -3}]}
  - {target: "l.bias_shuffled", from: "l.bias", op: layout, layout: [{op: shuffle_matrix_a, dim: -1}]}
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  constexpr int64_t kE = 2, kN = 64, kBlocks = 3, kBlockBytes = 4;
  const uint64_t row_bytes = kBlocks * kBlockBytes;
  ConvertedTensor blocks{
      "l.blocks", DType::kU8, {kE, kN, kBlocks, kBlockBytes}, std::vector<uint8_t>(kE * kN * row_bytes)};
  for (size_t i = 0; i < blocks.bytes.size(); ++i) blocks.bytes[i] = static_cast<uint8_t>(i * 7 + i / 251);
  ConvertedTensor bias{"l.bias", DType::kBF16, {kE, kN}, std::vector<uint8_t>(kE * kN * 2)};
  for (size_t i = 0; i < bias.bytes.size(); ++i) bias.bytes[i] = static_cast<uint8_t>(i * 13 + 1);
  std::vector<storage::ParamInfo> infos = {{blocks.name, blocks.dtype, blocks.shape, blocks.bytes.size()},
                                           {bias.name, bias.dtype, bias.shape, bias.bytes.size()}};
  auto layout = EngineLayout(*spec, infos, {{blocks.name, &blocks}, {bias.name, &bias}});
  ASSERT_TRUE(layout.ok()) << layout.status();
  std::map<std::string, ConvertedTensor> got;
  for (ConvertedTensor& t : *layout) got[t.name] = std::move(t);
  // Each expert's rows permuted whole, as formats::PermuteRows does for a [E, N, row] matrix.
  auto permuted = [](const std::vector<uint8_t>& in, uint64_t row, const std::vector<int64_t>& source) {
    std::vector<uint8_t> out(in.size());
    EXPECT_TRUE(formats::PermuteRows(kE, row, source, in, out).ok());
    return out;
  };
  const std::vector<int64_t> shuffle = *formats::ShuffleMatrixARowSource(kN, 128);
  const std::vector<int64_t> gated = *formats::GatedActRowSource(kN);
  EXPECT_EQ(got.at("l.blocks_shuffled").shape, blocks.shape);
  EXPECT_EQ(got.at("l.blocks_shuffled").bytes, permuted(blocks.bytes, row_bytes, shuffle));
  EXPECT_EQ(got.at("l.blocks_gated").bytes, permuted(blocks.bytes, row_bytes, gated));
  EXPECT_EQ(got.at("l.bias_shuffled").shape, bias.shape);
  EXPECT_EQ(got.at("l.bias_shuffled").bytes, permuted(bias.bytes, 2, shuffle));
  // Not a whole number of 32-row blocks along the dim: named.
  auto p = Planner::Create(
      *spec, {{"l.blocks", DType::kU8, {2, 48, 3, 4}, 1152}, {"l.blocks_shuffled", DType::kU8, {2, 48, 3, 4}, 1152}});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("48 rows are not a multiple of 32"), std::string::npos) << p.status();
  // shuffle_matrix_sf_a's rows are dim -2 (the 128x4 interleave after it is 2-D): no dim.
  auto sf = spec::ParseModelSpec(
      "model: m\nderived:\n  - {target: a, from: b, op: layout, layout: [{op: shuffle_matrix_sf_a, dim: 1}]}\n");
  ASSERT_FALSE(sf.ok());
  EXPECT_NE(sf.status().message().find("shuffle_matrix_sf_a takes no 'dim'"), std::string::npos) << sf.status();
}

TEST(DerivedLayoutPlanner, NamesTheParameterWhoseShapeCannotBeDerived) {
  auto spec = spec::ParseModelSpec(R"(model: m
rules:
  - {match: "l.w", format: passthrough}
derived:
  - target: "l.w_shuffled"
    from: "l.w"
    op: layout
    layout: [{op: shuffle_matrix_a}]
  - {target: "l.kc", from: "l.kv", op: mla_w_kc, qk_nope_head_dim: 128, v_head_dim: 128}
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  // 48 rows: not whole blocks of 32.
  auto p = Planner::Create(*spec, {{"l.w", DType::kU8, {48, 8}, 384}, {"l.w_shuffled", DType::kU8, {48, 8}, 384}});
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("derived parameter 'l.w_shuffled'"), std::string::npos) << p.status();
  EXPECT_NE(p.status().message().find("48 rows are not a multiple of 32"), std::string::npos) << p.status();
  // kv_b_proj of F32: neither BF16 nor FP8 with a scale.
  auto q =
      Planner::Create(*spec, {{"l.kv", DType::kF32, {256, 64}, 65536}, {"l.kc", DType::kBF16, {1, 64, 128}, 16384}});
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().message().find("must be BF16"), std::string::npos) << q.status();
  // A source laid out by its own rule: the derived op would read other bytes than registered.
  auto laid = spec::ParseModelSpec(R"(model: m
rules:
  - {match: "l.w", format: passthrough, layout: [{op: shuffle_matrix_a, on: data}]}
derived:
  - {target: "l.w_copy", from: "l.w", op: layout, layout: [{op: reorder_rows_for_gated_act_gemm}]}
)");
  ASSERT_TRUE(laid.ok()) << laid.status();
  auto l = Planner::Create(*laid, {{"l.w", DType::kU8, {64, 8}, 512}, {"l.w_copy", DType::kU8, {64, 8}, 512}});
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("reads 'l.w', which is laid out by its rule's layout steps"), std::string::npos)
      << l.status();
  // A registered shape that is not what the op gives.
  auto r =
      Planner::Create(*spec, {{"l.kv", DType::kBF16, {256, 64}, 32768}, {"l.kc", DType::kBF16, {1, 128, 64}, 16384}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("it would be BF16[1,64,128]"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace refit
