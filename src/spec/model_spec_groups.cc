// A spec's `groups:` (tensors that must arrive together) and `derived:` (engine parameters
// recomputed at every commit from another's staged value).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "spec/model_spec.h"
#include "spec/model_spec_internal.h"
#include "yaml-cpp/yaml.h"

namespace refit::spec::internal {

absl::Status ParseGroups(const Reader& r, const YAML::Node& groups, ModelSpec& spec) {
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
  return absl::OkStatus();
}

absl::Status ParseDerived(const Reader& r, const YAML::Node& derived, Sizes& sizes, ModelSpec& spec) {
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
          return r.Error(n["layout"], where + ".layout", "pack_ue8m0 needs its data tensor's rows: a rule's step only");
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
        return r.Error(n["target"], where + ".target",
                       absl::StrCat("overlaps derived target '", other.target.text(), "' (line ", other.line, ")"));
      }
    }
    spec.derived_index.Add(d.target);
    spec.derived.push_back(std::move(d));
  }
  return absl::OkStatus();
}

}  // namespace refit::spec::internal
