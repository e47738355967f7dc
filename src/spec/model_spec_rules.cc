// A spec's `rules:`: each rule's keys, its cross-field checks (captures, targets, formats and
// layout steps against the checkpoint), and its overlaps with the rules before it.
#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "formats/format_info.h"
#include "spec/model_spec.h"
#include "spec/model_spec_internal.h"
#include "yaml-cpp/yaml.h"

namespace refit::spec {
namespace internal {
namespace {

bool Contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

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
                       absl::StrCat("{", c,
                                    "} of the match pattern is missing, so different tensors would land in one "
                                    "parameter; fuse or stack them, or use it in the target"));
      }
    }
  }
  if (rule.never && (rule.target || rule.fuse || rule.stack || rule.shard || !rule.layout.empty())) {
    return r.Error(n, where,
                   "a 'refit: never' rule keeps the engine's value and takes no target/fuse/stack/shard/layout");
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
        return r.Error(
            n["layout"], where + ".layout",
            absl::StrCat("step on '", on.empty() ? "data" : on, "' (line ", s.line,
                         "): this rule's format emits no such tensor (it emits: ",
                         absl::StrJoin(suffixes, ", ",
                                       [](std::string* o, const std::string& x) { o->append(x.empty() ? "data" : x); }),
                         ")"));
      }
    }
    // A layout op's precondition, not a format switch: pack_ue8m0 packs F32 power-of-two scales,
    // which of the formats only this one emits (formats/layout.h).
    if (s.op == LayoutOp::kPackUe8m0 && rule.conversion == Conversion::kFormat &&
        rule.format != formats::Format::kFp8Block128Ue8m0) {
      return r.Error(
          n["layout"], where + ".layout",
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

absl::Status ParseRules(const Reader& r, const YAML::Node& rules, bool tensor_parallel_given, Sizes& sizes,
                        ModelSpec& spec) {
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
      REFIT_ASSIGN_OR_RETURN(
          stack.count, sizes.Get(s, "count", where + ".stack.count", ExpertsOf, kExpertKeys, Sizes::Need::kAtLoad));
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
        if (!tensor_parallel_given) {
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
        return r.Error(
            n["match"], where + ".match",
            absl::StrCat("'", rule.match.text(), "' overlaps ", other.Describe(), ": some tensor name matches both"));
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
  return absl::OkStatus();
}

}  // namespace internal

std::string Rule::Describe() const { return absl::StrCat("rule '", match.text(), "' (line ", line, ")"); }

int64_t Rule::Slots() const {
  return (fuse ? static_cast<int64_t>(fuse->order.size()) : 1) * (stack ? stack->count : 1);
}

}  // namespace refit::spec
