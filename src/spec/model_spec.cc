#include "spec/model_spec.h"

#include <fstream>
#include <set>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "yaml-cpp/yaml.h"

namespace refit::spec {
namespace {

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
    } else {
      absl::StatusOr<formats::Format> f = formats::ParseFormat(name);
      if (!f.ok()) return Error(node, where, absl::StrCat("unknown format '", name, "'"));
      rule.conversion = Conversion::kFormat;
      rule.format = *f;
    }
    return absl::OkStatus();
  }

  absl::Status Options(const YAML::Node& map, std::string_view where, formats::QuantizeOptions& options) const {
    if (map["fp32_input"]) {
      REFIT_ASSIGN_OR_RETURN(std::string v, String(map["fp32_input"], where));
      if (v == "exact") {
        options.fp32_input = formats::Fp32InputPolicy::kExact;
      } else if (v == "round_to_bf16") {
        options.fp32_input = formats::Fp32InputPolicy::kRoundToBf16;
      } else {
        return Error(map["fp32_input"], where, "fp32_input must be exact or round_to_bf16");
      }
    }
    if (map["nonfinite"]) {
      REFIT_ASSIGN_OR_RETURN(std::string v, String(map["nonfinite"], where));
      if (v == "reject") {
        options.nonfinite = formats::NonfinitePolicy::kReject;
      } else if (v == "propagate") {
        options.nonfinite = formats::NonfinitePolicy::kPropagate;
      } else {
        return Error(map["nonfinite"], where, "nonfinite must be reject or propagate");
      }
    }
    return absl::OkStatus();
  }

 private:
  std::string path_;
};

}  // namespace

std::string Rule::Describe() const { return absl::StrCat("rule '", match.text(), "' (line ", line, ")"); }

absl::StatusOr<const Rule*> ModelSpec::RuleFor(std::string_view name) const {
  const Rule* found = nullptr;
  for (const Rule& r : rules) {
    if (!r.match.Match(name)) continue;
    if (found != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", std::string(name), "' matches both ",
                                                     found->Describe(), " and ", r.Describe(), " of ", path));
    }
    found = &r;
  }
  return found != nullptr ? found : &defaults;
}

std::optional<std::pair<const Derived*, Captures>> ModelSpec::DerivedFor(std::string_view engine_param) const {
  for (const Derived& d : derived) {
    if (auto caps = d.target.Match(engine_param)) return std::make_pair(&d, *caps);
  }
  return std::nullopt;
}

absl::StatusOr<ModelSpec> ParseModelSpec(std::string_view yaml, std::string_view path) {
  Reader r{std::string(path)};
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(path), ":", e.mark.line + 1, ": YAML: ", e.msg));
  }
  ModelSpec spec;
  spec.path = std::string(path);
  REFIT_RETURN_IF_ERROR(r.CheckKeys(root, "spec", {"model", "defaults", "rules", "groups", "derived"}));
  if (!root["model"]) return r.Error(root, "spec", "missing required key 'model'");
  REFIT_ASSIGN_OR_RETURN(spec.model, r.String(root["model"], "model"));
  spec.defaults.match = *NamePattern::Parse("**");
  if (const YAML::Node d = root["defaults"]) {
    REFIT_RETURN_IF_ERROR(r.CheckKeys(d, "defaults", {"format", "fp32_input", "nonfinite", "partial"}));
    if (d["format"]) REFIT_RETURN_IF_ERROR(r.Conversion(d["format"], "defaults.format", spec.defaults));
    if (d["partial"]) {
      REFIT_ASSIGN_OR_RETURN(spec.defaults.partial, r.Bool(d["partial"], "defaults.partial"));
    }
    REFIT_RETURN_IF_ERROR(r.Options(d, "defaults", spec.options));
  }
  if (const YAML::Node rules = root["rules"]) {
    if (!rules.IsSequence()) return r.Error(rules, "rules", "expected a list");
    for (size_t i = 0; i < rules.size(); ++i) {
      const YAML::Node n = rules[i];
      std::string where = absl::StrCat("rules[", i, "]");
      REFIT_RETURN_IF_ERROR(r.CheckKeys(n, where, {"match", "format", "refit", "partial"}));
      if (!n["match"]) return r.Error(n, where, "missing 'match'");
      Rule rule;
      rule.line = n.Mark().line + 1;
      REFIT_ASSIGN_OR_RETURN(rule.match, r.Pattern(n["match"], where + ".match"));
      if (n["format"]) REFIT_RETURN_IF_ERROR(r.Conversion(n["format"], where + ".format", rule));
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
      for (const Rule& other : spec.rules) {
        if (other.match.text() == rule.match.text()) {
          return r.Error(n, where, absl::StrCat("duplicates ", other.Describe()));
        }
      }
      spec.rules.push_back(std::move(rule));
    }
  }
  if (const YAML::Node groups = root["groups"]) {
    if (!groups.IsSequence()) return r.Error(groups, "groups", "expected a list");
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
    for (size_t i = 0; i < derived.size(); ++i) {
      const YAML::Node n = derived[i];
      std::string where = absl::StrCat("derived[", i, "]");
      REFIT_RETURN_IF_ERROR(r.CheckKeys(n, where, {"target", "from", "op"}));
      if (!n["target"] || !n["from"] || !n["op"]) return r.Error(n, where, "needs 'target', 'from' and 'op'");
      Derived d;
      d.line = n.Mark().line + 1;
      REFIT_ASSIGN_OR_RETURN(d.target, r.Pattern(n["target"], where + ".target"));
      REFIT_ASSIGN_OR_RETURN(d.from, r.Pattern(n["from"], where + ".from"));
      REFIT_ASSIGN_OR_RETURN(std::string op, r.String(n["op"], where + ".op"));
      if (op != "add_one") return r.Error(n["op"], where + ".op", "unknown op (supported: add_one)");
      spec.derived.push_back(std::move(d));
    }
  }
  return spec;
}

absl::StatusOr<ModelSpec> LoadModelSpecFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read model spec '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseModelSpec(ss.str(), path);
}

}  // namespace refit::spec
