// ParseModelSpec: the top-level sections (model, checkpoint, tensor and expert parallelism,
// source, defaults) and the spec's assembly from the sections of the other model_spec_*.cc files
// (model_spec_internal.h); a spec's lookups (RuleFor, DerivedFor...) and its per-rank and
// per-engine copies.
#include "spec/model_spec.h"

#include <filesystem>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/bounded_file.h"
#include "common/status_macros.h"
#include "spec/model_spec_internal.h"
#include "yaml-cpp/yaml.h"

namespace refit::spec {
namespace {

using internal::ExpertsOf;
using internal::HeadDimOf;
using internal::kExpertKeys;
using internal::Key;
using internal::QueryGroupsOf;
using internal::Reader;
using internal::Sizes;

// `size: engine`: the size is the engine's, from its ranks' registrations.
bool IsEngine(const YAML::Node& node) { return node.IsScalar() && node.Scalar() == "engine"; }

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
    REFIT_RETURN_IF_ERROR(internal::ParseRules(r, rules, static_cast<bool>(root["tensor_parallel"]), sizes, spec));
  }
  if (const YAML::Node groups = root["groups"]) {
    REFIT_RETURN_IF_ERROR(internal::ParseGroups(r, groups, spec));
  }
  if (const YAML::Node derived = root["derived"]) {
    REFIT_RETURN_IF_ERROR(internal::ParseDerived(r, derived, sizes, spec));
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
