// PlanPlacement (staging: direct): which staged keys go straight into the engine's memory, and
// where. Real shared-memory engine storage; the planner over the committer test's kind of spec:
// a fused pair without layout steps (placed piece by piece at the committer's offsets), scales
// with a layout step (staged), a derived parameter (staged) and its partial source (placed).
#include "refit/placement.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "fused_mxfp8_spec.h"
#include "spec/model_spec.h"
#include "storage/shm_region.h"
#include "storage/shm_storage.h"

namespace refit {
namespace {

using testing::kFusedMxfp8Spec;

class PlacementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = *spec::ParseModelSpec(kFusedMxfp8Spec);
    // The engine layout: gate [64, 64] + up [32, 64] fused (MXFP8: E4M3 data, swizzled scales).
    params_ = {{"l.gate_up_proj.weight", DType::kF8E4M3, {96, 64}, 96 * 64},
               {"l.gate_up_proj.weight_scale_inv", DType::kU8, {128, 4}, 128 * 4},
               {"l.norm.weight", DType::kBF16, {64}, 128},
               {"l.norm.gemma_weight", DType::kBF16, {64}, 128}};
    std::vector<storage::ShmParam> shm;
    uint64_t off = 0;
    for (const storage::ParamInfo& p : params_) {
      shm.push_back({p, name_, off});
      off += (p.nbytes + 63) / 64 * 64;
    }
    region_ = *storage::ShmRegion::Create(name_, off);
    storage_ = *storage::ShmEngineStorage::Open(shm);
    planner_ = std::make_unique<Planner>(*Planner::Create(spec_, storage_->params()));
  }
  std::vector<std::shared_ptr<const TensorPlan>> Plans(const std::vector<std::pair<std::string, Shape>>& tensors) {
    std::vector<std::shared_ptr<const TensorPlan>> plans;
    for (const auto& [name, shape] : tensors) {
      absl::StatusOr<std::shared_ptr<const TensorPlan>> plan = planner_->SharedPlan(name, DType::kBF16, shape);
      EXPECT_TRUE(plan.ok()) << plan.status();
      if (plan.ok()) plans.push_back(*plan);
    }
    return plans;
  }
  uint8_t* Address(const std::string& param) { return storage_->MappedAddress(planner_->IndexOf(param)); }

  std::string name_ = absl::StrCat("/refit-placement-test-", getpid());
  spec::ModelSpec spec_;
  std::vector<storage::ParamInfo> params_;
  std::unique_ptr<storage::ShmRegion> region_;
  std::unique_ptr<storage::ShmEngineStorage> storage_;
  std::unique_ptr<Planner> planner_;
};

TEST_F(PlacementTest, FusedPiecesAtTheirOffsetsLaidOutAndDerivedStaged) {
  std::shared_ptr<const Placement> p = PlanPlacement(
      *planner_, *storage_, Plans({{"l.gate_proj.weight", {64, 64}}, {"l.up_proj.weight", {32, 64}}, {"l.norm.weight", {64}}}));
  ASSERT_EQ(p->size(), 3u);
  const Placement::Place* gate = p->Find("l.gate_proj.weight");
  const Placement::Place* up = p->Find("l.up_proj.weight");
  ASSERT_NE(gate, nullptr);
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(p->Address(*gate), Address("l.gate_up_proj.weight"));
  EXPECT_EQ(gate->bytes, 64u * 64u);
  EXPECT_EQ(p->Address(*up), Address("l.gate_up_proj.weight") + 64 * 64);  // after gate, as the committer writes it
  EXPECT_EQ(up->bytes, 32u * 64u);
  EXPECT_EQ(p->AddressOf("l.norm.weight"), Address("l.norm.weight"));
  // The scales have a layout step (swizzle): staged, built at commit.
  EXPECT_EQ(p->Find("l.gate_proj.weight_scale_inv"), nullptr);
  EXPECT_EQ(p->Find("l.up_proj.weight_scale_inv"), nullptr);
}

TEST_F(PlacementTest, AFusedParameterMissingAMemberIsNotPlaced) {
  // Without `up` in the manifest the offsets of gate's partner are unknown: nothing of the fused
  // parameter is placed; the norm still is.
  std::shared_ptr<const Placement> p =
      PlanPlacement(*planner_, *storage_, Plans({{"l.gate_proj.weight", {64, 64}}, {"l.norm.weight", {64}}}));
  EXPECT_EQ(p->Find("l.gate_proj.weight"), nullptr);
  EXPECT_NE(p->Find("l.norm.weight"), nullptr);
  EXPECT_TRUE(PlanPlacement(*planner_, *storage_, {})->empty());
}

// A wake: the same parameters mapped again (here: a second mapping of the same region, at other
// addresses). The same places, sharing the plan, at the new mapping's addresses; a storage with
// another parameter list is not rebased.
TEST_F(PlacementTest, RebasedPlacesAreTheSamePlacesAtTheNewMappings) {
  std::shared_ptr<const Placement> p = PlanPlacement(
      *planner_, *storage_, Plans({{"l.gate_proj.weight", {64, 64}}, {"l.up_proj.weight", {32, 64}}, {"l.norm.weight", {64}}}));
  std::vector<storage::ShmParam> shm;
  uint64_t off = 0;
  for (const storage::ParamInfo& param : params_) {
    shm.push_back({param, name_, off});
    off += (param.nbytes + 63) / 64 * 64;
  }
  std::unique_ptr<storage::ShmEngineStorage> again = *storage::ShmEngineStorage::Open(shm);
  const size_t fused = planner_->IndexOf("l.gate_up_proj.weight");
  ASSERT_NE(again->MappedAddress(fused), storage_->MappedAddress(fused));
  std::shared_ptr<const Placement> rebased = RebasePlacement(*p, *again);
  ASSERT_NE(rebased, nullptr);
  EXPECT_EQ(rebased->places, p->places);
  EXPECT_EQ(rebased->AddressOf("l.gate_proj.weight"), again->MappedAddress(fused));
  EXPECT_EQ(rebased->AddressOf("l.up_proj.weight"), again->MappedAddress(fused) + 64 * 64);
  EXPECT_EQ(rebased->AddressOf("l.norm.weight"), again->MappedAddress(planner_->IndexOf("l.norm.weight")));
  EXPECT_EQ(p->AddressOf("l.norm.weight"), Address("l.norm.weight")) << "the original unchanged";

  shm.pop_back();
  std::unique_ptr<storage::ShmEngineStorage> fewer = *storage::ShmEngineStorage::Open(shm);
  EXPECT_EQ(RebasePlacement(*p, *fewer), nullptr);
}

TEST_F(PlacementTest, StagingAllocatesPlacedKeysInTheEngineAndTheRestInThePool) {
  std::shared_ptr<const Placement> p = PlanPlacement(*planner_, *storage_, Plans({{"l.norm.weight", {64}}}));
  StagingPool pool(storage::NewHostMemory());
  Staging staging(1 << 20, pool);
  staging.Place(p);
  absl::StatusOr<uint8_t*> norm = staging.Allocate("l.norm.weight", DType::kBF16, {64}, 128);
  ASSERT_TRUE(norm.ok());
  EXPECT_EQ(*norm, Address("l.norm.weight"));
  EXPECT_TRUE(staging.Get("l.norm.weight")->in_place);
  // Another size than planned is staged, not placed.
  absl::StatusOr<uint8_t*> other = staging.Allocate("l.gate_proj.weight", DType::kF8E4M3, {64, 64}, 64 * 64);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(*other, Address("l.gate_up_proj.weight"));
  EXPECT_FALSE(staging.Get("l.gate_proj.weight")->in_place);
  EXPECT_EQ(staging.in_place_bytes(), 128u);
  EXPECT_EQ(staging.bytes(), 64u * 64u);  // only what the pool holds counts against the limit
}

// An output split by rows over engine ranks is staged as one run: its parts back to back in one
// pool buffer (the same buffer again next refit), counted against the limit, refused as a whole
// past it or when any part has a place in the engine (then staged one by one), and never twice.
TEST_F(PlacementTest, ARunStagesPartsBackToBackInOneBuffer) {
  StagingPool pool(storage::NewHostMemory());
  const std::string k0 = "rank0/w", k1 = "rank1/w", k2 = "rank2/w";
  const Shape shape = {4, 8};
  const Staging::RunPart parts[] = {
      {&k0, DType::kBF16, &shape, 64}, {&k1, DType::kBF16, &shape, 64}, {&k2, DType::kBF16, &shape, 64}};
  uint8_t* first = nullptr;
  for (int refit = 0; refit < 2; ++refit) {
    Staging staging(1 << 20, pool);
    absl::StatusOr<std::vector<uint8_t*>> run = staging.AllocateRun(parts);
    ASSERT_TRUE(run.ok()) << run.status();
    ASSERT_EQ(run->size(), 3u);
    EXPECT_EQ((*run)[1], (*run)[0] + 64);
    EXPECT_EQ((*run)[2], (*run)[0] + 128);
    if (refit == 0) first = (*run)[0];
    EXPECT_EQ((*run)[0], first) << "the pool keeps the run's buffer for the next refit";
    EXPECT_EQ(staging.Get(k1)->data, (*run)[1]);
    EXPECT_EQ(staging.Get(k1)->shape, shape);
    EXPECT_EQ(staging.bytes(), 192u);
    EXPECT_EQ(staging.AllocateRun(parts).status().code(), absl::StatusCode::kAlreadyExists);
    EXPECT_EQ(staging.Allocate(k2, DType::kBF16, shape, 64).status().code(), absl::StatusCode::kAlreadyExists);
  }
  Staging small(128, pool);
  EXPECT_EQ(small.AllocateRun(parts).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(small.Get(k0), nullptr) << "nothing of a refused run is staged";

  std::shared_ptr<const Placement> p = PlanPlacement(*planner_, *storage_, Plans({{"l.norm.weight", {64}}}));
  Staging placed(1 << 20, pool);
  placed.Place(p);
  const std::string norm = "l.norm.weight";
  const Shape norm_shape = {64};
  const Staging::RunPart with_placed[] = {{&k0, DType::kBF16, &shape, 64}, {&norm, DType::kBF16, &norm_shape, 128}};
  EXPECT_EQ(placed.AllocateRun(with_placed).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(placed.Get(k0), nullptr);
}

}  // namespace
}  // namespace refit
