// Planner and Ledger against engine layouts built by the offline path (no hand-written engine).
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "refit/ledger.h"
#include "refit/offline.h"
#include "refit/planner.h"

namespace refit {
namespace {

using ::testing::HasSubstr;

constexpr char kSpec[] = R"(model: m
tensor_parallel: {size: 2, rank: 1}
rules:
  - match: "l.{L}.mlp.{p:gate,up}_proj.weight"
    target: "l.{L}.mlp.gate_up_proj.weight"
    format: fp8_block128
    fuse: {capture: p, order: [gate, up]}
    shard: {dim: 0}
  - match: "l.{L}.experts.{E}.{p:w1,w3}.weight"
    target: "l.{L}.experts.w13"
    format: nvfp4
    fuse: {capture: p, order: [w1, w3]}
    stack: {capture: E, count: 2}
    partial: true
  - match: "l.{L}.norm.weight"
    partial: true
  - match: "**.input_scale"
    refit: never
)";

std::vector<storage::ParamInfo> Inputs() {
  return {{"l.0.mlp.gate_proj.weight", DType::kBF16, {256, 128}, 0},
          {"l.0.mlp.up_proj.weight", DType::kBF16, {256, 128}, 0},
          {"l.0.experts.0.w1.weight", DType::kBF16, {32, 64}, 0},
          {"l.0.experts.0.w3.weight", DType::kBF16, {32, 64}, 0},
          {"l.0.experts.1.w1.weight", DType::kBF16, {32, 64}, 0},
          {"l.0.experts.1.w3.weight", DType::kBF16, {32, 64}, 0},
          {"l.0.norm.weight", DType::kBF16, {128}, 0},
          {"l.0.experts.0.w1.input_scale", DType::kF32, {}, 0}};
}

class PlannerLedgerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = spec::ParseModelSpec(kSpec);
    ASSERT_TRUE(s.ok()) << s.status();
    spec_ = std::move(*s);
    // Engine layout: what the offline path says the engine holds (zero-filled checkpoint).
    std::vector<std::vector<uint8_t>> data;
    std::vector<InputTensor> in;
    for (const auto& p : Inputs()) {
      data.emplace_back(*DenseBytes(p.dtype, p.shape), 0);
      if (p.dtype == DType::kBF16) {
        for (size_t i = 0; i < data.back().size(); i += 2) data.back()[i + 1] = 0x3F;  // 0.5..
      }
      in.push_back({p.name, p.dtype, p.shape, data.back().data()});
    }
    auto conv = ConvertCheckpoint(spec_, in);
    ASSERT_TRUE(conv.ok()) << conv.status();
    std::map<std::string, const ConvertedTensor*> by;
    for (const auto& t : *conv) by[t.name] = &t;
    auto layout = EngineLayout(spec_, Inputs(), by);
    ASSERT_TRUE(layout.ok()) << layout.status();
    std::vector<storage::ParamInfo> params;
    for (const auto& t : *layout) params.push_back({t.name, t.dtype, t.shape, t.bytes.size()});
    auto p = Planner::Create(spec_, params);
    ASSERT_TRUE(p.ok()) << p.status();
    planner_ = std::make_unique<Planner>(std::move(*p));
  }
  TensorDesc Desc(const std::string& name) {
    for (const auto& p : Inputs()) {
      if (p.name == name) return {p.name, p.dtype, p.shape, 0, *DenseBytes(p.dtype, p.shape)};
    }
    return {};
  }
  spec::ModelSpec spec_;
  std::unique_ptr<Planner> planner_;
};

TEST_F(PlannerLedgerTest, EngineParamsKnowTheirSlots) {
  int64_t i = planner_->IndexOf("l.0.experts.w13_scale_2");
  ASSERT_GE(i, 0);
  EXPECT_EQ(planner_->params()[i].shape, (Shape{2, 2}));
  EXPECT_EQ(planner_->source(i).slots, (std::vector<std::string>{"l.0.experts.0.w1.weight_scale_2",
                                                                 "l.0.experts.0.w3.weight_scale_2",
                                                                 "l.0.experts.1.w1.weight_scale_2",
                                                                 "l.0.experts.1.w3.weight_scale_2"}));
  int64_t gu = planner_->IndexOf("l.0.mlp.gate_up_proj.weight");
  EXPECT_EQ(planner_->params()[gu].shape, (Shape{256, 128}));  // this rank's halves of 2 x 256 rows
  EXPECT_EQ(planner_->source(planner_->IndexOf("l.0.experts.0.w1.input_scale")).kind, ParamSource::Kind::kKept);
}

TEST_F(PlannerLedgerTest, PlanGivesSlotsShardsAndAmaxGroups) {
  auto plan = planner_->Plan("l.0.experts.1.w3.weight", DType::kBF16, {32, 64});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->targets[0].slot, 3);
  EXPECT_EQ(plan->amax_group, (std::vector<std::string>{"l.0.experts.1.w1.weight", "l.0.experts.1.w3.weight"}));
  auto up = planner_->Plan("l.0.mlp.up_proj.weight", DType::kBF16, {256, 128});
  ASSERT_TRUE(up.ok());
  EXPECT_EQ(up->targets[0].spec.shape, (Shape{128, 128}));
  EXPECT_EQ(up->shard_index, 1);
  EXPECT_THAT(planner_->Plan("l.0.experts.0.w1.input_scale", DType::kF32, {}).status().message(),
              HasSubstr("refits never carry it"));
  EXPECT_THAT(planner_->Plan("l.0.mlp.gate_proj.weight", DType::kBF16, {384, 128}).status().message(),
              HasSubstr("cuts a 128-element fp8_block128 block"));
  EXPECT_THAT(planner_->Plan("l.1.norm.weight", DType::kBF16, {128}).status().message(),
              HasSubstr("the engine has no parameter of this name"));
}

TEST_F(PlannerLedgerTest, PlansAreMemoizedPerNameDtypeAndShape) {
  auto first = planner_->SharedPlan("l.0.experts.1.w3.weight", DType::kBF16, {32, 64});
  ASSERT_TRUE(first.ok()) << first.status();
  auto again = planner_->SharedPlan("l.0.experts.1.w3.weight", DType::kBF16, {32, 64});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(first->get(), again->get());  // resolved once
  // Another dtype is planned afresh (F32 input quantizes to the same outputs).
  auto f32 = planner_->SharedPlan("l.0.experts.1.w3.weight", DType::kF32, {32, 64});
  ASSERT_TRUE(f32.ok()) << f32.status();
  EXPECT_NE(f32->get(), first->get());
  EXPECT_EQ((*f32)->targets[0].key, (*first)->targets[0].key);
  // Errors are not memoized: a wrong shape fails every time, and does not hide the right one.
  EXPECT_THAT(planner_->SharedPlan("l.0.mlp.gate_proj.weight", DType::kBF16, {384, 128}).status().message(),
              HasSubstr("cuts a 128-element fp8_block128 block"));
  EXPECT_THAT(planner_->SharedPlan("l.0.mlp.gate_proj.weight", DType::kBF16, {384, 128}).status().message(),
              HasSubstr("cuts a 128-element fp8_block128 block"));
  EXPECT_TRUE(planner_->SharedPlan("l.0.mlp.gate_proj.weight", DType::kBF16, {256, 128}).ok());
  // Plan() hands out a copy of the memoized plan.
  auto copy = planner_->Plan("l.0.experts.1.w3.weight", DType::kBF16, {32, 64});
  ASSERT_TRUE(copy.ok());
  EXPECT_EQ(copy->targets[0].key, "l.0.experts.1.w3.weight");
}

TEST_F(PlannerLedgerTest, FullRefitNeedsEverySlotExactlyOnce) {
  Ledger ok(*planner_);
  for (const auto& p : Inputs()) {
    if (p.name.find("input_scale") == std::string::npos) {
      ASSERT_TRUE(ok.Arrive(Desc(p.name)).ok()) << p.name;
    }
  }
  EXPECT_TRUE(ok.Check(false).ok()) << ok.Check(false);

  Ledger stranded(*planner_);
  for (const auto& p : Inputs()) {
    if (p.name.find("input_scale") == std::string::npos && p.name != "l.0.experts.1.w3.weight" &&
        p.name != "l.0.mlp.up_proj.weight") {
      ASSERT_TRUE(stranded.Arrive(Desc(p.name)).ok());
    }
  }
  absl::Status s = stranded.Check(false);
  EXPECT_THAT(s.message(), HasSubstr("incomplete: engine parameter 'l.0.mlp.gate_up_proj.weight' lacks "
                                     "'l.0.mlp.up_proj.weight'"));
  EXPECT_THAT(s.message(), HasSubstr("incomplete: engine parameter 'l.0.experts.w13' lacks 'l.0.experts.1.w3.weight'"));
  EXPECT_THAT(s.message(), HasSubstr("'l.0.experts.w13_scale' lacks 'l.0.experts.1.w3.weight_scale'"));

  Ledger dup(*planner_);
  ASSERT_TRUE(dup.Arrive(Desc("l.0.norm.weight")).ok());
  EXPECT_FALSE(dup.Arrive(Desc("l.0.norm.weight")).ok());
  EXPECT_THAT(dup.Check(true).message(), HasSubstr("duplicate: tensor 'l.0.norm.weight' arrived 2 times"));
}

// The assembled-shape check is remembered by the plans that staged each parameter's slots: the
// same plans again check out without assembling, another plan of a name (another shape) is checked
// anew, and a mismatch is never hidden by an earlier refit that checked out.
TEST_F(PlannerLedgerTest, TheShapeCheckIsRememberedByPlanNeverByName) {
  auto full = [&](const std::string& odd, const Shape& odd_shape) {
    auto ledger = std::make_unique<Ledger>(*planner_);
    for (const auto& p : Inputs()) {
      if (p.name.find("input_scale") != std::string::npos) continue;
      TensorDesc d = Desc(p.name);
      if (p.name == odd) {
        d.shape = odd_shape;
        d.nbytes = *DenseBytes(d.dtype, d.shape);
      }
      EXPECT_TRUE(ledger->Arrive(d).ok()) << p.name;
    }
    return ledger;
  };
  EXPECT_TRUE(full("", {})->Check(false).ok());
  const int64_t w13 = planner_->IndexOf("l.0.experts.w13");
  ASSERT_GE(w13, 0);
  std::vector<const TensorPlan*> plans;
  for (const char* n : {"l.0.experts.0.w1.weight", "l.0.experts.0.w3.weight", "l.0.experts.1.w1.weight",
                        "l.0.experts.1.w3.weight"}) {
    plans.push_back(planner_->SharedPlan(n, DType::kBF16, {32, 64})->get());
  }
  EXPECT_TRUE(planner_->ShapeChecked(static_cast<size_t>(w13), plans));
  EXPECT_TRUE(full("", {})->Check(false).ok());
  // An expert of other rows plans cleanly on its own; assembled, the stack is not the engine's.
  absl::Status odd = full("l.0.experts.1.w3.weight", {64, 64})->Check(false);
  EXPECT_THAT(odd.message(), HasSubstr("'l.0.experts.w13'"));
  EXPECT_TRUE(full("", {})->Check(false).ok());
}

TEST_F(PlannerLedgerTest, PartialRefitTakesWholePartialParamsOnly) {
  Ledger partial(*planner_);
  for (const char* n : {"l.0.experts.0.w1.weight", "l.0.experts.0.w3.weight", "l.0.experts.1.w1.weight",
                        "l.0.experts.1.w3.weight", "l.0.norm.weight"}) {
    ASSERT_TRUE(partial.Arrive(Desc(n)).ok());
  }
  EXPECT_TRUE(partial.Check(true).ok()) << partial.Check(true);
  Ledger not_partial(*planner_);
  ASSERT_TRUE(not_partial.Arrive(Desc("l.0.mlp.gate_proj.weight")).ok());
  ASSERT_TRUE(not_partial.Arrive(Desc("l.0.mlp.up_proj.weight")).ok());
  EXPECT_THAT(not_partial.Check(true).message(), HasSubstr("may not be refit alone"));
}

// view_dtype: the spec states the dtype the engine registers for the shuffled MXFP4 scales
// (F8_E4M3, as vLLM's and SGLang's TRT-LLM MoE hold them). That registration refits; one of any
// other dtype, the format's own U8 included, is refused naming the parameter, before any engine
// byte is written (Ledger::Check).
TEST(PlannerLedgerViewDtypeTest, OnlyTheDtypeTheSpecStatesIsAccepted) {
  auto s = spec::ParseModelSpec(R"(model: v
rules:
  - match: "e.{L}.w"
    format: mxfp4
    layout:
      - {op: shuffle_matrix_sf_a, epilogue_tile_m: 128, on: _scales}
      - {op: view_dtype, dtype: F8_E4M3, on: _scales}
)");
  ASSERT_TRUE(s.ok()) << s.status();
  const std::vector<storage::ParamInfo> inputs = {{"e.0.w", DType::kBF16, {128, 64}, 0}};
  auto laid = EngineParamInfos(*s, inputs);
  ASSERT_TRUE(laid.ok()) << laid.status();
  auto refit_with_scales_as = [&](DType dtype) {
    std::vector<storage::ParamInfo> params = *laid;
    for (storage::ParamInfo& p : params) {
      if (p.name == "e.0.w_scales") p.dtype = dtype;
    }
    auto planner = Planner::Create(*s, params);
    if (!planner.ok()) return planner.status();
    Ledger ledger(*planner);
    auto arrived = ledger.Arrive({"e.0.w", DType::kBF16, {128, 64}, 0, 128 * 64 * 2});
    if (!arrived.ok()) return arrived.status();
    return ledger.Check(false);
  };
  const auto scales =
      std::find_if(laid->begin(), laid->end(), [](const storage::ParamInfo& p) { return p.name == "e.0.w_scales"; });
  ASSERT_NE(scales, laid->end());
  EXPECT_EQ(scales->dtype, DType::kF8E4M3);
  EXPECT_TRUE(refit_with_scales_as(DType::kF8E4M3).ok()) << refit_with_scales_as(DType::kF8E4M3);
  const std::string shape = ShapeString(scales->shape);
  for (DType wrong : {DType::kU8, DType::kF8E5M2, DType::kF8E8M0, DType::kI8}) {
    EXPECT_THAT(refit_with_scales_as(wrong).message(),
                HasSubstr(absl::StrCat("mismatch: engine parameter 'e.0.w_scales' would be F8_E4M3", shape,
                                       ", registered as ", DTypeName(wrong), shape)))
        << DTypeName(wrong);
  }
}

// The spec's groups are checked once for the same arrived tensors (Planner::GroupsChecked): the
// same tensors again skip the check, and a set with a member missing is never hidden by it.
TEST(PlannerLedgerGroupsTest, TheGroupCheckIsRememberedForTheSameTensorsOnly) {
  auto s = spec::ParseModelSpec(R"(model: g
rules:
  - match: "l.{L}.{n:a,b}.weight"
    partial: true
groups:
  - name: ab
    members: ["l.{L}.a.weight", "l.{L}.b.weight"]
)");
  ASSERT_TRUE(s.ok()) << s.status();
  const std::vector<std::string> names = {"l.0.a.weight", "l.0.b.weight", "l.1.a.weight", "l.1.b.weight"};
  std::vector<storage::ParamInfo> params;
  for (const std::string& n : names) params.push_back({n, DType::kBF16, {8}, 16});
  auto planner = Planner::Create(*s, params);
  ASSERT_TRUE(planner.ok()) << planner.status();
  auto check = [&](size_t count) {
    Ledger ledger(*planner);
    for (size_t i = 0; i < count; ++i) EXPECT_TRUE(ledger.Arrive({names[i], DType::kBF16, {8}, 0, 16}).ok());
    return ledger.Check(true);
  };
  std::vector<const TensorPlan*> all;
  for (const std::string& n : names) all.push_back(planner->SharedPlan(n, DType::kBF16, {8})->get());
  EXPECT_FALSE(planner->GroupsChecked(all));
  EXPECT_TRUE(check(4).ok());
  EXPECT_TRUE(planner->GroupsChecked(all));
  EXPECT_TRUE(check(4).ok());
  for (int round = 0; round < 2; ++round) {
    EXPECT_THAT(check(3).message(), HasSubstr("incomplete group 'ab': 'l.1.a.weight' arrived without 'l.1.b.weight'"));
  }
  EXPECT_TRUE(planner->GroupsChecked(all));  // an incomplete set is not noted
  EXPECT_TRUE(check(2).ok());  // layer 0 whole: checked, and noted in place of the four
  EXPECT_FALSE(planner->GroupsChecked(all));
  EXPECT_THAT(check(3).message(), HasSubstr("incomplete group 'ab'"));
  EXPECT_TRUE(check(4).ok());
}

}  // namespace
}  // namespace refit
