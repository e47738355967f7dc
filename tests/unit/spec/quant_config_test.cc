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

}  // namespace
}  // namespace refit::spec
