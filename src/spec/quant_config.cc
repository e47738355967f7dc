#include "spec/quant_config.h"

#include <algorithm>
#include <fstream>
#include <regex>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/bounded_file.h"
#include "common/status_macros.h"
#include "formats/format_info.h"
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

// A ModelOpt quant_algo as a refitd format: the row that reads that name (format_info.h).
absl::StatusOr<formats::Format> ModelOptAlgo(std::string_view source, const YAML::Node& node, const std::string& key) {
  std::string algo = absl::AsciiStrToUpper(node.as<std::string>());
  std::string supported;
  for (const formats::FormatInfo& info : formats::AllFormats()) {
    const formats::CheckpointNames& names = info.checkpoint;
    if ((names.reads_modelopt_algo && algo == names.modelopt_algo) ||
        (!names.modelopt_alias.empty() && algo == names.modelopt_alias)) {
      return info.format;
    }
    if (names.reads_modelopt_algo) absl::StrAppend(&supported, std::string(names.modelopt_algo), ", ");
  }
  return Error(source, node, key,
               absl::StrCat("quant_algo '", node.as<std::string>(), "' has no refitd format (supported: ", supported,
                            "MIXED_PRECISION); this checkpoint layout cannot be refit"));
}

// group_size, when the format's checkpoints name one, must be it.
absl::Status CheckFormatGroupSize(std::string_view source, const YAML::Node& q, const std::string& key,
                                  formats::Format f) {
  const int64_t want = formats::Info(f).checkpoint.group_size;
  if (want == 0) return absl::OkStatus();
  return CheckGroupSize(source, q, key, static_cast<int>(want));
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
      REFIT_RETURN_IF_ERROR(CheckFormatGroupSize(source, kv.second, where, f));
      c.layers[module] = f;
    }
    return c;
  }
  REFIT_ASSIGN_OR_RETURN(formats::Format f, ModelOptAlgo(source, q["quant_algo"], absl::StrCat(key, ".quant_algo")));
  REFIT_RETURN_IF_ERROR(CheckFormatGroupSize(source, q, key, f));
  if (const YAML::Node groups = q["config_groups"]; groups && formats::Info(f).checkpoint.group_size > 0) {
    for (const auto& g : groups) {
      if (g.second["weights"]) {
        REFIT_RETURN_IF_ERROR(CheckFormatGroupSize(
            source, g.second["weights"], absl::StrCat(key, ".config_groups.", g.first.as<std::string>(), ".weights"), f));
      }
    }
  }
  c.format = f;
  return c;
}

// The refitd format of one compressed-tensors config group: the row whose compressed-tensors
// names match the group's format and weights arguments (symmetric, static weights).
absl::StatusOr<formats::Format> CompressedTensorsGroup(std::string_view source, const YAML::Node& group,
                                                       const std::string& where, const std::string& top_format) {
  const YAML::Node w = group["weights"];
  if (!w || !w.IsMap()) {
    return Error(source, group, where, "has no 'weights' arguments; refitd converts weights only");
  }
  std::string format = group["format"] && group["format"].IsScalar() ? group["format"].as<std::string>() : top_format;
  auto str = [&](const char* k) {
    return w[k] && w[k].IsScalar() ? absl::AsciiStrToLower(w[k].as<std::string>()) : "";
  };
  // naive-quantized stores FP8 weights exactly as float-quantized does (the same compressor).
  if (format == "naive-quantized" && str("type") == "float") format = "float-quantized";
  // Group activation ordering stores a weight_g_idx permutation, which refitd does not produce.
  if (str("actorder") == "group") {
    return Error(source, w["actorder"], where + ".weights.actorder",
                 "'group' stores a weight_g_idx tensor refitd does not produce; no refitd format");
  }
  int64_t num_bits = 0, group_size = 0;
  if (w["num_bits"] && !YAML::convert<int64_t>::decode(w["num_bits"], num_bits)) num_bits = -1;
  if (w["group_size"] && !w["group_size"].IsNull() && !YAML::convert<int64_t>::decode(w["group_size"], group_size)) {
    group_size = -2;
  }
  if (group_size == -1) group_size = 0;  // -1: per channel
  const bool symmetric = !w["symmetric"] || str("symmetric") == "true";
  const bool dynamic = w["dynamic"] && str("dynamic") != "false";
  std::string strategy = str("strategy");
  if (strategy.empty()) strategy = group_size > 0 ? "group" : "tensor";
  std::string supported;
  for (const formats::FormatInfo& info : formats::AllFormats()) {
    const auto& ct = info.checkpoint.compressed_tensors;
    if (ct.format.empty()) continue;
    absl::StrAppend(&supported, supported.empty() ? "" : "; ", std::string(info.name), " (", std::string(ct.format),
                    ", ");
    absl::StrAppend(&supported, std::string(ct.type), " ", ct.num_bits, "-bit ", std::string(ct.strategy),
                    ct.group_size > 0 ? absl::StrCat(" ", ct.group_size) : "", ")");
    if (symmetric && !dynamic && format == ct.format && str("type") == ct.type && num_bits == ct.num_bits &&
        strategy == ct.strategy && group_size == ct.group_size) {
      return info.format;
    }
  }
  const std::string what = absl::StrCat("format '", format, "' with ", str("type"), " ", num_bits, "-bit ", strategy,
                                        group_size > 0 ? absl::StrCat(" group ", group_size) : "");
  return Error(source, w, where + ".weights",
               absl::StrCat(what, symmetric ? "" : " asymmetric", dynamic ? " dynamic" : "",
                            " weights has no refitd format (supported: ", supported, ")"));
}

// config.json "quantization_config" with quant_method compressed-tensors (llm-compressor).
absl::StatusOr<QuantConfig> ParseCompressedTensors(std::string_view source, const YAML::Node& q,
                                                   const std::string& key) {
  QuantConfig c;
  c.source = std::string(source);
  c.algo = "compressed-tensors";
  REFIT_ASSIGN_OR_RETURN(c.exclude, StringList(source, q["ignore"], key + ".ignore"));
  for (const std::string& p : c.exclude) {
    if (!p.starts_with("re:")) continue;
    try {
      std::regex re(p.substr(3));
    } catch (const std::regex_error& e) {
      return Error(source, q["ignore"], key + ".ignore", absl::StrCat("'", p, "' is not a regular expression"));
    }
  }
  const YAML::Node groups = q["config_groups"];
  if (!groups || !groups.IsMap() || groups.size() == 0) {
    return Error(source, q, key, "compressed-tensors needs a 'config_groups' mapping");
  }
  const std::string top = q["format"] && q["format"].IsScalar() ? q["format"].as<std::string>() : "";
  std::vector<std::pair<formats::Format, std::vector<std::string>>> found;
  for (const auto& g : groups) {
    const std::string where = absl::StrCat(key, ".config_groups.", g.first.as<std::string>());
    if (!g.second.IsMap()) return Error(source, g.second, where, "expected a mapping");
    REFIT_ASSIGN_OR_RETURN(formats::Format f, CompressedTensorsGroup(source, g.second, where, top));
    REFIT_ASSIGN_OR_RETURN(std::vector<std::string> targets,
                           StringList(source, g.second["targets"], where + ".targets"));
    found.emplace_back(f, std::move(targets));
  }
  const bool one = std::all_of(found.begin(), found.end(), [&](const auto& p) { return p.first == found[0].first; });
  if (one) {
    c.format = found[0].first;
    return c;
  }
  // Several formats: each group must name its modules (not a class or a regular expression).
  for (const auto& [f, targets] : found) {
    for (const std::string& t : targets) {
      if (t == "Linear" || t.starts_with("re:") || t.find('.') == std::string::npos) {
        return Error(source, groups, key + ".config_groups",
                     absl::StrCat("groups of different formats must target modules by name; target '", t,
                                  "' is a class or pattern, so which modules take which format is not known"));
      }
      c.layers[t] = f;
    }
  }
  return c;
}

absl::StatusOr<QuantConfig> ParseQuantizationConfig(std::string_view source, const YAML::Node& q) {
  const std::string key = "quantization_config";
  if (!q.IsMap()) return Error(source, q, key, "expected a mapping");
  if (!q["quant_method"]) return Error(source, q, key, "missing 'quant_method'");
  std::string method = absl::AsciiStrToLower(q["quant_method"].as<std::string>());
  if (method == "modelopt") return ParseModelOpt(source, q, key);
  if (method == "compressed-tensors") return ParseCompressedTensors(source, q, key);
  QuantConfig c;
  c.source = std::string(source);
  c.algo = method;
  REFIT_ASSIGN_OR_RETURN(c.exclude, StringList(source, q["modules_to_not_convert"], key + ".modules_to_not_convert"));
  REFIT_ASSIGN_OR_RETURN(std::vector<std::string> ignored, StringList(source, q["ignored_layers"], key + ".ignored_layers"));
  c.exclude.insert(c.exclude.end(), ignored.begin(), ignored.end());
  // The rows of this quant_method (format_info.h CheckpointNames); scale_fmt picks among them.
  std::vector<const formats::FormatInfo*> rows;
  std::vector<std::string> methods, scale_fmts;
  for (const formats::FormatInfo& info : formats::AllFormats()) {
    const std::string_view m = info.checkpoint.quant_method;
    if (m.empty()) continue;
    if (std::find(methods.begin(), methods.end(), m) == methods.end()) methods.emplace_back(m);
    if (m != method) continue;
    rows.push_back(&info);
    if (!info.checkpoint.scale_fmt.empty()) scale_fmts.emplace_back(info.checkpoint.scale_fmt);
  }
  if (rows.empty()) {
    return Error(source, q["quant_method"], key + ".quant_method",
                 absl::StrCat("'", method, "' has no refitd format (supported: modelopt, ", absl::StrJoin(methods, ", "),
                              ")"));
  }
  const formats::FormatInfo* row = rows[0];  // scale_fmt absent: the method's first row
  const std::string scale_fmt = q["scale_fmt"] ? q["scale_fmt"].as<std::string>() : "";
  if (!scale_fmt.empty() && !scale_fmts.empty()) {
    auto it = std::find_if(rows.begin(), rows.end(),
                           [&](const formats::FormatInfo* r) { return r->checkpoint.scale_fmt == scale_fmt; });
    if (it == rows.end()) {
      return Error(source, q["scale_fmt"], key + ".scale_fmt",
                   absl::StrCat("must be ", absl::StrJoin(scale_fmts, " or "), " when present"));
    }
    row = *it;
  }
  if (row->checkpoint.weight_block_size) {
    const int64_t want_rows = row->block.rows, want_cols = row->block.cols;
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
  }
  if (!row->checkpoint.fmt.empty() && q["fmt"] && q["fmt"].as<std::string>() != row->checkpoint.fmt) {
    return Error(source, q["fmt"], key + ".fmt",
                 absl::StrCat("only ", std::string(row->checkpoint.fmt), " ", std::string(row->name), " checkpoints are supported"));
  }
  c.format = row->format;
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
    // compressed-tensors' "re:" patterns match from the start of the name (Python re.match);
    // ParseCompressedTensors checked that they compile.
    const bool regex = pattern.starts_with("re:");
    while (true) {
      if (regex) {
        const std::string name(m);
        if (std::regex_search(name, std::regex(pattern.substr(3)), std::regex_constants::match_continuous)) return true;
      } else if (GlobMatch(pattern, m)) {
        return true;
      }
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
