#include "refit/checkpoint_io.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "formats/format_info.h"
#include "nlohmann/json.hpp"
#include "refit/resolve.h"

namespace refit {
namespace {

// One layer's (or the whole checkpoint's) ModelOpt description of format `f`.
nlohmann::json ModelOptQuantization(formats::Format f) {
  const formats::CheckpointNames& names = formats::Info(f).checkpoint;
  nlohmann::json q = {{"quant_algo", std::string(names.modelopt_algo)}};
  if (names.group_size > 0) q["group_size"] = names.group_size;
  return q;
}

// config.json "quantization_config" of a single-format checkpoint in its family's own form.
// REQUIRES: the format's row names a quant_method.
nlohmann::json FamilyQuantizationConfig(formats::Format f, const nlohmann::json& exclude) {
  const formats::FormatInfo& info = formats::Info(f);
  const formats::CheckpointNames& names = info.checkpoint;
  nlohmann::json qc = {{"quant_method", std::string(names.quant_method)}, {"modules_to_not_convert", exclude}};
  if (!names.fmt.empty()) qc["fmt"] = std::string(names.fmt);
  if (!names.activation_scheme.empty()) qc["activation_scheme"] = std::string(names.activation_scheme);
  if (names.weight_block_size) qc["weight_block_size"] = {info.block.rows, info.block.cols};
  if (!names.scale_fmt.empty()) qc["scale_fmt"] = std::string(names.scale_fmt);
  return qc;
}

// One compressed-tensors QuantizationArgs, as the package serializes it (fields left at their
// defaults, such as observer and a symmetric scheme's zp_dtype, are omitted).
nlohmann::json CompressedTensorsArgs(std::string_view type, int num_bits, std::string_view strategy, int group_size,
                                     bool dynamic, std::string_view scale_dtype) {
  nlohmann::json a = {
      {"dynamic", dynamic},   {"group_size", group_size > 0 ? nlohmann::json(group_size) : nlohmann::json(nullptr)},
      {"num_bits", num_bits}, {"strategy", std::string(strategy)},
      {"symmetric", true},    {"type", std::string(type)}};
  if (!scale_dtype.empty()) a["scale_dtype"] = std::string(scale_dtype);
  return a;
}

// config.json "quantization_config" of a compressed-tensors checkpoint, as the package's
// ModelCompressor writes it: one config group per format, targeting every Linear when there is
// one format and the modules by name otherwise. Input activations are dynamic FP8 where the
// format's scheme has them; static activation scales are calibration results refitd never makes.
// REQUIRES: every format of `used` has a compressed-tensors form.
nlohmann::json CompressedTensorsConfig(const std::map<std::string, formats::Format>& quantized,
                                       const std::set<formats::Format>& used, const nlohmann::json& ignore) {
  nlohmann::json groups = nlohmann::json::object();
  int index = 0;
  for (formats::Format f : used) {
    const auto& ct = formats::Info(f).checkpoint.compressed_tensors;
    nlohmann::json targets = nlohmann::json::array();
    if (used.size() == 1) {
      targets.push_back("Linear");
    } else {
      for (const auto& [m, mf] : quantized) {
        if (mf == f) targets.push_back(m);
      }
    }
    nlohmann::json input = nullptr;
    if (!ct.dynamic_input_strategy.empty()) {
      input = CompressedTensorsArgs("float", 8, ct.dynamic_input_strategy, 0, /*dynamic=*/true, "");
    }
    groups[absl::StrCat("group_", index++)] = {
        {"format", std::string(ct.format)},
        {"input_activations", input},
        {"output_activations", nullptr},
        {"targets", targets},
        {"weights", CompressedTensorsArgs(ct.type, ct.num_bits, ct.strategy, ct.group_size, false, ct.scale_dtype)}};
  }
  const std::string format = used.size() == 1
                                 ? std::string(formats::Info(*used.begin()).checkpoint.compressed_tensors.format)
                                 : "mixed-precision";
  return {{"config_groups", groups},
          {"format", format},
          {"global_compression_ratio", nullptr},
          {"ignore", ignore},
          {"kv_cache_scheme", nullptr},
          {"moe_sparsity_config", nullptr},
          {"quant_method", "compressed-tensors"},
          {"quantization_status", "compressed"},
          {"sparsity_config", nlohmann::json::object()},
          {"transform_config", nlohmann::json::object()},
          {"version", "0.20.0"}};
}

std::string Module(const std::string& name) {
  size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

absl::Status WriteText(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text << "\n";
  if (!out) return absl::InternalError(absl::StrCat("cannot write '", path.string(), "'"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& path) {
  std::vector<std::string> files;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    for (const auto& e : std::filesystem::directory_iterator(path, ec)) {
      if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) return absl::NotFoundError(absl::StrCat("no .safetensors files in '", path, "'"));
  } else {
    files.push_back(path);
  }
  auto c = std::unique_ptr<Checkpoint>(new Checkpoint());
  for (const std::string& f : files) {
    REFIT_ASSIGN_OR_RETURN(std::unique_ptr<formats::SafetensorsFile> file, formats::SafetensorsFile::Open(f));
    for (const formats::SafetensorsEntry& e : file->view().tensors()) {
      if (!c->by_name_.emplace(e.name, c->tensors_.size()).second) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", e.name, "' appears twice in '", path, "'"));
      }
      c->tensors_.push_back({e.name, e.dtype, e.shape, file->view().Data(e).data()});
    }
    c->files_.push_back(std::move(file));
  }
  return c;
}

std::vector<storage::ParamInfo> Checkpoint::infos() const {
  std::vector<storage::ParamInfo> out;
  for (const InputTensor& t : tensors_) out.push_back({t.name, t.dtype, t.shape, *DenseBytes(t.dtype, t.shape)});
  return out;
}

const InputTensor* Checkpoint::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<std::map<std::string, std::string>> QuantMetadata(const spec::ModelSpec& spec,
                                                                 const std::vector<storage::ParamInfo>& inputs) {
  std::map<std::string, formats::Format> quantized;  // module -> format
  std::set<std::string> plain;                       // modules with an unquantized rank >= 2 tensor
  std::set<formats::Format> used;
  for (const storage::ParamInfo& in : inputs) {
    REFIT_ASSIGN_OR_RETURN(Resolution r, Resolve(spec, in.name, in.dtype, in.shape));
    const std::string module = Module(in.name);
    if (r.quantized && !r.rule->never) {
      quantized[module] = r.format;
      used.insert(r.format);
    } else if (in.shape.size() >= 2) {
      plain.insert(module);
    }
  }
  std::map<std::string, std::string> files;
  if (used.empty()) return files;
  nlohmann::json exclude = nlohmann::json::array();
  for (const std::string& m : plain) {
    if (!quantized.count(m)) exclude.push_back(m);
  }
  size_t ct_formats = 0;
  for (formats::Format f : used) ct_formats += formats::Info(f).checkpoint.compressed_tensors.format.empty() ? 0 : 1;
  if (ct_formats > 0) {
    if (ct_formats != used.size()) {
      std::vector<std::string> names;
      for (formats::Format f : used) names.emplace_back(formats::FormatName(f));
      return absl::InvalidArgumentError(absl::StrCat("the spec mixes compressed-tensors formats with others (",
                                                     absl::StrJoin(names, ", "),
                                                     "); no checkpoint metadata describes both"));
    }
    files["config.json"] =
        nlohmann::json{{"quantization_config", CompressedTensorsConfig(quantized, used, exclude)}}.dump(2);
    return files;
  }
  nlohmann::json producer = {{"name", "refitd"}, {"version", "0.1.0"}};
  if (used.size() > 1) {
    nlohmann::json layers = nlohmann::json::object();
    for (const auto& [m, f] : quantized) layers[m] = ModelOptQuantization(f);
    nlohmann::json q = {{"quant_algo", "MIXED_PRECISION"}, {"quantized_layers", layers}, {"exclude_modules", exclude}};
    files["hf_quant_config.json"] = nlohmann::json{{"producer", producer}, {"quantization", q}}.dump(2);
    return files;
  }
  const formats::Format f = *used.begin();
  nlohmann::json qc;
  if (formats::Info(f).checkpoint.quant_method.empty()) {
    // ModelOpt form: hf_quant_config.json, and config.json's quant_method modelopt.
    nlohmann::json q = ModelOptQuantization(f);
    q["exclude_modules"] = exclude;
    files["hf_quant_config.json"] = nlohmann::json{{"producer", producer}, {"quantization", q}}.dump(2);
    qc = ModelOptQuantization(f);
    qc["quant_method"] = "modelopt";
    qc["ignore"] = exclude;
    qc["producer"] = producer;
  } else {
    qc = FamilyQuantizationConfig(f, exclude);
  }
  files["config.json"] = nlohmann::json{{"quantization_config", qc}}.dump(2);
  return files;
}

absl::Status WriteConvertedCheckpoint(const std::string& out_dir, const spec::ModelSpec& spec,
                                      const std::vector<storage::ParamInfo>& inputs,
                                      const std::vector<ConvertedTensor>& converted) {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create '", out_dir, "': ", ec.message()));
  REFIT_ASSIGN_OR_RETURN(auto meta, QuantMetadata(spec, inputs));
  std::vector<formats::SafetensorsWriteEntry> entries;
  for (const ConvertedTensor& t : converted) entries.push_back({t.name, t.dtype, t.shape, t.bytes, nullptr});
  formats::SafetensorsWriteOptions options;
  options.order = formats::HeaderOrder::kSortedByName;
  options.metadata = {{"format", "pt"}};
  REFIT_RETURN_IF_ERROR(
      formats::WriteSafetensors((std::filesystem::path(out_dir) / "model.safetensors").string(), entries, options));
  for (const auto& [file, text] : meta) REFIT_RETURN_IF_ERROR(WriteText(std::filesystem::path(out_dir) / file, text));
  return absl::OkStatus();
}

std::map<std::string, const ConvertedTensor*> ByName(const std::vector<ConvertedTensor>& tensors) {
  std::map<std::string, const ConvertedTensor*> out;
  for (const ConvertedTensor& t : tensors) out[t.name] = &t;
  return out;
}

}  // namespace refit
