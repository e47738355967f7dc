#include "spec/quant_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace refit::spec {
namespace {

using ::testing::HasSubstr;
using formats::Format;

TEST(GlobMatchTest, StarCrossesDots) {
  EXPECT_TRUE(GlobMatch("model.layers.*.self_attn", "model.layers.12.self_attn"));
  EXPECT_TRUE(GlobMatch("model.layers.*.self_attn*", "model.layers.1.self_attn.q_proj"));
  EXPECT_TRUE(GlobMatch("*gate", "model.layers.1.mlp.gate"));
  EXPECT_FALSE(GlobMatch("model.layers.*.mlp.gate", "model.layers.1.mlp.gate_proj"));
  EXPECT_TRUE(GlobMatch("l?_head", "lm_head"));
}

TEST(QuantConfigTest, HfQuantConfigNvfp4WithGlobExcludes) {
  auto q = ParseQuantConfigText(R"({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4",
      "group_size": 16, "exclude_modules": ["lm_head", "model.layers.*.self_attn*", "model.layers.*.mlp.gate"]}})",
                                "hf_quant_config.json");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->FormatForTensor("model.layers.0.mlp.experts.3.up_proj.weight"), Format::kNvfp4);
  EXPECT_EQ(q->FormatForTensor("model.layers.0.self_attn.q_proj.weight"), std::nullopt);
  EXPECT_EQ(q->FormatForTensor("model.layers.7.mlp.gate.weight"), std::nullopt);
  EXPECT_EQ(q->FormatForTensor("lm_head.weight"), std::nullopt);
}

TEST(QuantConfigTest, MixedPrecisionListsQuantizedLayers) {
  auto q = ParseQuantConfigText(R"({"quantization": {"quant_algo": "MIXED_PRECISION", "quantized_layers": {
      "model.layers.0.mlp.down_proj": {"quant_algo": "NVFP4", "group_size": 16},
      "model.layers.1.mlp.down_proj": {"quant_algo": "MXFP8"}}, "exclude_modules": ["model.layers.1*"]}})",
                                "hf_quant_config.json");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->FormatForTensor("model.layers.0.mlp.down_proj.weight"), Format::kNvfp4);
  EXPECT_EQ(q->FormatForTensor("model.layers.0.mlp.up_proj.weight"), std::nullopt);   // not listed
  EXPECT_EQ(q->FormatForTensor("model.layers.1.mlp.down_proj.weight"), std::nullopt);  // excluded
}

TEST(QuantConfigTest, ConfigJsonForms) {
  auto fp8 = ParseQuantConfigText(R"({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
      "weight_block_size": [128, 128], "scale_fmt": "ue8m0"}})", "config.json");
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  EXPECT_EQ(fp8->format, Format::kFp8Block128Ue8m0);
  auto mo = ParseQuantConfigText(R"({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4",
      "group_size": 16, "ignore": ["lm_head"]}})", "config.json");
  ASSERT_TRUE(mo.ok()) << mo.status();
  EXPECT_EQ(mo->FormatForTensor("lm_head.weight"), std::nullopt);
  EXPECT_EQ(mo->FormatForTensor("x.weight"), Format::kNvfp4);
  auto mx = ParseQuantConfigText(R"({"quantization_config": {"quant_method": "mxfp4",
      "modules_to_not_convert": ["model.layers.*.self_attn"]}})", "config.json");
  ASSERT_TRUE(mx.ok());
  EXPECT_EQ(mx->FormatForTensor("model.layers.0.mlp.experts.gate_up_proj"), Format::kMxfp4);
  EXPECT_EQ(mx->FormatForTensor("model.layers.0.self_attn.q_proj.weight"), std::nullopt);
}

TEST(QuantConfigTest, IncompatibleLayoutsAreRejectedWithFileAndLine) {
  auto block = ParseQuantConfigText("{\"quantization_config\": {\"quant_method\": \"fp8\",\n"
                                    "  \"weight_block_size\": [64, 64]}}", "config.json");
  ASSERT_FALSE(block.ok());
  EXPECT_THAT(block.status().message(), HasSubstr("config.json:2: quantization_config.weight_block_size: [64, 64]"));
  auto algo = ParseQuantConfigText(R"({"quantization": {"quant_algo": "W4A8_AWQ"}})", "h.json");
  ASSERT_FALSE(algo.ok());
  EXPECT_THAT(algo.status().message(), HasSubstr("W4A8_AWQ"));
  auto group = ParseQuantConfigText(R"({"quantization": {"quant_algo": "NVFP4", "group_size": 32}})", "h.json");
  ASSERT_FALSE(group.ok());
  EXPECT_THAT(group.status().message(), HasSubstr("group_size"));
  auto neither = ParseQuantConfigText(R"({"architectures": ["X"]})", "config.json");
  ASSERT_FALSE(neither.ok());
  EXPECT_THAT(neither.status().message(), HasSubstr("neither"));
  auto ct = ParseQuantConfigText(R"({"quantization_config": {"quant_method": "compressed-tensors"}})", "c.json");
  EXPECT_FALSE(ct.ok());
}

// llm-compressor checkpoints: config groups' weights arguments name the format; "re:" ignore
// entries are regular expressions matched from the start of the module name.
TEST(QuantConfigTest, CompressedTensorsConfigGroups) {
  const char* w4a16 = R"({"quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized",
    "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": null,
      "weights": {"num_bits": 4, "type": "int", "symmetric": true, "group_size": 128, "strategy": "group",
                  "dynamic": false, "actorder": null, "observer": "minmax"}}},
    "ignore": ["lm_head", "re:.*mlp.gate$"], "quantization_status": "compressed"}})";
  absl::StatusOr<QuantConfig> q = ParseQuantConfigText(w4a16, "config.json");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->FormatForTensor("model.layers.0.self_attn.q_proj.weight_packed"), formats::Format::kCtW4a16);
  EXPECT_EQ(q->FormatForTensor("lm_head.weight"), std::nullopt);
  EXPECT_EQ(q->FormatForTensor("model.layers.3.mlp.gate.weight"), std::nullopt);
  EXPECT_EQ(q->FormatForTensor("model.layers.3.mlp.gate_proj.weight"), formats::Format::kCtW4a16);

  // NVFP4 with static input scales (W4A4): the weights are ct_nvfp4; per-group format wins.
  const char* nvfp4 = R"({"quantization_config": {"quant_method": "compressed-tensors", "format": "mixed-precision",
    "config_groups": {"g": {"targets": ["Linear"], "format": "nvfp4-pack-quantized",
      "weights": {"num_bits": 4, "type": "float", "symmetric": true, "group_size": 16, "strategy": "tensor_group",
                  "dynamic": false},
      "input_activations": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                            "dynamic": "local"}}}}})";
  q = ParseQuantConfigText(nvfp4, "config.json");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->format, formats::Format::kCtNvfp4);

  const char* asym = R"({"quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized",
    "config_groups": {"group_0": {"targets": ["Linear"],
      "weights": {"num_bits": 4, "type": "int", "symmetric": false, "group_size": 128, "strategy": "group"}}}}})";
  q = ParseQuantConfigText(asym, "config.json");
  ASSERT_FALSE(q.ok());
  EXPECT_THAT(q.status().message(), HasSubstr("quantization_config.config_groups.group_0.weights"));
  EXPECT_THAT(q.status().message(), HasSubstr("asymmetric weights has no refitd format (supported: ct_fp8_channel"));

  const char* two = R"({"quantization_config": {"quant_method": "compressed-tensors",
    "config_groups": {
      "a": {"targets": ["re:.*q_proj"], "format": "pack-quantized",
            "weights": {"num_bits": 4, "type": "int", "group_size": 128, "strategy": "group"}},
      "b": {"targets": ["Linear"], "format": "float-quantized",
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}})";
  q = ParseQuantConfigText(two, "config.json");
  ASSERT_FALSE(q.ok());
  EXPECT_THAT(q.status().message(), HasSubstr("must target modules by name"));
  auto g_idx = ParseQuantConfigText(R"({"quantization_config": {"quant_method": "compressed-tensors",
    "config_groups": {"a": {"targets": ["Linear"], "format": "pack-quantized",
      "weights": {"num_bits": 4, "type": "int", "group_size": 128, "strategy": "group", "actorder": "group"}}}}})",
                                    "c.json");
  ASSERT_FALSE(g_idx.ok());
  EXPECT_THAT(g_idx.status().message(), HasSubstr("weight_g_idx"));
  auto naive = ParseQuantConfigText(R"({"quantization_config": {"quant_method": "compressed-tensors",
    "format": "naive-quantized", "config_groups": {"a": {"targets": ["Linear"],
      "weights": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": true}}}}})",
                                    "c.json");
  ASSERT_TRUE(naive.ok()) << naive.status();
  EXPECT_EQ(naive->format, formats::Format::kCtFp8Tensor);
  auto bad_re = ParseQuantConfigText(R"({"quantization_config": {"quant_method": "compressed-tensors",
    "ignore": ["re:(("], "config_groups": {"a": {"targets": ["Linear"],
      "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}})",
                                     "c.json");
  ASSERT_FALSE(bad_re.ok());
  EXPECT_THAT(bad_re.status().message(), HasSubstr("'re:((' is not a regular expression"));
}

}  // namespace
}  // namespace refit::spec
