#include "spec/model_spec.h"

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace refit::spec {
namespace {

using ::testing::HasSubstr;

absl::Status Load(const std::string& yaml) { return ParseModelSpec(yaml, "spec.yaml").status(); }

TEST(ModelSpecTest, EveryExampleSpecLoads) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(REFIT_MODELS_DIR)) {
    if (e.path().extension() != ".yaml") continue;
    auto spec = LoadModelSpecFile(e.path().string());
    EXPECT_TRUE(spec.ok()) << e.path() << ": " << spec.status();
    ++n;
  }
  EXPECT_EQ(n, 6);  // five model families and the demo model
}

TEST(ModelSpecTest, FusionStackShardAndLayoutAreRead) {
  auto spec = ParseModelSpec(R"(model: m
tensor_parallel: {size: 4, rank: 3}
rules:
  - match: "l.{L}.experts.{E}.{p:gate,up}_proj.weight"
    target: "l.{L}.experts.w13_weight"
    format: nvfp4
    fuse: {capture: p, order: [up, gate]}
    stack: {capture: E, count: 8}
    shard: {dim: 0}
    layout:
      - {op: swizzle_128x4, on: _scale}
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const Rule& r = spec->rules[0];
  EXPECT_EQ(r.fuse->order, (std::vector<std::string>{"up", "gate"}));
  EXPECT_EQ(r.stack->count, 8);
  EXPECT_EQ(r.shard->size, 4);
  EXPECT_EQ(r.shard->rank, 3);
  EXPECT_EQ(r.Slots(), 16);
  ASSERT_EQ(r.layout.size(), 1u);
  EXPECT_TRUE(r.layout[0].AppliesTo("_scale"));
  EXPECT_FALSE(r.layout[0].AppliesTo(""));
}

TEST(ModelSpecTest, UnknownKeysNameFileLineAndKey) {
  absl::Status s = Load("model: m\nrules:\n  - match: \"a.weight\"\n    fromat: fp8_block128\n");
  EXPECT_THAT(s.message(), HasSubstr("spec.yaml:4: rules[0]: unknown key 'fromat'"));
  s = Load("model: m\nrules:\n  - match: \"a.weight\"\n    layout:\n      - {op: spin, on: data}\n");
  EXPECT_THAT(s.message(), HasSubstr("spec.yaml:5: rules[0].layout[0].op: unknown op 'spin'"));
  s = Load("model: m\nbogus: 1\n");
  EXPECT_THAT(s.message(), HasSubstr("spec.yaml:2: spec: unknown key 'bogus'"));
}

TEST(ModelSpecTest, OverlappingRulesAreRejectedAtLoad) {
  absl::Status s = Load(R"(model: m
rules:
  - match: "model.layers.{L}.mlp.{p}_proj.weight"
  - match: "model.layers.*.mlp.down_proj.weight"
    format: fp8_block128
)");
  EXPECT_THAT(s.message(), HasSubstr("spec.yaml:4: rules[1].match"));
  EXPECT_THAT(s.message(), HasSubstr("overlaps rule 'model.layers.{L}.mlp.{p}_proj.weight' (line 3)"));
}

TEST(ModelSpecTest, FusionMistakesAreRejected) {
  EXPECT_THAT(Load(R"(model: m
rules:
  - match: "a.{L}.{p:gate,up}_proj.weight"
    fuse: {capture: p, order: [gate, up]}
)").message(), HasSubstr("need a 'target'"));
  EXPECT_THAT(Load(R"(model: m
rules:
  - match: "a.{L}.{p:gate,up}_proj.weight"
    target: "a.gate_up_proj.weight"
    fuse: {capture: p, order: [gate, up]}
)").message(), HasSubstr("{L} of the match pattern is missing"));
  EXPECT_THAT(Load(R"(model: m
rules:
  - match: "a.{L}.{p:gate,up}_proj.weight"
    target: "a.{L}.gate_up_proj.weight"
    fuse: {capture: q, order: [gate, up]}
)").message(), HasSubstr("{q} is not a capture"));
  EXPECT_THAT(Load(R"(model: m
rules:
  - match: "a.{L}.{p:gate,up}_proj.weight"
    target: "a.{L}.gate_up_proj.weight"
    fuse: {capture: p, order: [gate, gate]}
)").message(), HasSubstr("'gate' listed twice"));
}

TEST(ModelSpecTest, LayoutStepsMustNameTensorsTheFormatEmits) {
  EXPECT_THAT(Load(R"(model: m
rules:
  - match: "a.weight"
    format: nvfp4
    layout:
      - {op: swizzle_128x4, on: _scale_inv}
)").message(), HasSubstr("emits no such tensor"));
  EXPECT_THAT(Load(R"(model: m
rules:
  - match: "a.weight"
    format: fp8_block128
    layout:
      - {op: pack_ue8m0, on: _scale_inv}
)").message(), HasSubstr("needs power-of-two scales"));
}

TEST(ModelSpecTest, ExplicitFormatMustAgreeWithTheCheckpoint) {
  absl::Status s = Load(R"(model: m
checkpoint:
  quantization_config: {quant_method: fp8, weight_block_size: [128, 128]}
rules:
  - match: "a.weight"
    format: nvfp4
)");
  EXPECT_THAT(s.message(), HasSubstr("spec.yaml:6: rules[0].format: quantizes to nvfp4 but the checkpoint"));
  s = Load(R"(model: m
checkpoint:
  quantization:
    quant_algo: MIXED_PRECISION
    quantized_layers: {"x.proj": {quant_algo: NVFP4}}
rules:
  - match: "x.proj.weight"
    format: mxfp8
)");
  EXPECT_THAT(s.message(), HasSubstr("lists it as nvfp4"));
  EXPECT_THAT(Load("model: m\nrules:\n  - match: \"a\"\n    format: checkpoint\n").message(),
              HasSubstr("needs the top-level 'checkpoint' section"));
}

TEST(ModelSpecTest, QuantConfigFileIsResolvedNextToTheSpec) {
  auto dir = std::filesystem::temp_directory_path() / "refit_spec_test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "hf_quant_config.json") << R"({"quantization": {"quant_algo": "NVFP4", "group_size": 16}})";
  std::ofstream(dir / "m.yaml") << "model: m\ncheckpoint: {quant_config: hf_quant_config.json}\n";
  auto spec = LoadModelSpecFile((dir / "m.yaml").string());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->checkpoint->format, formats::Format::kNvfp4);
  std::ofstream(dir / "bad.yaml") << "model: m\ncheckpoint: {quant_config: missing.json}\n";
  EXPECT_THAT(LoadModelSpecFile((dir / "bad.yaml").string()).status().message(),
              HasSubstr("bad.yaml:2: checkpoint.quant_config: cannot read"));
}

TEST(ModelSpecTest, TensorParallelAndDerivedAreValidated) {
  EXPECT_THAT(Load("model: m\ntensor_parallel: {size: 2, rank: 2}\n").message(), HasSubstr("must be below size 2"));
  EXPECT_THAT(Load("model: m\nrules:\n  - match: \"a\"\n    shard: {dim: 0}\n").message(),
              HasSubstr("needs the top-level 'tensor_parallel'"));
  EXPECT_THAT(Load("model: m\nderived:\n  - {target: \"{L}.g\", from: \"{M}.w\", op: add_one}\n").message(),
              HasSubstr("same captures"));
}

}  // namespace
}  // namespace refit::spec

namespace refit::spec {
namespace {

TEST(ModelSpecInputsTest, QuantConfigDevZeroIsRefusedNamingTheFile) {
  absl::Status s = ParseModelSpec("model: m\ncheckpoint:\n  quant_config: /dev/zero\n", "z.yaml").status();
  EXPECT_THAT(s.message(), ::testing::HasSubstr("z.yaml:3: checkpoint.quant_config: checkpoint quantization config "
                                                "'/dev/zero' is not a regular file (a character device)"));
}

TEST(ModelSpecInputsTest, OversizedSpecFileIsRefused) {
  const std::string path = (std::filesystem::temp_directory_path() / "refit_big_spec.yaml").string();
  {
    std::ofstream out(path);
    out << "model: m\n" << std::string(kMaxModelSpecFileBytes, '#');
  }
  EXPECT_THAT(LoadModelSpecFile(path).status().message(), ::testing::HasSubstr("over the limit of 4 MiB"));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace refit::spec
