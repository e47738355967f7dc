#include "spec/quant_config.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/bounded_file.h"
#include "common/status_macros.h"
#include "yaml-cpp/yaml.h"

namespace refit::spec {
namespace {

absl::Status Error(std::string_view source, const YAML::Node& node, std::string_view key, std::string_view msg) {
  int line = node.Mark().line >= 0 ? node.Mark().line + 1 : 0;
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(source), ":", line, ": ", std::string(key), ": ", std::string(msg)));
}

absl::StatusOr<std::vector<std::string>> StringList(std::string_view source, const YAML::Node& node,
                                                    const std::string& key) {
  std::vector<std::string> out;
  if (!node) return out;
  if (!node.IsSequence()) return Error(source, node, key, "expected a list of strings");
  for (const YAML::Node& n : node) {
    if (!n.IsScalar()) return Error(source, n, key, "expected a string");
    out.push_back(n.as<std::string>());
  }
  return out;
}

// group_size, when present, must be `want`.
absl::Status CheckGroupSize(std::string_view source, const YAML::Node& q, const std::string& key, int want) {
  if (!q["group_size"]) return absl::OkStatus();
  int g = 0;
  if (!YAML::convert<int>::decode(q["group_size"], g) || g != want) {
    return Error(source, q["group_size"], absl::StrCat(key, ".group_size"),
                 absl::StrCat("is ", YAML::Dump(q["group_size"]), "; refitd's format for this algorithm uses ", want));
  }
  return absl::OkStatus();
}

// A ModelOpt quant_algo as a refitd format.
absl::StatusOr<formats::Format> ModelOptAlgo(std::string_view source, const YAML::Node& node, const std::string& key) {
  std::string algo = absl::AsciiStrToUpper(node.as<std::string>());
  if (algo == "NVFP4") return formats::Format::kNvfp4;
  if (algo == "MXFP8") return formats::Format::kMxfp8;
  if (algo == "MXFP4") return formats::Format::kMxfp4;
  if (algo == "FP8_BLOCK128" || algo == "FP8_PB_WO") return formats::Format::kFp8Block128;
  return Error(source, node, key,
               absl::StrCat("quant_algo '", node.as<std::string>(),
                            "' has no refitd format (supported: NVFP4, MXFP8, MXFP4, FP8_BLOCK128, MIXED_PRECISION); "
                            "this checkpoint layout cannot be refit"));
}

// hf_quant_config.json "quantization", or config.json "quantization_config" with quant_method modelopt.
absl::StatusOr<QuantConfig> ParseModelOpt(std::string_view source, const YAML::Node& q, const std::string& key) {
  QuantConfig c;
  c.source = std::string(source);
  if (!q["quant_algo"]) return Error(source, q, key, "missing 'quant_algo'");
  c.algo = q["quant_algo"].as<std::string>();
  REFIT_ASSIGN_OR_RETURN(c.exclude, StringList(source, q["exclude_modules"], absl::StrCat(key, ".exclude_modules")));
  REFIT_ASSIGN_OR_RETURN(std::vector<std::string> ignore, StringList(source, q["ignore"], absl::StrCat(key, ".ignore")));
  c.exclude.insert(c.exclude.end(), ignore.begin(), ignore.end());
  if (absl::AsciiStrToUpper(c.algo) == "MIXED_PRECISION") {
    const YAML::Node layers = q["quantized_layers"];
    if (!layers || !layers.IsMap()) {
      return Error(source, q, key, "quant_algo MIXED_PRECISION needs a 'quantized_layers' mapping");
    }
    for (const auto& kv : layers) {
      std::string module = kv.first.as<std::string>();
      std::string where = absl::StrCat(key, ".quantized_layers.", module);
      if (!kv.second.IsMap() || !kv.second["quant_algo"]) return Error(source, kv.second, where, "needs 'quant_algo'");
      REFIT_ASSIGN_OR_RETURN(formats::Format f, ModelOptAlgo(source, kv.second["quant_algo"], where + ".quant_algo"));
      if (f == formats::Format::kNvfp4) REFIT_RETURN_IF_ERROR(CheckGroupSize(source, kv.second, where, 16));
      c.layers[module] = f;
    }
    return c;
  }
  REFIT_ASSIGN_OR_RETURN(formats::Format f, ModelOptAlgo(source, q["quant_algo"], absl::StrCat(key, ".quant_algo")));
  if (f == formats::Format::kNvfp4) {
    REFIT_RETURN_IF_ERROR(CheckGroupSize(source, q, key, 16));
    if (const YAML::Node groups = q["config_groups"]) {
      for (const auto& g : groups) {
        if (g.second["weights"]) {
          REFIT_RETURN_IF_ERROR(CheckGroupSize(source, g.second["weights"],
                                               absl::StrCat(key, ".config_groups.", g.first.as<std::string>(), ".weights"), 16));
        }
      }
    }
  }
  c.format = f;
  return c;
}

absl::StatusOr<QuantConfig> ParseQuantizationConfig(std::string_view source, const YAML::Node& q) {
  const std::string key = "quantization_config";
  if (!q.IsMap()) return Error(source, q, key, "expected a mapping");
  if (!q["quant_method"]) return Error(source, q, key, "missing 'quant_method'");
  std::string method = absl::AsciiStrToLower(q["quant_method"].as<std::string>());
  if (method == "modelopt") return ParseModelOpt(source, q, key);
  QuantConfig c;
  c.source = std::string(source);
  c.algo = method;
  REFIT_ASSIGN_OR_RETURN(c.exclude, StringList(source, q["modules_to_not_convert"], key + ".modules_to_not_convert"));
  REFIT_ASSIGN_OR_RETURN(std::vector<std::string> ignored, StringList(source, q["ignored_layers"], key + ".ignored_layers"));
  c.exclude.insert(c.exclude.end(), ignored.begin(), ignored.end());
  auto block = [&](int64_t want_rows, int64_t want_cols) -> absl::Status {
    const YAML::Node b = q["weight_block_size"];
    if (!b) return Error(source, q, key, "missing 'weight_block_size'");
    std::vector<int64_t> v;
    if (!b.IsSequence() || b.size() != 2) return Error(source, b, key + ".weight_block_size", "expected [rows, cols]");
    for (const YAML::Node& n : b) v.push_back(n.as<int64_t>());
    if (v[0] != want_rows || v[1] != want_cols) {
      return Error(source, b, key + ".weight_block_size",
                   absl::StrCat("[", v[0], ", ", v[1], "] is not [", want_rows, ", ", want_cols,
                                "]; refitd cannot produce this checkpoint layout"));
    }
    return absl::OkStatus();
  };
  std::string scale_fmt = q["scale_fmt"] ? q["scale_fmt"].as<std::string>() : "";
  if (method == "fp8") {
    REFIT_RETURN_IF_ERROR(block(128, 128));
    if (q["fmt"] && q["fmt"].as<std::string>() != "e4m3") {
      return Error(source, q["fmt"], key + ".fmt", "only e4m3 block-128 checkpoints are supported");
    }
    if (!scale_fmt.empty() && scale_fmt != "ue8m0") {
      return Error(source, q["scale_fmt"], key + ".scale_fmt", "must be ue8m0 when present");
    }
    c.format = scale_fmt == "ue8m0" ? formats::Format::kFp8Block128Ue8m0 : formats::Format::kFp8Block128;
  } else if (method == "mxfp8") {
    REFIT_RETURN_IF_ERROR(block(1, 32));
    c.format = formats::Format::kMxfp8;
  } else if (method == "mxfp4") {
    c.format = formats::Format::kMxfp4;
  } else {
    return Error(source, q["quant_method"], key + ".quant_method",
                 absl::StrCat("'", method, "' has no refitd format (supported: modelopt, fp8, mxfp8, mxfp4)"));
  }
  return c;
}

}  // namespace

bool GlobMatch(std::string_view p, std::string_view t) {
  size_t pi = 0, ti = 0, star = std::string_view::npos, mark = 0;
  while (ti < t.size()) {
    if (pi < p.size() && (p[pi] == '?' || p[pi] == t[ti])) {
      ++pi;
      ++ti;
    } else if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = ti;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      ti = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

bool QuantConfig::Excluded(std::string_view module) const {
  for (const std::string& pattern : exclude) {
    std::string_view m = module;
    while (true) {
      if (GlobMatch(pattern, m)) return true;
      size_t dot = m.rfind('.');
      if (dot == std::string_view::npos) break;
      m = m.substr(0, dot);
    }
  }
  return false;
}

std::optional<formats::Format> QuantConfig::FormatForTensor(std::string_view tensor_name) const {
  size_t dot = tensor_name.rfind('.');
  std::string_view module = dot == std::string_view::npos ? tensor_name : tensor_name.substr(0, dot);
  if (Excluded(module)) return std::nullopt;
  if (format) return format;
  auto it = layers.find(std::string(module));
  if (it == layers.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<QuantConfig> ParseQuantConfigNode(const YAML::Node& root, std::string_view source) {
  if (!root.IsMap()) return Error(source, root, "quantization", "expected a mapping");
  if (const YAML::Node q = root["quantization"]) {
    if (!q.IsMap()) return Error(source, q, "quantization", "expected a mapping");
    return ParseModelOpt(source, q, "quantization");
  }
  if (const YAML::Node q = root["quantization_config"]) return ParseQuantizationConfig(source, q);
  return Error(source, root, "quantization",
               "neither an hf_quant_config.json ('quantization') nor a config.json with 'quantization_config'");
}

absl::StatusOr<QuantConfig> ParseQuantConfigText(std::string_view text, std::string_view source) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(source), ":", e.mark.line + 1, ": ", e.msg));
  }
  return ParseQuantConfigNode(root, source);
}

absl::StatusOr<QuantConfig> LoadQuantConfigFile(const std::string& path) {
  absl::StatusOr<std::string> text =
      ReadBoundedFile(path, kMaxQuantConfigFileBytes, "checkpoint quantization config");
  if (!text.ok()) return text.status();
  return ParseQuantConfigText(*text, path);
}

}  // namespace refit::spec
