// The quantization metadata a converted checkpoint carries (QuantMetadata), per format, and that
// reading it back (spec/quant_config.h) names the format again: both come from the format
// table's CheckpointNames.
#include "refit/checkpoint_io.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "formats/format_info.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "spec/quant_config.h"

namespace refit {
namespace {

using formats::Format;
using nlohmann::json;

const json kProducer = {{"name", "refitd"}, {"version", "0.1.0"}};
const json kExclude = json::array({"l.0.n"});

// Quantizes l.0.q.weight to `format`, keeps l.0.n.weight (so l.0.n is excluded).
std::map<std::string, std::string> MetadataFor(const std::string& format) {
  const std::string text = "model: m\nrules:\n  - match: \"l.{i}.q.weight\"\n    format: " + format + "\n";
  absl::StatusOr<spec::ModelSpec> s = spec::ParseModelSpec(text);
  EXPECT_TRUE(s.ok()) << s.status();
  absl::StatusOr<std::map<std::string, std::string>> files =
      QuantMetadata(*s, {{"l.0.q.weight", DType::kBF16, {128, 128}, 128 * 128 * 2},
                         {"l.0.n.weight", DType::kBF16, {128, 128}, 128 * 128 * 2}});
  EXPECT_TRUE(files.ok()) << files.status();
  return files.ok() ? *files : std::map<std::string, std::string>{};
}

json QuantizationConfig(const std::map<std::string, std::string>& files) {
  auto it = files.find("config.json");
  if (it == files.end()) return json();
  return json::parse(it->second)["quantization_config"];
}

TEST(QuantMetadataTest, FamilyFormsInConfigJson) {
  const json fp8 = {{"quant_method", "fp8"},       {"fmt", "e4m3"},
                    {"activation_scheme", "dynamic"}, {"weight_block_size", {128, 128}},
                    {"modules_to_not_convert", kExclude}};
  json ue8m0 = fp8;
  ue8m0["scale_fmt"] = "ue8m0";
  const json mxfp8 = {{"quant_method", "mxfp8"},      {"fmt", "e4m3"},        {"activation_scheme", "dynamic"},
                      {"weight_block_size", {1, 32}}, {"scale_fmt", "ue8m0"}, {"modules_to_not_convert", kExclude}};
  const json mxfp4 = {{"quant_method", "mxfp4"}, {"modules_to_not_convert", kExclude}};
  const std::map<std::string, json> family_forms = {
      {"fp8_block128", fp8}, {"fp8_block128_ue8m0", ue8m0}, {"mxfp8", mxfp8}, {"mxfp4", mxfp4}};
  // Every quantized row with a family form (a quant_method) has its expected form here
  // (compressed-tensors rows: CompressedTensorsForm).
  for (const formats::FormatInfo& row : formats::AllFormats()) {
    if (!row.quantized || !row.checkpoint.compressed_tensors.format.empty()) continue;
    EXPECT_EQ(family_forms.contains(std::string(row.name)), !row.checkpoint.quant_method.empty())
        << "FamilyFormsInConfigJson: format " << row.name << (row.checkpoint.quant_method.empty() ? " is" : " is not")
        << " listed, and its row has " << (row.checkpoint.quant_method.empty() ? "no" : "a") << " quant_method";
  }
  for (const auto& [name, want] : family_forms) {
    const auto files = MetadataFor(name);
    EXPECT_EQ(files.size(), 1u) << name;
    EXPECT_EQ(QuantizationConfig(files), want) << name;
  }
}

// The QuantizationArgs JSON compressed-tensors 0.20.0 writes (ModelCompressor.update_config).
json CtArgs(const std::string& type, int bits, const std::string& strategy, json group_size, bool dynamic) {
  return {{"dynamic", dynamic},   {"group_size", group_size}, {"num_bits", bits},
          {"strategy", strategy}, {"symmetric", true},        {"type", type}};
}

json CtConfig(const std::string& format, json weights, json input) {
  return {{"config_groups",
           {{"group_0",
             {{"format", format},
              {"input_activations", input},
              {"output_activations", nullptr},
              {"targets", {"Linear"}},
              {"weights", weights}}}}},
          {"format", format},
          {"global_compression_ratio", nullptr},
          {"ignore", kExclude},
          {"kv_cache_scheme", nullptr},
          {"moe_sparsity_config", nullptr},
          {"quant_method", "compressed-tensors"},
          {"quantization_status", "compressed"},
          {"sparsity_config", json::object()},
          {"transform_config", json::object()},
          {"version", "0.20.0"}};
}

// What the compressed-tensors package's ModelCompressor writes for a model compressed with the
// FP8_DYNAMIC, FP8 (dynamic per-tensor input), NVFP4A16 and W4A16 schemes, checked against the
// package (tests/golden/ct_load_check.py loads a converted checkpoint with it).
TEST(QuantMetadataTest, CompressedTensorsForm) {
  json nvfp4_weights = CtArgs("float", 4, "tensor_group", 16, false);
  nvfp4_weights["scale_dtype"] = "torch.float8_e4m3fn";
  const std::map<std::string, json> forms = {
      {"ct_fp8_channel", CtConfig("float-quantized", CtArgs("float", 8, "channel", nullptr, false),
                                  CtArgs("float", 8, "token", nullptr, true))},
      {"ct_fp8_tensor", CtConfig("float-quantized", CtArgs("float", 8, "tensor", nullptr, false),
                                 CtArgs("float", 8, "tensor", nullptr, true))},
      {"ct_nvfp4", CtConfig("nvfp4-pack-quantized", nvfp4_weights, nullptr)},
      {"ct_w4a16", CtConfig("pack-quantized", CtArgs("int", 4, "group", 128, false), nullptr)},
  };
  for (const formats::FormatInfo& row : formats::AllFormats()) {
    EXPECT_EQ(forms.contains(std::string(row.name)), !row.checkpoint.compressed_tensors.format.empty())
        << "CompressedTensorsForm: no expected compressed-tensors metadata for format " << row.name;
  }
  for (const auto& [name, want] : forms) {
    const auto files = MetadataFor(name);
    EXPECT_EQ(files.size(), 1u) << name;
    EXPECT_EQ(QuantizationConfig(files), want) << name;
  }
}

TEST(QuantMetadataTest, CompressedTensorsFormatsMixByModuleNameOnly) {
  const std::string text =
      "model: m\nrules:\n"
      "  - match: \"l.0.{p:a,b}.weight\"\n    format: ct_nvfp4\n"
      "  - match: \"l.1.{p:a,b}.weight\"\n    format: ct_w4a16\n"
      "  - match: \"l.2.{p:a,b}.weight\"\n    format: mxfp8\n";
  absl::StatusOr<spec::ModelSpec> s = spec::ParseModelSpec(text);
  ASSERT_TRUE(s.ok()) << s.status();
  auto files = QuantMetadata(*s, {{"l.0.a.weight", DType::kBF16, {128, 128}, 0},
                                  {"l.0.b.weight", DType::kBF16, {128, 128}, 0},
                                  {"l.1.a.weight", DType::kBF16, {128, 128}, 0}});
  ASSERT_TRUE(files.ok()) << files.status();
  const json q = QuantizationConfig(*files);
  EXPECT_EQ(q["format"], "mixed-precision");
  EXPECT_EQ(q["config_groups"]["group_0"]["targets"], json({"l.0.a", "l.0.b"}));
  EXPECT_EQ(q["config_groups"]["group_0"]["format"], "nvfp4-pack-quantized");
  EXPECT_EQ(q["config_groups"]["group_1"]["targets"], json({"l.1.a"}));
  absl::StatusOr<spec::QuantConfig> back = spec::ParseQuantConfigText(files->at("config.json"), "config.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->FormatForTensor("l.0.b.weight"), Format::kCtNvfp4);
  EXPECT_EQ(back->FormatForTensor("l.1.a.weight"), Format::kCtW4a16);
  EXPECT_EQ(back->FormatForTensor("l.2.a.weight"), std::nullopt);
  // With a format that has no compressed-tensors form, no metadata describes the checkpoint.
  auto mixed =
      QuantMetadata(*s, {{"l.0.a.weight", DType::kBF16, {128, 128}, 0}, {"l.2.a.weight", DType::kBF16, {128, 128}, 0}});
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("mixes compressed-tensors formats"), std::string::npos) << mixed.status();
}

// A [1] scale, global scale or weight_shape is whole on every rank: tensor-parallel splits are
// refused at resolution. Per-channel scales split with their rows (N), and a split along K (a
// row-parallel layer) leaves every rank the whole [N, 1] scale.
TEST(QuantMetadataTest, CompressedTensorsSplitsThatWouldChangeTheBytesAreRefused) {
  auto resolve = [](const std::string& format, int dim) {
    const std::string text =
        "model: m\ntensor_parallel: {size: 2}\nrules:\n  - match: \"l.{i}.q.weight\"\n"
        "    format: " +
        format + "\n    shard: {dim: " + std::to_string(dim) + "}\n";
    absl::StatusOr<spec::ModelSpec> s = spec::ParseModelSpec(text);
    EXPECT_TRUE(s.ok()) << s.status();
    return QuantMetadata(*s, {{"l.0.q.weight", DType::kBF16, {256, 256}, 256 * 256 * 2}}).status();
  };
  EXPECT_TRUE(resolve("ct_fp8_channel", 0).ok());
  EXPECT_TRUE(resolve("ct_fp8_channel", 1).ok());
  EXPECT_NE(resolve("ct_fp8_tensor", 0).message().find("'_scale' output is whole on every rank"), std::string::npos);
  EXPECT_NE(resolve("ct_fp8_tensor", 1).message().find("'_scale' output is whole on every rank"), std::string::npos);
  EXPECT_NE(resolve("ct_nvfp4", 0).message().find("'_global_scale' output is whole on every rank"), std::string::npos);
  EXPECT_NE(resolve("ct_w4a16", 1).message().find("'_shape' output is whole on every rank"), std::string::npos);
}

TEST(QuantMetadataTest, Nvfp4InTheModelOptForm) {
  const std::vector<std::string> modelopt_only = {"nvfp4", "nvfp4_te"};
  // Every quantized row written in the ModelOpt form only (no quant_method) is listed here.
  for (const formats::FormatInfo& row : formats::AllFormats()) {
    if (!row.quantized || !row.checkpoint.quant_method.empty()) continue;
    EXPECT_NE(std::find(modelopt_only.begin(), modelopt_only.end(), row.name), modelopt_only.end())
        << "Nvfp4InTheModelOptForm: no expected ModelOpt metadata for format " << row.name;
  }
  for (const std::string& name : modelopt_only) {
    const auto files = MetadataFor(name);
    ASSERT_EQ(files.size(), 2u) << name;
    const json hf = json::parse(files.at("hf_quant_config.json"));
    EXPECT_EQ(hf, (json{{"producer", kProducer},
                        {"quantization", {{"quant_algo", "NVFP4"}, {"group_size", 16}, {"exclude_modules", kExclude}}}}))
        << name;
    EXPECT_EQ(QuantizationConfig(files), (json{{"quant_method", "modelopt"},
                                               {"quant_algo", "NVFP4"},
                                               {"group_size", 16},
                                               {"ignore", kExclude},
                                               {"producer", kProducer}}))
        << name;
  }
}

TEST(QuantMetadataTest, MixedFormatsAreModelOptLayers) {
  const std::string text =
      "model: m\nrules:\n"
      "  - match: \"l.0.{p:a,b,c,d}.weight\"\n    format: nvfp4\n"
      "  - match: \"l.1.{p:a,b,c,d}.weight\"\n    format: mxfp8\n"
      "  - match: \"l.2.{p:a,b,c,d}.weight\"\n    format: fp8_block128_ue8m0\n"
      "  - match: \"l.3.{p:a,b,c,d}.weight\"\n    format: mxfp4\n";
  absl::StatusOr<spec::ModelSpec> s = spec::ParseModelSpec(text);
  ASSERT_TRUE(s.ok()) << s.status();
  auto files = QuantMetadata(*s, {{"l.0.a.weight", DType::kBF16, {128, 128}, 0},
                                  {"l.1.a.weight", DType::kBF16, {128, 128}, 0},
                                  {"l.2.a.weight", DType::kBF16, {128, 128}, 0},
                                  {"l.3.a.weight", DType::kBF16, {128, 128}, 0}});
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 1u);
  const json layers = {{"l.0.a", {{"quant_algo", "NVFP4"}, {"group_size", 16}}},
                       {"l.1.a", {{"quant_algo", "MXFP8"}}},
                       {"l.2.a", {{"quant_algo", "FP8_BLOCK128"}}},
                       {"l.3.a", {{"quant_algo", "MXFP4"}}}};
  EXPECT_EQ(json::parse(files->at("hf_quant_config.json")),
            (json{{"producer", kProducer},
                  {"quantization",
                   {{"quant_algo", "MIXED_PRECISION"}, {"quantized_layers", layers},
                    {"exclude_modules", json::array()}}}}));
}

TEST(QuantMetadataTest, WhatIsWrittenReadsBackAsTheFormat) {
  for (const formats::FormatInfo& info : formats::AllFormats()) {
    if (!info.quantized) continue;
    const auto files = MetadataFor(std::string(info.name));
    for (const auto& [file, text] : files) {
      absl::StatusOr<spec::QuantConfig> q = spec::ParseQuantConfigText(text, file);
      ASSERT_TRUE(q.ok()) << info.name << " " << file << ": " << q.status();
      // TE's NVFP4 is written as ModelOpt's NVFP4, which reads as nvfp4: same tensors and meaning.
      const Format want = info.format == Format::kNvfp4Te ? Format::kNvfp4 : info.format;
      EXPECT_EQ(q->FormatForTensor("l.0.q.weight"), want) << info.name << " " << file;
      EXPECT_EQ(q->FormatForTensor("l.0.n.weight"), std::nullopt) << info.name << " " << file;
    }
  }
}

}  // namespace
}  // namespace refit
