#include "spec/model_spec.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/bounded_file.h"
#include "common/status_macros.h"
#include "formats/format_info.h"
#include "yaml-cpp/yaml.h"

namespace refit::spec {
namespace {

// `size: engine`: the size is the engine's, from its ranks' registrations.
bool IsEngine(const YAML::Node& node) { return node.IsScalar() && node.Scalar() == "engine"; }

// Errors carry "file:line: key: message".
class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  absl::Status Error(const YAML::Node& node, std::string_view where, absl::string_view msg) const {
    int line = node.Mark().line >= 0 ? node.Mark().line + 1 : 0;
    return absl::InvalidArgumentError(absl::StrCat(path_, ":", line, ": ", std::string(where), ": ", msg));
  }

  absl::Status CheckKeys(const YAML::Node& map, std::string_view where, const std::set<std::string>& allowed) const {
    if (!map.IsMap()) return Error(map, where, "expected a mapping");
    for (const auto& kv : map) {
      std::string key = kv.first.as<std::string>();
      if (!allowed.count(key)) {
        return Error(kv.first, where, absl::StrCat("unknown key '", key, "' (allowed: ", absl::StrJoin(allowed, ", "), ")"));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> String(const YAML::Node& node, std::string_view where) const {
    if (!node.IsScalar()) return Error(node, where, "expected a string");
    return node.as<std::string>();
  }

  absl::StatusOr<bool> Bool(const YAML::Node& node, std::string_view where) const {
    bool v = false;
    if (!node.IsScalar() || !YAML::convert<bool>::decode(node, v)) return Error(node, where, "expected true or false");
    return v;
  }

  absl::StatusOr<int64_t> Int(const YAML::Node& node, std::string_view where, int64_t min) const {
    int64_t v = 0;
    if (!node.IsScalar() || !YAML::convert<int64_t>::decode(node, v)) return Error(node, where, "expected an integer");
    if (v < min) return Error(node, where, absl::StrCat("must be at least ", min));
    return v;
  }

  absl::StatusOr<NamePattern> Pattern(const YAML::Node& node, std::string_view where) const {
    REFIT_ASSIGN_OR_RETURN(std::string text, String(node, where));
    absl::StatusOr<NamePattern> p = NamePattern::Parse(text);
    if (!p.ok()) return Error(node, where, p.status().message());
    return p;
  }

  absl::Status Conversion(const YAML::Node& node, std::string_view where, Rule& rule) const {
    REFIT_ASSIGN_OR_RETURN(std::string name, String(node, where));
    if (name == "auto") {
      rule.conversion = Conversion::kAuto;
    } else if (name == "passthrough") {
      rule.conversion = Conversion::kPassthrough;
    } else if (name == "checkpoint") {
      rule.conversion = Conversion::kCheckpoint;
    } else {
      absl::StatusOr<formats::Format> f = formats::ParseFormat(name);
      if (!f.ok()) {
        return Error(node, where, absl::StrCat(f.status().message(), "; or auto, passthrough, checkpoint"));
      }
      rule.conversion = Conversion::kFormat;
      rule.format = *f;
    }
    return absl::OkStatus();
  }

  absl::Status Options(const YAML::Node& map, const std::string& where, formats::QuantizeOptions& options) const {
    if (map["fp32_input"]) {
      REFIT_ASSIGN_OR_RETURN(std::string v, String(map["fp32_input"], absl::StrCat(where, ".fp32_input")));
      if (v == "exact") {
        options.fp32_input = formats::Fp32InputPolicy::kExact;
      } else if (v == "round_to_bf16") {
        options.fp32_input = formats::Fp32InputPolicy::kRoundToBf16;
      } else {
        return Error(map["fp32_input"], absl::StrCat(where, ".fp32_input"), "must be exact or round_to_bf16");
      }
    }
    if (map["nonfinite"]) {
      REFIT_ASSIGN_OR_RETURN(std::string v, String(map["nonfinite"], absl::StrCat(where, ".nonfinite")));
      if (v == "reject") {
        options.nonfinite = formats::NonfinitePolicy::kReject;
      } else if (v == "propagate") {
        options.nonfinite = formats::NonfinitePolicy::kPropagate;
      } else {
        return Error(map["nonfinite"], absl::StrCat(where, ".nonfinite"), "must be reject or propagate");
      }
    }
    return absl::OkStatus();
  }

  absl::Status Layout(const YAML::Node& list, const std::string& where, Rule& rule) const {
    return Layout(list, where, rule.layout, true);
  }

  // `with_on` false: the steps of a derived copy, each on the one tensor it derives from.
  absl::Status Layout(const YAML::Node& list, const std::string& where, std::vector<LayoutStep>& steps,
                      bool with_on) const {
    if (!list.IsSequence()) return Error(list, where, "expected a list of steps");
    for (size_t i = 0; i < list.size(); ++i) {
      const YAML::Node n = list[i];
      std::string w = absl::StrCat(where, "[", i, "]");
      if (with_on) {
        REFIT_RETURN_IF_ERROR(CheckKeys(n, w, {"op", "on", "dim", "multiple", "epilogue_tile_m", "dtype"}));
        if (!n["op"] || !n["on"]) return Error(n, w, "needs 'op' and 'on'");
      } else {
        REFIT_RETURN_IF_ERROR(CheckKeys(n, w, {"op", "dim", "multiple", "epilogue_tile_m", "dtype"}));
        if (!n["op"]) return Error(n, w, "needs 'op'");
      }
      LayoutStep s;
      s.line = n.Mark().line + 1;
      REFIT_ASSIGN_OR_RETURN(std::string op, String(n["op"], w + ".op"));
      if (op == "swizzle_128x4") {
        s.op = LayoutOp::kSwizzle128x4;
      } else if (op == "pack_ue8m0") {
        s.op = LayoutOp::kPackUe8m0;
      } else if (op == "swap_row_pairs") {
        s.op = LayoutOp::kSwapRowPairs;
      } else if (op == "swap_halves") {
        s.op = LayoutOp::kSwapHalves;
      } else if (op == "pad") {
        s.op = LayoutOp::kPad;
      } else if (op == "reorder_rows_for_gated_act_gemm") {
        s.op = LayoutOp::kReorderGatedRows;
      } else if (op == "shuffle_matrix_a") {
        s.op = LayoutOp::kShuffleMatrixA;
      } else if (op == "shuffle_matrix_sf_a") {
        s.op = LayoutOp::kShuffleMatrixSfA;
      } else if (op == "merge_dims") {
        s.op = LayoutOp::kMergeDims;
      } else if (op == "cast_f32") {
        s.op = LayoutOp::kCastF32;
      } else if (op == "view_dtype") {
        s.op = LayoutOp::kViewDtype;
      } else {
        return Error(n["op"], w + ".op",
                     absl::StrCat("unknown op '", op,
                                  "' (supported: swizzle_128x4, pack_ue8m0, swap_row_pairs, "
                                  "swap_halves, pad, reorder_rows_for_gated_act_gemm, shuffle_matrix_a, "
                                  "shuffle_matrix_sf_a, merge_dims, cast_f32, view_dtype)"));
      }
      if (with_on) {
        std::vector<YAML::Node> on;
        if (n["on"].IsSequence()) {
          for (const YAML::Node& o : n["on"]) on.push_back(o);
        } else {
          on.push_back(n["on"]);
        }
        for (const YAML::Node& o : on) {
          REFIT_ASSIGN_OR_RETURN(std::string suffix, String(o, w + ".on"));
          s.on.push_back(suffix == "data" ? "" : suffix);
        }
      } else {
        s.on.push_back("");
      }
      const bool shuffles = s.op == LayoutOp::kShuffleMatrixA || s.op == LayoutOp::kShuffleMatrixSfA;
      if (n["epilogue_tile_m"]) {
        if (!shuffles)
          return Error(n["epilogue_tile_m"], w + ".epilogue_tile_m", absl::StrCat(op, " takes no 'epilogue_tile_m'"));
        REFIT_ASSIGN_OR_RETURN(s.epilogue_tile_m, Int(n["epilogue_tile_m"], w + ".epilogue_tile_m", 1));
      }
      const bool needs_dim = s.op == LayoutOp::kSwapRowPairs || s.op == LayoutOp::kSwapHalves ||
                             s.op == LayoutOp::kPad || s.op == LayoutOp::kMergeDims;
      // The row permutations move the rows along `dim` (default -2), each row all that follows it:
      // gpt-oss's 4-D `_blocks` [E, N, K/32, 16] have their rows at -3, a bias [E, N] at -1.
      const bool rows_dim = s.op == LayoutOp::kReorderGatedRows || s.op == LayoutOp::kShuffleMatrixA;
      if (rows_dim) s.dim = -2;
      if (n["dim"]) {
        if (!needs_dim && !rows_dim) return Error(n["dim"], w + ".dim", absl::StrCat(op, " takes no 'dim'"));
        REFIT_ASSIGN_OR_RETURN(int64_t d, Int(n["dim"], w + ".dim", -8));
        s.dim = static_cast<int>(d);
      } else if (needs_dim) {
        return Error(n, w, absl::StrCat(op, " needs 'dim'"));
      }
      if (n["multiple"]) {
        if (s.op != LayoutOp::kPad) return Error(n["multiple"], w + ".multiple", "only pad takes 'multiple'");
        REFIT_ASSIGN_OR_RETURN(s.multiple, Int(n["multiple"], w + ".multiple", 1));
      } else if (s.op == LayoutOp::kPad) {
        return Error(n, w, "pad needs 'multiple'");
      }
      // view_dtype: the dtype the engine registers the bytes as. Its width is checked against the
      // bytes' dtype when the layout is applied (LayoutShape), where that dtype is known.
      if (n["dtype"]) {
        if (s.op != LayoutOp::kViewDtype) return Error(n["dtype"], w + ".dtype", "only view_dtype takes 'dtype'");
        REFIT_ASSIGN_OR_RETURN(std::string name, String(n["dtype"], w + ".dtype"));
        absl::StatusOr<DType> dtype = ParseDType(name);
        if (!dtype.ok()) return Error(n["dtype"], w + ".dtype", dtype.status().message());
        s.dtype = *dtype;
      } else if (s.op == LayoutOp::kViewDtype) {
        return Error(n, w, "view_dtype needs 'dtype'");
      }
      steps.push_back(std::move(s));
    }
    return absl::OkStatus();
  }

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Sizes a spec may leave to the model (docs/config.md, "Sizes come from the model").
class Sizes {
 public:
  using Lookup = std::function<absl::StatusOr<std::optional<ConfigSize>>(const ModelConfig&)>;
  // When a size neither the spec nor a model config gives is an error.
  enum class Need : uint8_t {
    kOptional,  // never: 0 means "not given" (vocab_size: no padding)
    kLater,     // when a tensor needs it (a Megatron-core push: linear_qkv's heads); listed as unresolved
    kAtLoad,    // at load (a stack's count: the planner's slots): listed, and the spec refused
  };

  Sizes(const Reader& r, const LoadOptions& options, ModelSpec& spec) : r_(r), options_(options), spec_(spec) {}

  // `parent[key]` when the spec states it (it must agree with the model config's, when one is
  // given and has the size), else the model config's (`keys` names where it looks, for errors);
  // 0 when neither has it. With a model config, a size it lacks that is needed (not kOptional)
  // is an error; without one, it is listed as unresolved.
  absl::StatusOr<int64_t> Get(const YAML::Node& parent, const char* key, const std::string& where,
                              const Lookup& lookup, std::string_view keys, Need need) {
    const ModelConfig* config = options_.model_config;
    if (const YAML::Node n = parent[key]) {
      REFIT_ASSIGN_OR_RETURN(int64_t v, r_.Int(n, where, 1));
      if (config != nullptr) {
        absl::StatusOr<std::optional<ConfigSize>> c = lookup(*config);
        if (!c.ok()) return r_.Error(n, where, c.status().message());
        if (*c && (*c)->value != v) {
          return r_.Error(n, where,
                          absl::StrCat(v, ", but the model config '", config->source(), "' gives ", (*c)->from, " ",
                                       (*c)->value, " (leave it out of the spec to take the model's)"));
        }
      }
      return v;
    }
    if (config != nullptr) {
      absl::StatusOr<std::optional<ConfigSize>> c = lookup(*config);
      if (!c.ok()) return r_.Error(parent, where, c.status().message());
      if (*c) return (*c)->value;
      if (need != Need::kOptional) {
        return r_.Error(parent, where,
                        absl::StrCat("not given, and the model config '", config->source(), "' has no ",
                                     std::string(keys)));
      }
      return 0;
    }
    if (need == Need::kOptional) return 0;
    std::string entry = absl::StrCat(where, " (line ", parent.Mark().line + 1, ")");
    if (need == Need::kAtLoad) refused_.push_back(entry);
    spec_.unresolved.push_back(std::move(entry));
    return 0;
  }

  // The sizes the spec cannot load without (no model config was given).
  const std::vector<std::string>& refused() const { return refused_; }

 private:
  const Reader& r_;
  const LoadOptions& options_;
  ModelSpec& spec_;
  std::vector<std::string> refused_;
};

absl::StatusOr<std::optional<ConfigSize>> ExpertsOf(const ModelConfig& c) { return c.Experts(); }
absl::StatusOr<std::optional<ConfigSize>> QueryGroupsOf(const ModelConfig& c) { return c.QueryGroups(); }
absl::StatusOr<std::optional<ConfigSize>> HeadDimOf(const ModelConfig& c) { return c.HeadDim(); }
// The config's value of `key`.
Sizes::Lookup Key(const char* key) {
  return [key](const ModelConfig& c) { return c.First({key}); };
}

constexpr std::string_view kExpertKeys = "num_experts, n_routed_experts or num_local_experts";

bool Contains(const std::vector<std::string>& v, const std::string& x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// The suffixes a format emits ("" for the data tensor).
std::vector<std::string> Suffixes(formats::Format f) {
  std::vector<std::string> out;
  for (const formats::OutputRole& o : formats::Info(f).Outputs()) out.push_back(std::string(o.suffix));
  return out;
}

// Cross-field checks of one rule, after every key was read.
absl::Status CheckRule(const Reader& r, const YAML::Node& n, const std::string& where, const Rule& rule,
                       const ModelSpec& spec) {
  const std::vector<std::string> caps = rule.match.CaptureNames();
  std::set<std::string> moving;  // captures that pick a slot, not a parameter
  if (rule.fuse) {
    if (!Contains(caps, rule.fuse->capture)) {
      return r.Error(n["fuse"], where + ".fuse.capture",
                     absl::StrCat("{", rule.fuse->capture, "} is not a capture of '", rule.match.text(), "'"));
    }
    moving.insert(rule.fuse->capture);
  }
  if (rule.stack) {
    if (!Contains(caps, rule.stack->capture)) {
      return r.Error(n["stack"], where + ".stack.capture",
                     absl::StrCat("{", rule.stack->capture, "} is not a capture of '", rule.match.text(), "'"));
    }
    if (rule.fuse && rule.fuse->capture == rule.stack->capture) {
      return r.Error(n["stack"], where + ".stack.capture", "fuse and stack need different captures");
    }
    moving.insert(rule.stack->capture);
  }
  if (!moving.empty() && !rule.target) {
    return r.Error(n, where, "fuse/stack need a 'target' naming the fused engine parameter");
  }
  if (rule.target) {
    if (!rule.target->Expandable()) {
      return r.Error(n["target"], where + ".target", "must be literals and {captures} only (it names one parameter)");
    }
    if (!rule.match.Expandable()) {
      return r.Error(n["match"], where + ".match",
                     "a rule with a 'target' must match with literals and {captures} only, so that every source of "
                     "the target can be named");
    }
    const std::vector<std::string> tcaps = rule.target->CaptureNames();
    for (const std::string& c : tcaps) {
      if (!Contains(caps, c)) {
        return r.Error(n["target"], where + ".target", absl::StrCat("{", c, "} is not a capture of the match pattern"));
      }
      if (moving.count(c)) {
        return r.Error(n["target"], where + ".target",
                       absl::StrCat("{", c, "} selects a fused/stacked slot and cannot appear in the target"));
      }
    }
    for (const std::string& c : caps) {
      if (!moving.count(c) && !Contains(tcaps, c)) {
        return r.Error(n["target"], where + ".target",
                       absl::StrCat("{", c, "} of the match pattern is missing, so different tensors would land in one "
                                    "parameter; fuse or stack them, or use it in the target"));
      }
    }
  }
  if (rule.never && (rule.target || rule.fuse || rule.stack || rule.shard || !rule.layout.empty())) {
    return r.Error(n, where, "a 'refit: never' rule keeps the engine's value and takes no target/fuse/stack/shard/layout");
  }
  if (rule.conversion == Conversion::kCheckpoint && !spec.checkpoint) {
    return r.Error(n["format"], where + ".format", "'checkpoint' needs the top-level 'checkpoint' section");
  }
  if (rule.transpose && rule.conversion != Conversion::kFormat && rule.conversion != Conversion::kCheckpoint) {
    return r.Error(n["transpose"], where + ".transpose", "only quantizing rules transpose their input");
  }
  // Layout steps must name outputs the rule produces.
  std::vector<std::string> suffixes = {""};
  if (rule.conversion == Conversion::kFormat) {
    suffixes = Suffixes(rule.format);
  } else if (rule.conversion == Conversion::kCheckpoint && spec.checkpoint && spec.checkpoint->format) {
    suffixes = Suffixes(*spec.checkpoint->format);
    if (!Contains(suffixes, "")) suffixes.push_back("");  // excluded modules keep the plain name
  } else if (rule.conversion == Conversion::kCheckpoint) {
    suffixes.clear();  // mixed precision: any format's suffixes
  }
  for (const LayoutStep& s : rule.layout) {
    for (const std::string& on : s.on) {
      if (!suffixes.empty() && !Contains(suffixes, on)) {
        return r.Error(n["layout"], where + ".layout",
                       absl::StrCat("step on '", on.empty() ? "data" : on, "' (line ", s.line,
                                    "): this rule's format emits no such tensor (it emits: ",
                                    absl::StrJoin(suffixes, ", ", [](std::string* o, const std::string& x) {
                                      o->append(x.empty() ? "data" : x);
                                    }),
                                    ")"));
      }
    }
    // A layout op's precondition, not a format switch: pack_ue8m0 packs F32 power-of-two scales,
    // which of the formats only this one emits (formats/layout.h).
    if (s.op == LayoutOp::kPackUe8m0 && rule.conversion == Conversion::kFormat &&
        rule.format != formats::Format::kFp8Block128Ue8m0) {
      return r.Error(n["layout"], where + ".layout",
                     absl::StrCat("pack_ue8m0 (line ", s.line, ") needs power-of-two scales: format fp8_block128_ue8m0, not ",
                                  formats::FormatName(rule.format)));
    }
  }
  // The rule's explicit format must agree with the checkpoint's metadata.
  if (spec.checkpoint && rule.conversion == Conversion::kFormat && spec.checkpoint->format &&
      rule.format != *spec.checkpoint->format && formats::Info(rule.format).quantized) {
    return r.Error(n["format"], where + ".format",
                   absl::StrCat("quantizes to ", formats::FormatName(rule.format), " but the checkpoint (",
                                spec.checkpoint->source, ", ", spec.checkpoint->algo, ") holds ",
                                formats::FormatName(*spec.checkpoint->format), "; use format: checkpoint"));
  }
  return absl::OkStatus();
}

}  // namespace

bool LayoutStep::AppliesTo(std::string_view suffix) const {
  for (const std::string& s : on) {
    if (s == suffix) return true;
  }
  return false;
}

std::string Rule::Describe() const { return absl::StrCat("rule '", match.text(), "' (line ", line, ")"); }

int64_t Rule::Slots() const {
  return (fuse ? static_cast<int64_t>(fuse->order.size()) : 1) * (stack ? stack->count : 1);
}

namespace {

// Ids of the entries of `items` that `index` says may match `name`: all of them when the index
// does not cover `items` (a spec assembled by hand).
template <typename T>
std::vector<size_t> Candidates(const PatternIndex& index, const std::vector<T>& items, std::string_view name) {
  if (index.size() == items.size()) return index.MatchCandidates(name);
  std::vector<size_t> all(items.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  return all;
}

}  // namespace

absl::StatusOr<const Rule*> ModelSpec::RuleFor(std::string_view name) const {
  const Rule* found = nullptr;
  for (size_t i : Candidates(match_index, rules, name)) {
    const Rule& r = rules[i];
    if (!r.match.Match(name)) continue;
    if (found != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", std::string(name), "' matches both ",
                                                     found->Describe(), " and ", r.Describe(), " of ", path));
    }
    found = &r;
  }
  return found != nullptr ? found : &defaults;
}

const Rule* ModelSpec::NeverRuleFor(std::string_view name) const {
  for (size_t i : Candidates(match_index, rules, name)) {
    const Rule& r = rules[i];
    if (r.never && r.match.Match(name)) return &r;
  }
  return nullptr;
}

std::optional<std::pair<const Derived*, Captures>> ModelSpec::DerivedFor(std::string_view engine_param) const {
  for (size_t i : Candidates(derived_index, derived, engine_param)) {
    const Derived& d = derived[i];
    if (auto caps = d.target.Match(engine_param)) return std::make_pair(&d, *caps);
  }
  return std::nullopt;
}

std::vector<const Rule*> ModelSpec::TargetCandidates(std::string_view base) const {
  std::vector<const Rule*> out;
  for (size_t i : Candidates(target_index, rules, base)) out.push_back(&rules[i]);
  return out;
}

absl::StatusOr<ModelSpec> ParseModelSpec(std::string_view yaml, std::string_view path, std::string_view base_dir,
                                         const LoadOptions& options) {
  Reader r{std::string(path)};
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(path), ":", e.mark.line + 1, ": YAML: ", e.msg));
  }
  ModelSpec spec;
  spec.path = std::string(path);
  if (options.model_config != nullptr) spec.model_config = options.model_config->source();
  Sizes sizes(r, options, spec);
  REFIT_RETURN_IF_ERROR(r.CheckKeys(
      root, "spec", {"model", "checkpoint", "tensor_parallel", "expert_parallel", "source", "defaults", "rules", "groups",
             "derived"}));
  if (!root["model"]) return r.Error(root, "spec", "missing required key 'model'");
  REFIT_ASSIGN_OR_RETURN(spec.model, r.String(root["model"], "model"));
  if (const YAML::Node c = root["checkpoint"]) {
    REFIT_RETURN_IF_ERROR(r.CheckKeys(c, "checkpoint", {"quant_config", "quantization", "quantization_config"}));
    if (c.size() != 1) return r.Error(c, "checkpoint", "give exactly one of quant_config, quantization, quantization_config");
    if (c["quant_config"]) {
      REFIT_ASSIGN_OR_RETURN(std::string file, r.String(c["quant_config"], "checkpoint.quant_config"));
      std::filesystem::path p(file);
      if (p.is_relative() && !base_dir.empty()) p = std::filesystem::path(std::string(base_dir)) / p;
      absl::StatusOr<QuantConfig> q = LoadQuantConfigFile(p.string());
      if (!q.ok()) return r.Error(c["quant_config"], "checkpoint.quant_config", q.status().message());
      spec.checkpoint = std::move(*q);
    } else {
      absl::StatusOr<QuantConfig> q =
          ParseQuantConfigNode(c, absl::StrCat(std::string(path), " (checkpoint)"));
      if (!q.ok()) return q.status();
      spec.checkpoint = std::move(*q);
    }
  }
  if (const YAML::Node tp = root["tensor_parallel"]) {
    REFIT_RETURN_IF_ERROR(r.CheckKeys(tp, "tensor_parallel", {"size", "rank"}));
    if (!tp["size"]) {
      return r.Error(tp, "tensor_parallel",
                     "needs 'size': a number, or 'engine' to take it from the engine's registration (and 'rank' for "
                     "a single-rank engine)");
    }
    if (IsEngine(tp["size"])) {
      // The engine's ranks say it when they register (Node fixes it at the first; WithEngineSize).
      if (tp["rank"]) {
        return r.Error(tp["rank"], "tensor_parallel.rank", "needs a stated size (not 'engine')");
      }
      spec.tp_size_from_engine = true;
    } else {
      REFIT_ASSIGN_OR_RETURN(int64_t size, r.Int(tp["size"], "tensor_parallel.size", 1));
      if (size > kMaxEngineRanks) {
        return r.Error(tp["size"], "tensor_parallel.size", absl::StrCat("at most ", kMaxEngineRanks, ", or engine"));
      }
      spec.tp_size = static_cast<int>(size);
      if (tp["rank"]) {
        // A daemon whose one engine is rank `rank` (the single-rank node of specs before engine ranks).
        REFIT_ASSIGN_OR_RETURN(int64_t rank, r.Int(tp["rank"], "tensor_parallel.rank", 0));
        if (rank >= size) return r.Error(tp["rank"], "tensor_parallel.rank", absl::StrCat("must be below size ", size));
        spec.tp_rank = static_cast<int>(rank);
        spec.tp_rank_given = true;
      }
    }
  }
  if (const YAML::Node ep = root["expert_parallel"]) {
    REFIT_RETURN_IF_ERROR(r.CheckKeys(ep, "expert_parallel", {"size"}));
    if (!ep["size"]) return r.Error(ep, "expert_parallel", "needs 'size'");
    if (IsEngine(ep["size"])) {
      if (!spec.tp_size_from_engine) {
        return r.Error(ep["size"], "expert_parallel.size",
                       "'engine' needs tensor_parallel.size: engine (experts are split across the tensor-parallel "
                       "ranks)");
      }
      spec.ep_size_from_engine = true;
    } else {
      REFIT_ASSIGN_OR_RETURN(int64_t size, r.Int(ep["size"], "expert_parallel.size", 1));
      if (size > 1 && spec.tp_size_from_engine) {
        return r.Error(ep["size"], "expert_parallel.size",
                       "tensor_parallel.size is the engine's: write expert_parallel.size: engine (or 1)");
      }
      if (size > 1 && size != spec.tp_size) {
        return r.Error(ep["size"], "expert_parallel.size",
                       absl::StrCat("must equal tensor_parallel.size (", spec.tp_size,
                                    "): experts are split across the tensor-parallel ranks"));
      }
      spec.ep_size = static_cast<int>(size);
      spec.ep_rank = spec.ep_size > 1 ? spec.tp_rank : 0;
    }
  }
  if (const YAML::Node src = root["source"]) {
    REFIT_RETURN_IF_ERROR(r.CheckKeys(src, "source",
                                      {"layout", "attention", "experts", "num_attention_heads", "num_query_groups",
                                       "head_dim", "q_lora_rank", "num_experts", "vocab_size", "linear_num_key_heads",
                                       "linear_key_head_dim", "linear_num_value_heads", "linear_value_head_dim"}));
    if (!src["layout"]) return r.Error(src, "source", "needs 'layout' (megatron)");
    REFIT_ASSIGN_OR_RETURN(std::string layout, r.String(src["layout"], "source.layout"));
    if (layout != "megatron") return r.Error(src["layout"], "source.layout", "must be megatron");
    MegatronSource m;
    m.line = src.Mark().line + 1;
    if (src["attention"]) {
      REFIT_ASSIGN_OR_RETURN(std::string attention, r.String(src["attention"], "source.attention"));
      if (attention == "mla") {
        m.attention = MegatronSource::Attention::kMla;
      } else if (attention == "gated") {
        m.attention = MegatronSource::Attention::kGated;
      } else if (attention != "gqa") {
        return r.Error(src["attention"], "source.attention", "must be gqa, mla or gated");
      }
    }
    if (src["experts"]) {
      REFIT_ASSIGN_OR_RETURN(std::string experts, r.String(src["experts"], "source.experts"));
      if (experts == "gpt_oss") {
        m.experts = MegatronSource::Experts::kGptOss;
      } else if (experts != "per_expert") {
        return r.Error(src["experts"], "source.experts", "must be per_expert or gpt_oss");
      }
    }
    // Grouped-query attention's linear_qkv needs its heads; MLA has no linear_qkv.
    const bool gqa = m.attention != MegatronSource::Attention::kMla;
    const std::tuple<const char*, int64_t*, Sizes::Lookup, const char*> heads[] = {
        {"num_attention_heads", &m.num_attention_heads, Key("num_attention_heads"), "num_attention_heads"},
        {"num_query_groups", &m.num_query_groups, QueryGroupsOf, "num_key_value_heads"},
        {"head_dim", &m.head_dim, HeadDimOf, "head_dim (nor hidden_size and num_attention_heads)"}};
    for (const auto& [key, field, lookup, keys] : heads) {
      if (!gqa && !src[key]) continue;
      REFIT_ASSIGN_OR_RETURN(*field, sizes.Get(src, key, absl::StrCat("source.", key), lookup, keys,
                                               gqa ? Sizes::Need::kLater : Sizes::Need::kOptional));
    }
    if (m.attention == MegatronSource::Attention::kMla || src["q_lora_rank"]) {
      REFIT_ASSIGN_OR_RETURN(m.q_lora_rank, sizes.Get(src, "q_lora_rank", "source.q_lora_rank", Key("q_lora_rank"),
                                                      "q_lora_rank", Sizes::Need::kOptional));
    }
    const bool oss = m.experts == MegatronSource::Experts::kGptOss;
    if (oss || src["num_experts"]) {
      REFIT_ASSIGN_OR_RETURN(m.num_experts, sizes.Get(src, "num_experts", "source.num_experts", ExpertsOf, kExpertKeys,
                                                      oss ? Sizes::Need::kLater : Sizes::Need::kOptional));
    }
    REFIT_ASSIGN_OR_RETURN(m.vocab_size, sizes.Get(src, "vocab_size", "source.vocab_size", Key("vocab_size"), "vocab_size",
                                                   Sizes::Need::kOptional));
    const std::pair<const char*, int64_t*> linear[] = {{"linear_num_key_heads", &m.linear_num_key_heads},
                                                       {"linear_key_head_dim", &m.linear_key_head_dim},
                                                       {"linear_num_value_heads", &m.linear_num_value_heads},
                                                       {"linear_value_head_dim", &m.linear_value_head_dim}};
    for (const auto& [key, field] : linear) {
      if (m.attention != MegatronSource::Attention::kGated) {
        if (src[key]) {
          return r.Error(src[key], absl::StrCat("source.", key), "needs 'attention: gated' (gated delta-net layers)");
        }
        continue;
      }
      REFIT_ASSIGN_OR_RETURN(*field,
                             sizes.Get(src, key, absl::StrCat("source.", key), Key(key), key, Sizes::Need::kLater));
    }
    if (m.linear_num_key_heads > 0 && m.linear_num_value_heads % m.linear_num_key_heads != 0) {
      return r.Error(src["linear_num_value_heads"] ? src["linear_num_value_heads"] : src, "source.linear_num_value_heads",
                     absl::StrCat("must be a multiple of linear_num_key_heads ", m.linear_num_key_heads));
    }
    if (m.num_query_groups > 0 && m.num_attention_heads % m.num_query_groups != 0) {
      return r.Error(src["num_query_groups"] ? src["num_query_groups"] : src, "source.num_query_groups",
                     absl::StrCat("must divide num_attention_heads ", m.num_attention_heads));
    }
    spec.source = m;
  }
  spec.defaults.match = *NamePattern::Parse("**");
  if (const YAML::Node d = root["defaults"]) {
    REFIT_RETURN_IF_ERROR(r.CheckKeys(d, "defaults", {"format", "fp32_input", "nonfinite", "partial"}));
    if (d["format"]) {
      REFIT_RETURN_IF_ERROR(r.Conversion(d["format"], "defaults.format", spec.defaults));
      if (spec.defaults.conversion == Conversion::kCheckpoint && !spec.checkpoint) {
        return r.Error(d["format"], "defaults.format", "'checkpoint' needs the top-level 'checkpoint' section");
      }
    }
    if (d["partial"]) {
      REFIT_ASSIGN_OR_RETURN(spec.defaults.partial, r.Bool(d["partial"], "defaults.partial"));
    }
    REFIT_RETURN_IF_ERROR(r.Options(d, "defaults", spec.options));
  }
  if (const YAML::Node rules = root["rules"]) {
    if (!rules.IsSequence()) return r.Error(rules, "rules", "expected a list");
    if (rules.size() > kMaxRules) {
      return r.Error(rules, "rules", absl::StrCat("lists ", rules.size(), " rules; at most ", kMaxRules));
    }
    for (size_t i = 0; i < rules.size(); ++i) {
      const YAML::Node n = rules[i];
      std::string where = absl::StrCat("rules[", i, "]");
      REFIT_RETURN_IF_ERROR(r.CheckKeys(
          n, where, {"match", "target", "format", "refit", "partial", "transpose", "fuse", "stack", "shard", "layout"}));
      if (!n["match"]) return r.Error(n, where, "missing 'match'");
      Rule rule;
      rule.line = n.Mark().line + 1;
      rule.partial = spec.defaults.partial;
      REFIT_ASSIGN_OR_RETURN(rule.match, r.Pattern(n["match"], where + ".match"));
      if (n["target"]) {
        REFIT_ASSIGN_OR_RETURN(NamePattern t, r.Pattern(n["target"], where + ".target"));
        rule.target = std::move(t);
      }
      if (n["format"]) {
        REFIT_RETURN_IF_ERROR(r.Conversion(n["format"], where + ".format", rule));
      } else {
        rule.conversion = spec.defaults.conversion;
        rule.format = spec.defaults.format;
      }
      if (n["refit"]) {
        REFIT_ASSIGN_OR_RETURN(std::string v, r.String(n["refit"], where + ".refit"));
        if (v == "never") {
          rule.never = true;
        } else if (v != "always") {
          return r.Error(n["refit"], where + ".refit", "must be 'always' or 'never'");
        }
      }
      if (n["partial"]) {
        REFIT_ASSIGN_OR_RETURN(rule.partial, r.Bool(n["partial"], where + ".partial"));
      }
      if (n["transpose"]) {
        REFIT_ASSIGN_OR_RETURN(rule.transpose, r.Bool(n["transpose"], where + ".transpose"));
      }
      if (const YAML::Node f = n["fuse"]) {
        REFIT_RETURN_IF_ERROR(r.CheckKeys(f, where + ".fuse", {"capture", "order"}));
        if (!f["capture"] || !f["order"]) return r.Error(f, where + ".fuse", "needs 'capture' and 'order'");
        Fuse fuse;
        REFIT_ASSIGN_OR_RETURN(fuse.capture, r.String(f["capture"], where + ".fuse.capture"));
        if (!f["order"].IsSequence() || f["order"].size() < 2) {
          return r.Error(f["order"], where + ".fuse.order", "must list at least two member values, in engine order");
        }
        for (const YAML::Node& o : f["order"]) {
          REFIT_ASSIGN_OR_RETURN(std::string v, r.String(o, where + ".fuse.order"));
          if (Contains(fuse.order, v)) return r.Error(o, where + ".fuse.order", absl::StrCat("'", v, "' listed twice"));
          fuse.order.push_back(v);
        }
        rule.fuse = std::move(fuse);
      }
      if (const YAML::Node s = n["stack"]) {
        REFIT_RETURN_IF_ERROR(r.CheckKeys(s, where + ".stack", {"capture", "count"}));
        if (!s["capture"]) return r.Error(s, where + ".stack", "needs 'capture' (and 'count', or a model config)");
        Stack stack;
        REFIT_ASSIGN_OR_RETURN(stack.capture, r.String(s["capture"], where + ".stack.capture"));
        REFIT_ASSIGN_OR_RETURN(stack.count, sizes.Get(s, "count", where + ".stack.count", ExpertsOf, kExpertKeys,
                                                      Sizes::Need::kAtLoad));
        if (spec.ep_size > 1 && stack.count > 0 && stack.count % spec.ep_size != 0) {
          return r.Error(s["count"] ? s["count"] : s, where + ".stack.count",
                         absl::StrCat(stack.count, " experts do not split into expert_parallel.size ", spec.ep_size,
                                      " equal parts"));
        }
        rule.stack = std::move(stack);
      }
      if (const YAML::Node s = n["shard"]) {
        if (s.IsScalar() && s.as<std::string>() == "none") {
          // replicated on every rank
        } else {
          REFIT_RETURN_IF_ERROR(r.CheckKeys(s, where + ".shard", {"dim"}));
          if (!s["dim"]) return r.Error(s, where + ".shard", "needs 'dim' (or write shard: none)");
          REFIT_ASSIGN_OR_RETURN(int64_t dim, r.Int(s["dim"], where + ".shard.dim", -8));
          if (!root["tensor_parallel"]) {
            return r.Error(s, where + ".shard", "needs the top-level 'tensor_parallel' section (size, rank)");
          }
          if ((spec.ep_size > 1 || spec.ep_size_from_engine) && n["stack"]) {
            return r.Error(s, where + ".shard",
                           "a stacked rule is split by expert under expert_parallel; its experts are whole on their "
                           "rank (remove the shard)");
          }
          rule.shard_dim = static_cast<int>(dim);
          if (spec.tp_size > 1) rule.shard = Shard{static_cast<int>(dim), spec.tp_size, spec.tp_rank};
        }
      }
      if (n["layout"]) REFIT_RETURN_IF_ERROR(r.Layout(n["layout"], where + ".layout", rule));
      REFIT_RETURN_IF_ERROR(CheckRule(r, n, where, rule, spec));
      for (size_t j : spec.match_index.OverlapCandidates(rule.match)) {
        const Rule& other = spec.rules[j];
        if (other.match.Overlaps(rule.match)) {
          return r.Error(n["match"], where + ".match",
                         absl::StrCat("'", rule.match.text(), "' overlaps ", other.Describe(),
                                      ": some tensor name matches both"));
        }
      }
      if (rule.target && !rule.never) {
        for (size_t j : spec.target_index.OverlapCandidates(*rule.target)) {
          const Rule& other = spec.rules[j];
          if (other.target && !other.never && rule.target->Overlaps(*other.target)) {
            return r.Error(n["target"], where + ".target",
                           absl::StrCat("'", rule.target->text(), "' overlaps the target of ", other.Describe()));
          }
        }
      }
      spec.match_index.Add(rule.match);
      spec.target_index.Add(rule.target ? *rule.target : rule.match);
      spec.rules.push_back(std::move(rule));
    }
  }
  if (const YAML::Node groups = root["groups"]) {
    if (!groups.IsSequence()) return r.Error(groups, "groups", "expected a list");
    if (groups.size() > kMaxRules) {
      return r.Error(groups, "groups", absl::StrCat("lists ", groups.size(), " entries; at most ", kMaxRules));
    }
    for (size_t i = 0; i < groups.size(); ++i) {
      const YAML::Node n = groups[i];
      std::string where = absl::StrCat("groups[", i, "]");
      REFIT_RETURN_IF_ERROR(r.CheckKeys(n, where, {"name", "members"}));
      Group g;
      g.line = n.Mark().line + 1;
      g.name = n["name"] ? n["name"].as<std::string>() : where;
      if (!n["members"] || !n["members"].IsSequence() || n["members"].size() < 2) {
        return r.Error(n, where, "'members' must list at least two name patterns");
      }
      for (size_t j = 0; j < n["members"].size(); ++j) {
        REFIT_ASSIGN_OR_RETURN(NamePattern p, r.Pattern(n["members"][j], absl::StrCat(where, ".members[", j, "]")));
        g.members.push_back(std::move(p));
      }
      std::vector<std::string> caps0 = g.members[0].CaptureNames();
      for (const NamePattern& m : g.members) {
        if (m.CaptureNames() != caps0) {
          return r.Error(n, where, "every member must use the same captures, in the same order");
        }
      }
      spec.groups.push_back(std::move(g));
    }
  }
  if (const YAML::Node derived = root["derived"]) {
    if (!derived.IsSequence()) return r.Error(derived, "derived", "expected a list");
    if (derived.size() > kMaxRules) {
      return r.Error(derived, "derived", absl::StrCat("lists ", derived.size(), " entries; at most ", kMaxRules));
    }
    for (size_t i = 0; i < derived.size(); ++i) {
      const YAML::Node n = derived[i];
      std::string where = absl::StrCat("derived[", i, "]");
      REFIT_RETURN_IF_ERROR(
          r.CheckKeys(n, where, {"target", "from", "op", "layout", "scale", "qk_nope_head_dim", "v_head_dim"}));
      if (!n["target"] || !n["from"] || !n["op"]) return r.Error(n, where, "needs 'target', 'from' and 'op'");
      Derived d;
      d.line = n.Mark().line + 1;
      REFIT_ASSIGN_OR_RETURN(d.target, r.Pattern(n["target"], where + ".target"));
      REFIT_ASSIGN_OR_RETURN(d.from, r.Pattern(n["from"], where + ".from"));
      REFIT_ASSIGN_OR_RETURN(std::string op, r.String(n["op"], where + ".op"));
      if (op == "add_one") {
        d.op = DerivedOp::kAddOne;
      } else if (op == "layout") {
        d.op = DerivedOp::kLayout;
      } else if (op == "mla_w_kc") {
        d.op = DerivedOp::kMlaWkc;
      } else if (op == "mla_w_vc") {
        d.op = DerivedOp::kMlaWvc;
      } else {
        return r.Error(n["op"], where + ".op", "unknown op (supported: add_one, layout, mla_w_kc, mla_w_vc)");
      }
      const bool mla = d.op == DerivedOp::kMlaWkc || d.op == DerivedOp::kMlaWvc;
      if (n["layout"]) {
        if (d.op != DerivedOp::kLayout) return r.Error(n["layout"], where + ".layout", "only op layout takes 'layout'");
        REFIT_RETURN_IF_ERROR(r.Layout(n["layout"], where + ".layout", d.layout, false));
        for (const LayoutStep& s : d.layout) {
          if (s.op == LayoutOp::kPackUe8m0) {
            return r.Error(n["layout"], where + ".layout",
                           "pack_ue8m0 needs its data tensor's rows: a rule's step only");
          }
        }
      }
      if (d.op == DerivedOp::kLayout && d.layout.empty()) return r.Error(n, where, "op layout needs 'layout' steps");
      if (n["scale"]) {
        if (!mla) return r.Error(n["scale"], where + ".scale", "only the mla ops take 'scale'");
        REFIT_ASSIGN_OR_RETURN(NamePattern sp, r.Pattern(n["scale"], where + ".scale"));
        d.scale = std::move(sp);
      }
      for (const char* key : {"qk_nope_head_dim", "v_head_dim"}) {
        if (n[key] && !mla) return r.Error(n[key], absl::StrCat(where, ".", key), "only the mla ops take it");
      }
      if (mla) {
        REFIT_ASSIGN_OR_RETURN(d.qk_nope_head_dim,
                               sizes.Get(n, "qk_nope_head_dim", where + ".qk_nope_head_dim", Key("qk_nope_head_dim"),
                                         "qk_nope_head_dim", Sizes::Need::kAtLoad));
        REFIT_ASSIGN_OR_RETURN(d.v_head_dim, sizes.Get(n, "v_head_dim", where + ".v_head_dim", Key("v_head_dim"),
                                                       "v_head_dim", Sizes::Need::kAtLoad));
      }
      if (!d.from.Expandable() || !d.target.Expandable() || (d.scale && !d.scale->Expandable())) {
        return r.Error(n, where, "target, from and scale must be literals and {captures} only");
      }
      std::vector<std::string> tc = d.target.CaptureNames(), fc = d.from.CaptureNames();
      std::sort(tc.begin(), tc.end());
      std::sort(fc.begin(), fc.end());
      if (tc != fc) return r.Error(n, where, "target and from must use the same captures");
      if (d.scale) {
        std::vector<std::string> sc = d.scale->CaptureNames();
        std::sort(sc.begin(), sc.end());
        if (sc != fc) return r.Error(n["scale"], where + ".scale", "scale and from must use the same captures");
      }
      for (size_t j : spec.derived_index.OverlapCandidates(d.target)) {
        const Derived& other = spec.derived[j];
        if (other.target.Overlaps(d.target)) {
          return r.Error(n["target"], where + ".target", absl::StrCat("overlaps derived target '", other.target.text(),
                                                                       "' (line ", other.line, ")"));
        }
      }
      spec.derived_index.Add(d.target);
      spec.derived.push_back(std::move(d));
    }
  }
  if (!sizes.refused().empty() && !options.allow_unresolved) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec.path, ": ", absl::StrJoin(sizes.refused(), ", "),
        sizes.refused().size() == 1 ? " comes" : " come",
        " from the model, and no model config was given: give the model's config.json (refitd: model_config "
        "or --model-config; refitctl: --model-config, or a checkpoint directory holding config.json), or state "
        "the size in the spec"));
  }
  // MIXED_PRECISION layers must agree with explicit rule formats.
  if (spec.checkpoint) {
    for (const auto& [module, format] : spec.checkpoint->layers) {
      absl::StatusOr<const Rule*> rule = spec.RuleFor(module + ".weight");
      if (!rule.ok()) return rule.status();
      const Rule* ru = *rule;
      if (ru->conversion == Conversion::kFormat && ru->format != format) {
        return absl::InvalidArgumentError(absl::StrCat(
            spec.path, ":", ru->line, ": rules: ", ru->Describe(), " quantizes '", module, ".weight' to ",
            formats::FormatName(ru->format), " but the checkpoint (", spec.checkpoint->source, ") lists it as ",
            formats::FormatName(format), "; use format: checkpoint"));
      }
    }
  }
  return spec;
}

absl::StatusOr<ModelSpec> ForRank(const ModelSpec& spec, int tp_rank) {
  if (spec.tp_size_from_engine) {
    return absl::InvalidArgumentError(absl::StrCat("tp_rank ", tp_rank, ": the tensor_parallel.size of ", spec.path,
                                                   " is the engine's; give it (WithEngineSize) first"));
  }
  if (tp_rank < 0 || tp_rank >= spec.tp_size) {
    return absl::InvalidArgumentError(absl::StrCat("tp_rank ", tp_rank, " is outside tensor_parallel.size ",
                                                   spec.tp_size, " of ", spec.path));
  }
  ModelSpec out = spec;
  out.tp_rank = tp_rank;
  out.ep_rank = spec.ep_size > 1 ? tp_rank : 0;
  for (Rule& rule : out.rules) {
    if (rule.shard) rule.shard->rank = tp_rank;
  }
  return out;
}

std::string TensorParallelText(const ModelSpec& spec) {
  std::string out = spec.tp_size_from_engine ? "engine" : absl::StrCat(spec.tp_size);
  if (spec.tp_rank_given) absl::StrAppend(&out, ", rank ", spec.tp_rank);
  if (spec.ep_size_from_engine) {
    absl::StrAppend(&out, ", expert_parallel engine");
  } else if (spec.ep_size > 1) {
    absl::StrAppend(&out, ", expert_parallel ", spec.ep_size);
  }
  return out;
}

absl::StatusOr<ModelSpec> WithEngineSize(const ModelSpec& spec, int tp_size) {
  if (!spec.tp_size_from_engine) {
    if (tp_size != spec.tp_size) {
      return absl::InvalidArgumentError(absl::StrCat("tp_size: the engine has tensor-parallel size ", tp_size,
                                                     ", the spec's tensor_parallel.size is ", spec.tp_size));
    }
    return spec;
  }
  if (tp_size < 1 || tp_size > kMaxEngineRanks) {
    return absl::InvalidArgumentError(absl::StrCat("tp_size: ", tp_size, " is outside 1..", kMaxEngineRanks,
                                                   " (tensor_parallel.size: engine in ", spec.path, ")"));
  }
  ModelSpec out = spec;
  out.tp_size_from_engine = false;
  out.ep_size_from_engine = false;
  out.tp_size = tp_size;
  out.tp_rank = 0;
  out.ep_size = spec.ep_size_from_engine ? tp_size : spec.ep_size;
  out.ep_rank = 0;
  for (Rule& rule : out.rules) {
    if (rule.shard_dim && tp_size > 1) rule.shard = Shard{*rule.shard_dim, tp_size, 0};
    if (rule.stack && out.ep_size > 1 && rule.stack->count > 0 && rule.stack->count % out.ep_size != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("ep_size: ", rule.stack->count, " experts of ", rule.Describe(), " in ", spec.path,
                       " do not split into the engine's expert-parallel size ", out.ep_size, " equal parts"));
    }
  }
  return out;
}

absl::StatusOr<ModelSpec> LoadModelSpecFile(const std::string& path, const LoadOptions& options) {
  REFIT_ASSIGN_OR_RETURN(std::string text, ReadBoundedFile(path, kMaxModelSpecFileBytes, "model spec"));
  return ParseModelSpec(text, path, std::filesystem::path(path).parent_path().string(), options);
}

}  // namespace refit::spec
