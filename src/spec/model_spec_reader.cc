// The YAML readers of a model spec (errors as "file:line: key: message") and the sizes a spec
// may leave to the model (docs/config.md, "Sizes come from the model").
#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "formats/format_info.h"
#include "spec/model_spec_internal.h"
#include "yaml-cpp/yaml.h"

namespace refit::spec::internal {

absl::Status Reader::Error(const YAML::Node& node, std::string_view where, absl::string_view msg) const {
  int line = node.Mark().line >= 0 ? node.Mark().line + 1 : 0;
  return absl::InvalidArgumentError(absl::StrCat(path_, ":", line, ": ", std::string(where), ": ", msg));
}

absl::Status Reader::CheckKeys(const YAML::Node& map, std::string_view where,
                               const std::set<std::string>& allowed) const {
  if (!map.IsMap()) return Error(map, where, "expected a mapping");
  for (const auto& kv : map) {
    std::string key = kv.first.as<std::string>();
    if (!allowed.count(key)) {
      return Error(kv.first, where,
                   absl::StrCat("unknown key '", key, "' (allowed: ", absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Reader::String(const YAML::Node& node, std::string_view where) const {
  if (!node.IsScalar()) return Error(node, where, "expected a string");
  return node.as<std::string>();
}

absl::StatusOr<bool> Reader::Bool(const YAML::Node& node, std::string_view where) const {
  bool v = false;
  if (!node.IsScalar() || !YAML::convert<bool>::decode(node, v)) return Error(node, where, "expected true or false");
  return v;
}

absl::StatusOr<int64_t> Reader::Int(const YAML::Node& node, std::string_view where, int64_t min) const {
  int64_t v = 0;
  if (!node.IsScalar() || !YAML::convert<int64_t>::decode(node, v)) return Error(node, where, "expected an integer");
  if (v < min) return Error(node, where, absl::StrCat("must be at least ", min));
  return v;
}

absl::StatusOr<NamePattern> Reader::Pattern(const YAML::Node& node, std::string_view where) const {
  REFIT_ASSIGN_OR_RETURN(std::string text, String(node, where));
  absl::StatusOr<NamePattern> p = NamePattern::Parse(text);
  if (!p.ok()) return Error(node, where, p.status().message());
  return p;
}

absl::Status Reader::Conversion(const YAML::Node& node, std::string_view where, Rule& rule) const {
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

absl::Status Reader::Options(const YAML::Node& map, const std::string& where, formats::QuantizeOptions& options) const {
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

absl::StatusOr<int64_t> Sizes::Get(const YAML::Node& parent, const char* key, const std::string& where,
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
      return r_.Error(
          parent, where,
          absl::StrCat("not given, and the model config '", config->source(), "' has no ", std::string(keys)));
    }
    return 0;
  }
  if (need == Need::kOptional) return 0;
  std::string entry = absl::StrCat(where, " (line ", parent.Mark().line + 1, ")");
  if (need == Need::kAtLoad) refused_.push_back(entry);
  spec_.unresolved.push_back(std::move(entry));
  return 0;
}

absl::StatusOr<std::optional<ConfigSize>> ExpertsOf(const ModelConfig& c) { return c.Experts(); }
absl::StatusOr<std::optional<ConfigSize>> QueryGroupsOf(const ModelConfig& c) { return c.QueryGroups(); }
absl::StatusOr<std::optional<ConfigSize>> HeadDimOf(const ModelConfig& c) { return c.HeadDim(); }
// The config's value of `key`.
Sizes::Lookup Key(const char* key) {
  return [key](const ModelConfig& c) { return c.First({key}); };
}

}  // namespace refit::spec::internal
