#include "refit/wire_plan.h"

#include <memory>

#include "refit/offline.h"
#include "spec/model_spec.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace refit {
namespace {

// Two engine ranks, a column-parallel FP8 projection and a replicated one.
constexpr char kSpec[] = R"(model: m
tensor_parallel: {size: 2}
rules:
  - match: "l.{L}.up.weight"
    format: fp8_block128
    shard: {dim: 0}
  - match: "l.{L}.out.weight"
    format: fp8_block128
)";

const std::vector<storage::ParamInfo> kTrainer = {{"l.0.up.weight", DType::kBF16, {512, 256}, 512 * 256 * 2},
                                                  {"l.0.out.weight", DType::kBF16, {256, 256}, 256 * 256 * 2}};

Planner RankPlanner(const spec::ModelSpec& spec) {
  std::vector<RankParams> ranks;
  for (int r = 0; r < spec.tp_size; ++r) {
    auto rank_spec = std::make_shared<const spec::ModelSpec>(*spec::ForRank(spec, r));
    absl::StatusOr<std::vector<storage::ParamInfo>> params = EngineParamInfos(*rank_spec, kTrainer);
    EXPECT_TRUE(params.ok()) << params.status();
    ranks.push_back({rank_spec, "rank" + std::to_string(r), *params});
  }
  absl::StatusOr<Planner> planner = Planner::CreateRanks(spec, std::move(ranks));
  EXPECT_TRUE(planner.ok()) << planner.status();
  return std::move(*planner);
}

// Trainer-converted outputs (wire format checkpoint) reach every engine rank: each output's copy
// targets each rank's part, or once the part every rank shares.
TEST(WirePlanTest, OutputsOfATensorSeveralEngineRanksHoldAreCopiedToEachRanksPart) {
  const spec::ModelSpec spec = *spec::ParseModelSpec(kSpec);
  const Planner planner = RankPlanner(spec);
  Manifest manifest;
  manifest.wire_format = WireFormat::kCheckpoint;
  for (const storage::ParamInfo& t : kTrainer) manifest.tensors.push_back({t.name, t.dtype, t.shape, 0, t.nbytes});
  absl::StatusOr<std::shared_ptr<const WireTable>> table = WireTable::Create(planner, manifest);
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ((*table)->entries().size(), 2u);

  const WireEntry* up = (*table)->FindTensor("l.0.up.weight");
  ASSERT_NE(up, nullptr);
  ASSERT_EQ(up->outputs.size(), 2u);  // data and _scale_inv
  ASSERT_EQ(up->copies.size(), 2u);
  for (size_t j = 0; j < 2; ++j) {
    const TensorPlan& copy = *up->copies[j];
    ASSERT_EQ(copy.targets.size(), 2u) << j;
    EXPECT_EQ(copy.targets[0].key, "rank0/l.0.up.weight" + up->outputs[j].suffix);
    EXPECT_EQ(copy.targets[1].key, "rank1/l.0.up.weight" + up->outputs[j].suffix);
    EXPECT_EQ(copy.targets[0].shard_index, 0);
    EXPECT_EQ(copy.targets[1].shard_index, 1);
    for (const Target& t : copy.targets) {
      EXPECT_EQ(t.output, 0u);
      EXPECT_EQ(t.full_shape, up->outputs[j].shape);
    }
  }
  EXPECT_EQ(up->copies[0]->targets[0].spec.shape, (Shape{256, 256}));  // each rank's half of the rows

  const WireEntry* out = (*table)->FindTensor("l.0.out.weight");
  ASSERT_NE(out, nullptr);
  for (const auto& copy : out->copies) {
    ASSERT_EQ(copy->targets.size(), 2u);
    EXPECT_EQ(copy->targets[0].key, copy->targets[1].key);  // one staged part for both ranks
  }
  size_t index = 9;
  EXPECT_EQ((*table)->FindOutput("l.0.up.weight_scale_inv", &index), up);
  EXPECT_EQ(index, 1u);
}

}  // namespace
}  // namespace refit
