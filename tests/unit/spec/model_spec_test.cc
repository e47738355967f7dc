#include "spec/model_spec.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace refit::spec {
namespace {

using ::testing::HasSubstr;

absl::Status Load(const std::string& yaml) { return ParseModelSpec(yaml, "spec.yaml").status(); }

// Each shipped spec and the model it names (tests/models/README.md); the demo spec names none.
const std::map<std::string, std::string> kSpecModels = {
    {"llama3_fp8.yaml", "Meta-Llama-3-8B"},        {"qwen3_moe_nvfp4.yaml", "Qwen3-30B-A3B"},
    {"deepseek_v3_fp8_ue8m0.yaml", "DeepSeek-V3"}, {"gpt_oss_mxfp4.yaml", "gpt-oss-20b"},
    {"qwen35_mxfp8.yaml", "Qwen3.5-27B"},          {"llama3_ct_fp8_dynamic.yaml", "Meta-Llama-3-8B"},
    {"llama3_fp8_ue8m0.yaml", "Meta-Llama-3-8B"},  {"deepseek_v3_fp8_absorbed.yaml", "DeepSeek-V3"},
    {"gpt_oss_mxfp4_trtllm.yaml", "gpt-oss-20b"},  {"demo-llama.yaml", ""}};

absl::StatusOr<ModelSpec> LoadShipped(const std::string& file) {
  const std::string path = std::string(REFIT_MODELS_DIR) + "/" + file;
  const std::string& model = kSpecModels.at(file);
  if (model.empty()) return LoadModelSpecFile(path);
  absl::StatusOr<ModelConfig> config =
      LoadModelConfigFile(std::string(REFIT_MODEL_CONFIGS_DIR) + "/" + model + "/config.json");
  if (!config.ok()) return config.status();
  return LoadModelSpecFile(path, {.model_config = &*config});
}

TEST(ModelSpecTest, EveryShippedSpecLoadsWithItsModelsConfig) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(REFIT_MODELS_DIR)) {
    if (e.path().extension() != ".yaml") continue;
    const std::string file = e.path().filename().string();
    ASSERT_TRUE(kSpecModels.count(file)) << file << ": name the model it fits in kSpecModels";
    absl::StatusOr<ModelSpec> spec = LoadShipped(file);
    EXPECT_TRUE(spec.ok()) << e.path() << ": " << spec.status();
    // No shipped spec fixes an engine rank, nor the engine's size: each engine rank registers its
    // own rank and the engine's size (tensor_parallel.size: engine where rules shard).
    if (spec.ok()) {
      EXPECT_FALSE(spec->tp_rank_given) << file;
      EXPECT_EQ(spec->tp_size, 1) << file << " states tensor_parallel.size";
      const bool shards =
          std::any_of(spec->rules.begin(), spec->rules.end(), [](const Rule& r) { return r.shard_dim.has_value(); });
      EXPECT_EQ(spec->tp_size_from_engine, shards) << file;
    }
    ++n;
  }
  EXPECT_EQ(n, 10);  // five model families (three with more engine layouts) and the demo model
}

// Shipped specs state no size: every expert count and Megatron-source size is the model's.
TEST(ModelSpecTest, ShippedSpecsTakeTheirSizesFromTheModel) {
  for (const auto& [file, model] : kSpecModels) {
    absl::StatusOr<ModelSpec> bare =
        LoadModelSpecFile(std::string(REFIT_MODELS_DIR) + "/" + file, {.allow_unresolved = true});
    ASSERT_TRUE(bare.ok()) << file << ": " << bare.status();
    for (const Rule& r : bare->rules) {
      if (r.stack) {
        EXPECT_EQ(r.stack->count, 0) << file << ": " << r.Describe() << " states its expert count";
      }
    }
    if (bare->source) {
      const MegatronSource& m = *bare->source;
      for (int64_t v : {m.num_attention_heads, m.num_query_groups, m.head_dim, m.q_lora_rank, m.num_experts,
                        m.vocab_size, m.linear_num_key_heads, m.linear_key_head_dim, m.linear_num_value_heads,
                        m.linear_value_head_dim}) {
        EXPECT_EQ(v, 0) << file << ": source states a size";
      }
    }
    // Without the model's config the daemon refuses a spec with stacks, naming every count it
    // lacks; the others load, their Megatron source sizes listed (refused when a push needs them).
    absl::StatusOr<ModelSpec> without = LoadModelSpecFile(std::string(REFIT_MODELS_DIR) + "/" + file);
    const bool stacks =
        std::any_of(bare->rules.begin(), bare->rules.end(), [](const Rule& r) { return r.stack.has_value(); });
    if (stacks) {
      EXPECT_THAT(without.status().message(), HasSubstr("stack.count (line")) << file;
      EXPECT_THAT(without.status().message(), HasSubstr("no model config was given")) << file;
    } else {
      EXPECT_TRUE(without.ok()) << file << ": " << without.status();
    }
    if (bare->source) {
      EXPECT_FALSE(bare->unresolved.empty()) << file;
    }
  }
}

TEST(ModelSpecTest, ShippedSpecsResolveTheRealModelsSizes) {
  absl::StatusOr<ModelSpec> qwen3 = LoadShipped("qwen3_moe_nvfp4.yaml");
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  for (const Rule& r : qwen3->rules) {
    if (r.stack) {
      EXPECT_EQ(r.stack->count, 128) << r.Describe();
    }
  }
  EXPECT_EQ(qwen3->source->num_attention_heads, 32);
  EXPECT_EQ(qwen3->source->num_query_groups, 4);
  EXPECT_EQ(qwen3->source->head_dim, 128);
  EXPECT_EQ(qwen3->source->vocab_size, 151936);
  absl::StatusOr<ModelSpec> llama = LoadShipped("llama3_fp8.yaml");
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(llama->source->num_query_groups, 8);
  EXPECT_EQ(llama->source->head_dim, 128);  // hidden_size / num_attention_heads
  EXPECT_EQ(llama->source->vocab_size, 128256);
  absl::StatusOr<ModelSpec> deepseek = LoadShipped("deepseek_v3_fp8_ue8m0.yaml");
  ASSERT_TRUE(deepseek.ok()) << deepseek.status();
  for (const Rule& r : deepseek->rules) {
    if (r.stack) {
      EXPECT_EQ(r.stack->count, 256) << r.Describe();
    }
  }
  EXPECT_EQ(deepseek->source->q_lora_rank, 1536);
  EXPECT_EQ(deepseek->source->vocab_size, 129280);
  absl::StatusOr<ModelSpec> oss = LoadShipped("gpt_oss_mxfp4.yaml");
  ASSERT_TRUE(oss.ok()) << oss.status();
  EXPECT_EQ(oss->source->num_experts, 32);
  EXPECT_EQ(oss->source->num_attention_heads, 64);
  EXPECT_EQ(oss->source->num_query_groups, 8);
  EXPECT_EQ(oss->source->vocab_size, 201088);
  absl::StatusOr<ModelSpec> qwen35 = LoadShipped("qwen35_mxfp8.yaml");  // sizes under text_config
  ASSERT_TRUE(qwen35.ok()) << qwen35.status();
  EXPECT_EQ(qwen35->source->num_attention_heads, 24);
  EXPECT_EQ(qwen35->source->head_dim, 256);
  EXPECT_EQ(qwen35->source->linear_num_value_heads, 48);
  EXPECT_EQ(qwen35->source->vocab_size, 248320);
  absl::StatusOr<ModelSpec> absorbed = LoadShipped("deepseek_v3_fp8_absorbed.yaml");  // w_kc / w_vc
  ASSERT_TRUE(absorbed.ok()) << absorbed.status();
  ASSERT_EQ(absorbed->derived.size(), 2u);
  for (const Derived& d : absorbed->derived) {
    EXPECT_EQ(d.qk_nope_head_dim, 128);
    EXPECT_EQ(d.v_head_dim, 128);
  }
}

ModelConfig Config(const std::string& json) { return *ModelConfig::Parse(json, "c.json"); }

constexpr char kStacked[] = R"(model: m
rules:
  - match: "l.{L}.experts.{E}.w"
    target: "l.{L}.experts.w"
    stack: {capture: E}
)";

TEST(ModelSpecSizesTest, AnOmittedExpertCountIsTheModelConfigs) {
  const ModelConfig c = Config(R"({"n_routed_experts": 256})");
  absl::StatusOr<ModelSpec> spec = ParseModelSpec(kStacked, "s.yaml", "", {.model_config = &c});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->rules[0].stack->count, 256);
  EXPECT_EQ(spec->model_config, "c.json");
  // Without a model config: refused naming the size, its line and how to give the config.
  absl::Status refused = ParseModelSpec(kStacked, "s.yaml").status();
  EXPECT_THAT(refused.message(), HasSubstr("s.yaml: rules[0].stack.count (line 5) comes from the model, and no model "
                                           "config was given"));
  EXPECT_THAT(refused.message(), HasSubstr("--model-config"));
  // Checking the spec's text alone: loads, the size listed and 0.
  absl::StatusOr<ModelSpec> text = ParseModelSpec(kStacked, "s.yaml", "", {.allow_unresolved = true});
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->rules[0].stack->count, 0);
  EXPECT_EQ(text->unresolved, (std::vector<std::string>{"rules[0].stack.count (line 5)"}));
  // A config of a dense model has no expert count.
  const ModelConfig dense = Config(R"({"hidden_size": 4096})");
  EXPECT_THAT(ParseModelSpec(kStacked, "s.yaml", "", {.model_config = &dense}).status().message(),
              HasSubstr("s.yaml:5: rules[0].stack.count: not given, and the model config 'c.json' has no num_experts, "
                        "n_routed_experts or num_local_experts"));
}

TEST(ModelSpecSizesTest, AStatedSizeMustAgreeWithTheModelConfig) {
  constexpr char kFour[] = R"(model: m
rules:
  - match: "l.{L}.experts.{E}.w"
    target: "l.{L}.experts.w"
    stack: {capture: E, count: 4}
)";
  // The refusal a test-sized spec meets at a real model: at load, naming both numbers.
  const ModelConfig real = Config(R"({"num_experts": 128})");
  EXPECT_THAT(ParseModelSpec(kFour, "s.yaml", "", {.model_config = &real}).status().message(),
              HasSubstr("s.yaml:5: rules[0].stack.count: 4, but the model config 'c.json' gives num_experts 128"));
  const ModelConfig small = Config(R"({"num_experts": 4})");
  EXPECT_TRUE(ParseModelSpec(kFour, "s.yaml", "", {.model_config = &small}).ok());
  EXPECT_TRUE(ParseModelSpec(kFour, "s.yaml").ok());  // no config: the spec's own
  constexpr char kSource[] = "model: m\nsource: {layout: megatron, num_attention_heads: 2, num_query_groups: 1, "
                             "head_dim: 128}\n";
  const ModelConfig qwen3 = Config(R"({"num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128})");
  EXPECT_THAT(ParseModelSpec(kSource, "s.yaml", "", {.model_config = &qwen3}).status().message(),
              HasSubstr("source.num_attention_heads: 2, but the model config 'c.json' gives num_attention_heads 32"));
}

TEST(ModelSpecSizesTest, MegatronSourceSizesComeFromTheModelConfig) {
  const ModelConfig llama = Config(R"({"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
                                       "vocab_size": 128256})");
  absl::StatusOr<ModelSpec> spec =
      ParseModelSpec("model: m\nsource: {layout: megatron}\n", "s.yaml", "", {.model_config = &llama});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->source->num_attention_heads, 32);
  EXPECT_EQ(spec->source->num_query_groups, 8);
  EXPECT_EQ(spec->source->head_dim, 128);
  EXPECT_EQ(spec->source->vocab_size, 128256);
  EXPECT_EQ(spec->source->q_lora_rank, 0);  // read for MLA only
  // Heads the config cannot explain are refused as stated ones are.
  const ModelConfig odd = Config(R"({"num_attention_heads": 32, "num_key_value_heads": 5, "head_dim": 64})");
  EXPECT_THAT(ParseModelSpec("model: m\nsource: {layout: megatron}\n", "s.yaml", "", {.model_config = &odd})
                  .status()
                  .message(),
              HasSubstr("source.num_query_groups: must divide num_attention_heads 32"));
  // Without a config the spec loads (a trainer pushing checkpoint names needs no heads); the sizes
  // linear_qkv needs are listed, and a push of it is refused naming them (megatron_source_test).
  absl::StatusOr<ModelSpec> bare = ParseModelSpec("model: m\nsource: {layout: megatron}\n", "s.yaml");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(bare->source->num_attention_heads, 0);
  EXPECT_EQ(bare->unresolved, (std::vector<std::string>{"source.num_attention_heads (line 2)",
                                                        "source.num_query_groups (line 2)", "source.head_dim (line 2)"}));
  // MLA: no linear_qkv; q_lora_rank (null in DeepSeek-V2-Lite's config: not given) from the config.
  const ModelConfig v3 = Config(R"({"q_lora_rank": 1536, "n_routed_experts": 256, "vocab_size": 129280})");
  spec = ParseModelSpec("model: m\nsource: {layout: megatron, attention: mla}\n", "s.yaml", "", {.model_config = &v3});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->source->q_lora_rank, 1536);
  const ModelConfig lite = Config(R"({"q_lora_rank": null, "vocab_size": 102400})");
  spec = ParseModelSpec("model: m\nsource: {layout: megatron, attention: mla}\n", "s.yaml", "", {.model_config = &lite});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->source->q_lora_rank, 0);
  // gpt-oss: the stacked experts' count is num_local_experts.
  const ModelConfig oss = Config(R"({"num_local_experts": 32, "num_attention_heads": 64, "num_key_value_heads": 8,
                                     "head_dim": 64})");
  spec = ParseModelSpec("model: m\nsource: {layout: megatron, experts: gpt_oss}\n", "s.yaml", "", {.model_config = &oss});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->source->num_experts, 32);
}

TEST(ModelSpecSizesTest, ExpertParallelSplitIsCheckedOnTheModelsCount) {
  constexpr char kEp[] = R"(model: m
tensor_parallel: {size: 4}
expert_parallel: {size: 4}
rules:
  - match: "l.{L}.experts.{E}.w"
    target: "l.{L}.experts.w"
    stack: {capture: E}
)";
  const ModelConfig six = Config(R"({"num_experts": 6})");
  EXPECT_THAT(ParseModelSpec(kEp, "s.yaml", "", {.model_config = &six}).status().message(),
              HasSubstr("6 experts do not split into expert_parallel.size 4"));
  const ModelConfig eight = Config(R"({"num_experts": 8})");
  EXPECT_TRUE(ParseModelSpec(kEp, "s.yaml", "", {.model_config = &eight}).ok());
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

TEST(ModelSpecTest, MergeDimsAndCastF32AreRead) {
  absl::StatusOr<ModelSpec> spec = ParseModelSpec(R"(model: m
rules:
  - match: "a.weight"
    format: mxfp4
    layout:
      - {op: merge_dims, dim: -2, on: _blocks}
  - match: "b.weight"
    format: ct_fp8_channel
    layout: [{op: cast_f32, on: _scale}]
)",
                                                  "spec.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->rules[0].layout.size(), 1u);
  EXPECT_EQ(spec->rules[0].layout[0].op, LayoutOp::kMergeDims);
  EXPECT_EQ(spec->rules[0].layout[0].dim, -2);
  EXPECT_EQ(spec->rules[1].layout[0].op, LayoutOp::kCastF32);
  EXPECT_TRUE(spec->rules[1].layout[0].AppliesTo("_scale"));
  EXPECT_THAT(Load("model: m\nrules:\n  - match: \"a.weight\"\n    format: mxfp4\n    layout:\n"
                   "      - {op: merge_dims, on: _blocks}\n")
                  .message(),
              HasSubstr("merge_dims needs 'dim'"));
  EXPECT_THAT(Load("model: m\nrules:\n  - match: \"a.weight\"\n    layout:\n      - {op: cast_f32, dim: 0, on: data}\n")
                  .message(),
              HasSubstr("cast_f32 takes no 'dim'"));
}

// view_dtype states the dtype the engine registers for bytes refitd builds under another name of
// the same width; `dtype` is required, a known dtype, and taken by view_dtype alone.
TEST(ModelSpecTest, ViewDtypeIsReadWithItsDtype) {
  absl::StatusOr<ModelSpec> spec = ParseModelSpec(R"(model: m
rules:
  - match: "a.weight"
    format: mxfp4
    layout:
      - {op: view_dtype, dtype: F8_E4M3, on: _scales}
)",
                                                  "spec.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->rules[0].layout.size(), 1u);
  EXPECT_EQ(spec->rules[0].layout[0].op, LayoutOp::kViewDtype);
  EXPECT_EQ(spec->rules[0].layout[0].dtype, DType::kF8E4M3);
  EXPECT_TRUE(spec->rules[0].layout[0].AppliesTo("_scales"));
  const std::string head = "model: m\nrules:\n  - match: \"a.weight\"\n    format: mxfp4\n    layout:\n      - ";
  EXPECT_THAT(Load(head + "{op: view_dtype, on: _scales}\n").message(),
              HasSubstr("spec.yaml:6: rules[0].layout[0]: view_dtype needs 'dtype'"));
  EXPECT_THAT(Load(head + "{op: view_dtype, dtype: F8_E4M4, on: _scales}\n").message(),
              HasSubstr("rules[0].layout[0].dtype: unknown dtype 'F8_E4M4'"));
  EXPECT_THAT(Load(head + "{op: merge_dims, dim: -2, dtype: U8, on: _blocks}\n").message(),
              HasSubstr("only view_dtype takes 'dtype'"));
}

// The TRT-LLM MXFP4 MoE's shuffled scales are registered as F8_E4M3 views (vLLM, SGLang): the
// shipped spec says so after the shuffle, on the scales alone.
TEST(ModelSpecTest, ShippedTrtllmMxfp4SpecViewsItsShuffledScalesAsF8E4M3) {
  absl::StatusOr<ModelSpec> spec = LoadShipped("gpt_oss_mxfp4_trtllm.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  int views = 0;
  for (const Rule& r : spec->rules) {
    for (size_t i = 0; i < r.layout.size(); ++i) {
      if (r.layout[i].op != LayoutOp::kViewDtype) continue;
      ++views;
      EXPECT_EQ(r.layout[i].dtype, DType::kF8E4M3) << r.Describe();
      EXPECT_EQ(r.layout[i].on, std::vector<std::string>{"_scales"}) << r.Describe();
      ASSERT_GT(i, 0u);
      EXPECT_EQ(r.layout[i - 1].op, LayoutOp::kShuffleMatrixSfA) << r.Describe();
    }
  }
  EXPECT_EQ(views, 2);  // gate_up_proj and down_proj
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

constexpr char kEngineSized[] = R"(model: m
tensor_parallel: {size: engine}
rules:
  - match: "col"
    shard: {dim: 0}
  - match: "row"
    shard: {dim: 1}
  - match: "norm"
)";

TEST(ModelSpecTest, TensorParallelSizeEngineIsTheEnginesSizeGivenLater) {
  absl::StatusOr<ModelSpec> s = ParseModelSpec(kEngineSized, "spec.yaml");
  ASSERT_TRUE(s.ok()) << s.status();
  // Loaded, it reads as a single engine's: nothing sharded until the engine gives its size.
  EXPECT_TRUE(s->tp_size_from_engine);
  EXPECT_EQ(s->tp_size, 1);
  EXPECT_FALSE(s->tp_rank_given);
  for (const Rule& r : s->rules) EXPECT_FALSE(r.shard.has_value()) << r.Describe();
  EXPECT_EQ(s->rules[0].shard_dim, 0);
  EXPECT_EQ(s->rules[1].shard_dim, 1);
  EXPECT_FALSE(s->rules[2].shard_dim.has_value());
  EXPECT_THAT(ForRank(*s, 0).status().message(), HasSubstr("is the engine's"));

  absl::StatusOr<ModelSpec> four = WithEngineSize(*s, 4);
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_FALSE(four->tp_size_from_engine);
  EXPECT_EQ(four->tp_size, 4);
  ASSERT_TRUE(four->rules[0].shard && four->rules[1].shard);
  EXPECT_EQ(four->rules[0].shard->size, 4);
  EXPECT_EQ(four->rules[1].shard->dim, 1);
  EXPECT_FALSE(four->rules[2].shard.has_value());
  absl::StatusOr<ModelSpec> rank3 = ForRank(*four, 3);
  ASSERT_TRUE(rank3.ok()) << rank3.status();
  EXPECT_EQ(rank3->rules[0].shard->rank, 3);
  EXPECT_FALSE(ForRank(*four, 4).ok());
  absl::StatusOr<ModelSpec> one = WithEngineSize(*s, 1);  // a single engine: nothing sharded
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->tp_size, 1);
  EXPECT_FALSE(one->rules[0].shard.has_value());
  EXPECT_THAT(WithEngineSize(*s, 65).status().message(), HasSubstr("tp_size: 65 is outside 1..64"));

  // A spec that states its size keeps it: another size is refused naming tp_size.
  absl::StatusOr<ModelSpec> two = ParseModelSpec("model: m\ntensor_parallel: {size: 2}\n");
  ASSERT_TRUE(two.ok());
  EXPECT_TRUE(WithEngineSize(*two, 2).ok());
  EXPECT_THAT(WithEngineSize(*two, 4).status().message(),
              HasSubstr("tp_size: the engine has tensor-parallel size 4, the spec's tensor_parallel.size is 2"));
}

TEST(ModelSpecTest, ExpertParallelSizeEngineFollowsTheTensorParallelSize) {
  constexpr char kExperts[] = R"(model: m
tensor_parallel: {size: engine}
expert_parallel: {size: engine}
rules:
  - match: "e.{i}.w"
    target: "experts.w"
    stack: {capture: i, count: 4}
)";
  absl::StatusOr<ModelSpec> s = ParseModelSpec(kExperts, "spec.yaml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->ep_size_from_engine);
  EXPECT_EQ(s->ep_size, 1);
  absl::StatusOr<ModelSpec> two = WithEngineSize(*s, 2);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->ep_size, 2);
  EXPECT_THAT(WithEngineSize(*s, 3).status().message(),
              HasSubstr("ep_size: 4 experts of rule 'e.{i}.w' (line 5) in spec.yaml do not split into the "
                        "engine's expert-parallel size 3"));
  EXPECT_THAT(Load("model: m\nexpert_parallel: {size: engine}\n").message(),
              HasSubstr("'engine' needs tensor_parallel.size: engine"));
  EXPECT_THAT(Load("model: m\ntensor_parallel: {size: engine}\nexpert_parallel: {size: 2}\n").message(),
              HasSubstr("write expert_parallel.size: engine"));
  EXPECT_THAT(Load(R"(model: m
tensor_parallel: {size: engine}
expert_parallel: {size: engine}
rules:
  - match: "e.{i}.w"
    target: "experts.w"
    stack: {capture: i, count: 4}
    shard: {dim: 0}
)")
                  .message(),
              HasSubstr("split by expert under expert_parallel"));
}

TEST(ModelSpecTest, TensorParallelAndDerivedAreValidated) {
  EXPECT_THAT(Load("model: m\ntensor_parallel: {size: engine, rank: 0}\n").message(),
              HasSubstr("tensor_parallel.rank: needs a stated size"));
  EXPECT_THAT(Load("model: m\ntensor_parallel: {size: many}\n").message(), HasSubstr("tensor_parallel.size"));
  EXPECT_THAT(Load("model: m\ntensor_parallel: {rank: 0}\n").message(), HasSubstr("or 'engine'"));
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
