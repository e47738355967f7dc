#include "refit/offline.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "refit/checkpoint_io.h"
#include "spec/model_spec.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace refit {
namespace {

constexpr char kSpec[] = R"(model: m
rules:
  - match: "e.{E}.{p:w1,w3}.weight"
    target: "w13"
    format: nvfp4
    fuse: {capture: p, order: [w1, w3]}
    stack: {capture: E, count: 1}
)";

std::vector<uint16_t> Values(float scale, int n) {
  std::vector<uint16_t> v;
  for (int i = 0; i < n; ++i) {
    float f = scale * std::sin(static_cast<float>(i));
    uint32_t b;
    std::memcpy(&b, &f, 4);
    v.push_back(static_cast<uint16_t>(b >> 16));  // truncation: any bf16 will do
  }
  return v;
}

float MaxAbs(const std::vector<uint16_t>& v) {
  float m = 0;
  for (uint16_t h : v) {
    uint32_t b = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &b, 4);
    m = std::max(m, std::fabs(f));
  }
  return m;
}

TEST(OfflineTest, FusedNvfp4MembersShareTheGroupAmax) {
  auto spec = *spec::ParseModelSpec(kSpec);
  std::vector<uint16_t> w1 = Values(0.5f, 32 * 64), w3 = Values(3.0f, 32 * 64);
  auto out = ConvertCheckpoint(spec, {{"e.0.w1.weight", DType::kBF16, {32, 64}, w1.data()},
                                      {"e.0.w3.weight", DType::kBF16, {32, 64}, w3.data()}});
  ASSERT_TRUE(out.ok()) << out.status();
  const float want = std::max(MaxAbs(w1), MaxAbs(w3)) / 2688.0f;  // ModelOpt: A / (6 * 448)
  int seen = 0;
  for (const ConvertedTensor& t : *out) {
    if (t.name.find("_scale_2") == std::string::npos) continue;
    float s2;
    std::memcpy(&s2, t.bytes.data(), 4);
    EXPECT_EQ(s2, want) << t.name;
    ++seen;
  }
  EXPECT_EQ(seen, 2);
  // Alone, w1 would get its own (smaller) global scale: the group matters.
  auto alone = ConvertTensor(spec, "e.0.w1.weight", DType::kBF16, {32, 64}, w1.data());
  ASSERT_TRUE(alone.ok());
  float s2;
  std::memcpy(&s2, (*alone)[2].bytes.data(), 4);
  EXPECT_LT(s2, want);
}

TEST(OfflineTest, EngineLayoutNamesAMissingSlot) {
  auto spec = *spec::ParseModelSpec(kSpec);
  std::vector<uint16_t> w1 = Values(0.5f, 32 * 64);
  auto conv = ConvertCheckpoint(spec, {{"e.0.w1.weight", DType::kBF16, {32, 64}, w1.data()}});
  ASSERT_TRUE(conv.ok());
  std::map<std::string, const ConvertedTensor*> by;
  for (const auto& t : *conv) by[t.name] = &t;
  auto layout = EngineLayout(spec, {{"e.0.w1.weight", DType::kBF16, {32, 64}, 0}}, by);
  ASSERT_FALSE(layout.ok());
  EXPECT_THAT(layout.status().message(), ::testing::HasSubstr("engine parameter 'w13': slot 1 of 2 has no tensor"));
}

// A row-parallel per-channel FP8 layer (compressed-tensors ct_fp8_channel split along K): each
// engine rank holds its columns of the whole tensor's FP8 data and every row's [N, 1] scale whole,
// both exactly the whole conversion's bytes (vLLM's RowParallelLinear loads weight_scale unsplit).
TEST(OfflineTest, RowParallelPerChannelFp8ReplicatesTheScale) {
  constexpr int64_t kN = 8, kK = 64;
  std::vector<uint16_t> w = Values(0.75f, kN * kK);
  const std::string rule = "rules:\n  - match: \"o.weight\"\n    format: ct_fp8_channel\n";
  auto whole_spec = spec::ParseModelSpec("model: m\n" + rule);
  ASSERT_TRUE(whole_spec.ok()) << whole_spec.status();
  auto whole = ConvertCheckpoint(*whole_spec, {{"o.weight", DType::kBF16, {kN, kK}, w.data()}});
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_EQ(whole->size(), 2u);
  const ConvertedTensor& data = (*whole)[0];
  const ConvertedTensor& scale = (*whole)[1];
  ASSERT_EQ(scale.name, "o.weight_scale");
  ASSERT_EQ(scale.shape, (Shape{kN, 1}));
  for (int rank = 0; rank < 2; ++rank) {
    auto s = spec::ParseModelSpec(
        absl::StrCat("model: m\ntensor_parallel: {size: 2, rank: ", rank, "}\n", rule, "    shard: {dim: 1}\n"));
    ASSERT_TRUE(s.ok()) << s.status();
    auto conv = ConvertCheckpoint(*s, {{"o.weight", DType::kBF16, {kN, kK}, w.data()}});
    ASSERT_TRUE(conv.ok()) << conv.status();
    auto layout = EngineLayout(*s, {{"o.weight", DType::kBF16, {kN, kK}, 0}}, ByName(*conv));
    ASSERT_TRUE(layout.ok()) << layout.status();
    ASSERT_EQ(layout->size(), 2u);
    std::vector<uint8_t> cols;
    for (int64_t n = 0; n < kN; ++n) {
      const uint8_t* row = data.bytes.data() + n * kK + rank * (kK / 2);
      cols.insert(cols.end(), row, row + kK / 2);
    }
    EXPECT_EQ((*layout)[0].name, "o.weight");
    EXPECT_EQ((*layout)[0].shape, (Shape{kN, kK / 2}));
    EXPECT_EQ((*layout)[0].bytes, cols) << "rank " << rank;
    EXPECT_EQ((*layout)[1].name, "o.weight_scale");
    EXPECT_EQ((*layout)[1].shape, (Shape{kN, 1}));
    EXPECT_EQ((*layout)[1].bytes, scale.bytes) << "rank " << rank;
    auto infos = EngineParamInfos(*s, {{"o.weight", DType::kBF16, {kN, kK}, 0}});
    ASSERT_TRUE(infos.ok()) << infos.status();
    ASSERT_EQ(infos->size(), 2u);
    EXPECT_EQ((*infos)[1].shape, (Shape{kN, 1}));
  }
}

// EngineParamInfos (what an engine registers for trainer tensors) names, types and sizes every
// parameter exactly as EngineLayout builds it, for every shipped spec: fused, stacked, sharded,
// laid out (swizzled and UE8M0-packed scales, padding), derived and kept parameters.
class EngineParamInfosFamilies : public ::testing::TestWithParam<std::pair<const char*, const char*>> {};

TEST_P(EngineParamInfosFamilies, EqualEngineLayoutsParameters) {
  const auto [family, spec_file] = GetParam();
  const char* env = std::getenv("REFIT_SOURCE_DIR");
  const std::string source = env != nullptr && *env != '\0' ? env : REFIT_SOURCE_DIR_DEFAULT;
  char tmpl[] = "/tmp/refit-offline-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string cmd = absl::StrCat("python3 '", source, "/tests/integration/specs/make_checkpoints.py' ", family,
                                       " '", dir, "' --seed 1 > /dev/null");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  // The family's small checkpoint comes with its config.json: the spec's sizes are read from it.
  absl::StatusOr<spec::ModelConfig> config = spec::LoadModelConfigFile(dir + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<spec::ModelSpec> spec =
      spec::LoadModelSpecFile(source + "/deploy/models/" + spec_file, {.model_config = &*config});
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir + "/model.safetensors");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto converted = ConvertCheckpoint(*spec, (*ckpt)->tensors());
  ASSERT_TRUE(converted.ok()) << converted.status();
  auto layout = EngineLayout(*spec, (*ckpt)->infos(), ByName(*converted));
  ASSERT_TRUE(layout.ok()) << layout.status();
  auto infos = EngineParamInfos(*spec, (*ckpt)->infos());
  ASSERT_TRUE(infos.ok()) << infos.status();
  (void)std::system(("rm -rf '" + dir + "'").c_str());
  ASSERT_EQ(infos->size(), layout->size());
  for (size_t i = 0; i < layout->size(); ++i) {
    const ConvertedTensor& want = (*layout)[i];
    const storage::ParamInfo& got = (*infos)[i];
    EXPECT_EQ(got.name, want.name);
    EXPECT_EQ(got.dtype, want.dtype) << want.name;
    EXPECT_EQ(got.shape, want.shape) << want.name;
    EXPECT_EQ(got.nbytes, want.bytes.size()) << want.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Shipped, EngineParamInfosFamilies,
                         ::testing::Values(std::make_pair("llama3", "llama3_fp8.yaml"),
                                           std::make_pair("qwen3_moe", "qwen3_moe_nvfp4.yaml"),
                                           std::make_pair("deepseek_v3", "deepseek_v3_fp8_ue8m0.yaml"),
                                           std::make_pair("gpt_oss", "gpt_oss_mxfp4.yaml"),
                                           std::make_pair("gpt_oss_trtllm", "gpt_oss_mxfp4_trtllm.yaml"),
                                           std::make_pair("llama3_ct", "llama3_ct_fp8_dynamic.yaml"),
                                           std::make_pair("qwen35", "qwen35_mxfp8.yaml")),
                         [](const auto& info) { return std::string(info.param.first); });

}  // namespace
}  // namespace refit
