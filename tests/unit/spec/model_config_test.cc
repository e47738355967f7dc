#include "spec/model_config.h"

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace refit::spec {
namespace {

using ::testing::HasSubstr;

ModelConfig Parse(const std::string& json) {
  absl::StatusOr<ModelConfig> c = ModelConfig::Parse(json, "config.json");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ModelConfig();
}

TEST(ModelConfigTest, ExpertCountUnderEachFamilysKey) {
  EXPECT_EQ(Parse(R"({"num_experts": 128})").Experts()->value().value, 128);
  EXPECT_EQ(Parse(R"({"n_routed_experts": 256, "n_shared_experts": 1})").Experts()->value().from, "n_routed_experts");
  EXPECT_EQ(Parse(R"({"num_local_experts": 32})").Experts()->value().value, 32);
  EXPECT_FALSE(Parse(R"({"hidden_size": 4096})").Experts()->has_value());
}

TEST(ModelConfigTest, HeadDimAndQueryGroupsFollowHuggingFaceDefaults) {
  // Meta-Llama-3-8B gives no head_dim: hidden_size / num_attention_heads.
  ModelConfig llama = Parse(R"({"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8})");
  EXPECT_EQ(llama.HeadDim()->value().value, 128);
  EXPECT_EQ(llama.HeadDim()->value().from, "hidden_size / num_attention_heads");
  EXPECT_EQ(llama.QueryGroups()->value().value, 8);
  // Multi-head attention: no num_key_value_heads.
  EXPECT_EQ(Parse(R"({"num_attention_heads": 12})").QueryGroups()->value().value, 12);
  EXPECT_EQ(Parse(R"({"head_dim": 256, "hidden_size": 5120, "num_attention_heads": 24})").HeadDim()->value().value, 256);
  EXPECT_THAT(Parse(R"({"hidden_size": 100, "num_attention_heads": 3})").HeadDim().status().message(),
              HasSubstr("hidden_size 100 is not a multiple of num_attention_heads 3"));
}

TEST(ModelConfigTest, TextConfigOfMultimodalConfigsAndNulls) {
  ModelConfig c = Parse(R"({"model_type": "qwen3_5", "vision_config": {"hidden_size": 1152},
                            "text_config": {"hidden_size": 5120, "vocab_size": 248320}, "q_lora_rank": null})");
  EXPECT_EQ(c.First({"vocab_size"})->value().value, 248320);
  EXPECT_EQ(c.First({"hidden_size"})->value().value, 5120);  // not the vision tower's
  EXPECT_FALSE(c.First({"q_lora_rank"})->has_value());
}

TEST(ModelConfigTest, SizesThatAreNotPositiveIntegersAreRefusedNamingTheKey) {
  EXPECT_THAT(Parse(R"({"num_experts": "many"})").Experts().status().message(),
              HasSubstr("model config 'config.json': num_experts is 'many', not a positive integer"));
  EXPECT_FALSE(Parse(R"({"vocab_size": 0})").First({"vocab_size"}).ok());
  EXPECT_THAT(ModelConfig::Parse("[1, 2]", "c.json").status().message(), HasSubstr("a JSON object"));
  EXPECT_FALSE(ModelConfig::Parse("{\"a\": [", "c.json").ok());
}

TEST(ModelConfigTest, LoadedFromAFile) {
  const auto path = std::filesystem::temp_directory_path() / "refit_model_config_test.json";
  std::ofstream(path) << R"({"num_experts": 8})";
  absl::StatusOr<ModelConfig> c = LoadModelConfigFile(path.string());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->source(), path.string());
  EXPECT_EQ(c->Experts()->value().value, 8);
  std::filesystem::remove(path);
  EXPECT_THAT(LoadModelConfigFile(path.string()).status().message(), HasSubstr("cannot read model config"));
  EXPECT_THAT(LoadModelConfigFile("/dev/zero").status().message(), HasSubstr("not a regular file"));
}

}  // namespace
}  // namespace refit::spec
