#include "refit/planner.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "formats/format_info.h"
#include "refit/derived_build.h"

namespace refit {
namespace {

// The dtypes a cast format produces (bf16, fp16, fp32).
bool IsCastTarget(DType t) { return formats::CastFormatFor(t).has_value(); }

// REQUIRES: IsCastTarget(t).
formats::Format CastFormat(DType t) { return *formats::CastFormatFor(t); }

std::string Describe(DType t, const Shape& s) { return absl::StrCat(DTypeName(t), ShapeString(s)); }

// Whether `rule` can emit a checkpoint tensor with `suffix`.
bool Emits(const spec::ModelSpec& spec, const spec::Rule& rule, std::string_view suffix) {
  if (suffix.empty()) return true;
  switch (rule.conversion) {
    case spec::Conversion::kFormat: {
      for (const formats::OutputRole& o : formats::Info(rule.format).Outputs()) {
        if (o.suffix == suffix) return true;
      }
      return false;
    }
    case spec::Conversion::kCheckpoint:
      return true;
    default:
      return false;
  }
}

bool HasLayout(const spec::Rule& rule, std::string_view suffix) {
  for (const spec::LayoutStep& s : rule.layout) {
    if (s.AppliesTo(suffix)) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<Planner> Planner::Create(const spec::ModelSpec& spec, std::vector<storage::ParamInfo> params) {
  std::vector<RankParams> one(1);
  one[0].spec = std::shared_ptr<const spec::ModelSpec>(std::shared_ptr<void>(), &spec);  // not owned
  one[0].params = std::move(params);
  return CreateRanks(spec, std::move(one));
}

absl::StatusOr<Planner> Planner::CreateRanks(const spec::ModelSpec& node_spec, std::vector<RankParams> ranks) {
  Planner p;
  p.spec_ = &node_spec;
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (storage::ParamInfo& info : ranks[r].params) {
      info.name = Qualified(ranks[r].label, info.name);
      p.params_.push_back(std::move(info));
      p.rank_of_.push_back(r);
    }
    ranks[r].params.clear();
  }
  p.ranks_ = std::move(ranks);
  p.sources_.resize(p.params_.size());
  for (size_t i = 0; i < p.params_.size(); ++i) {
    if (!p.by_name_.emplace(p.params_[i].name, i).second) {
      return absl::InvalidArgumentError(absl::StrCat("engine registered parameter '", p.params_[i].name, "' twice"));
    }
  }
  const std::vector<std::string_view> suffixes = formats::AllOutputSuffixes();
  for (size_t i = 0; i < p.params_.size(); ++i) {
    const RankParams& rank = p.ranks_[p.rank_of_[i]];
    const spec::ModelSpec& spec = *rank.spec;
    const std::string name = p.params_[i].name.substr(rank.label.empty() ? 0 : rank.label.size() + 1);
    ParamSource& src = p.sources_[i];
    if (auto d = spec.DerivedFor(name)) {
      REFIT_ASSIGN_OR_RETURN(std::string from, d->first->from.Expand(d->second));
      from = Qualified(rank.label, from);
      int64_t fi = p.IndexOf(from);
      if (fi < 0) {
        return absl::InvalidArgumentError(absl::StrCat("derived parameter '", p.params_[i].name, "' (", spec.path, ":",
                                                       d->first->line, ") reads '", from,
                                                       "', which the engine did not register"));
      }
      int64_t si = -1;
      std::optional<DerivedSource> scale;
      if (d->first->scale) {
        REFIT_ASSIGN_OR_RETURN(std::string scale_name, d->first->scale->Expand(d->second));
        scale_name = Qualified(rank.label, scale_name);
        si = p.IndexOf(scale_name);
        if (si < 0) {
          return absl::InvalidArgumentError(absl::StrCat("derived parameter '", p.params_[i].name, "' (", spec.path,
                                                         ":", d->first->line, ") reads scale '", scale_name,
                                                         "', which the engine did not register"));
        }
        scale = DerivedSource{p.params_[si].dtype, p.params_[si].shape};
      }
      if (d->first->op == spec::DerivedOp::kAddOne) {
        if (p.params_[fi].shape != p.params_[i].shape || p.params_[fi].dtype != p.params_[i].dtype) {
          return absl::InvalidArgumentError(absl::StrCat(
              "derived parameter '", p.params_[i].name, "' is ", Describe(p.params_[i].dtype, p.params_[i].shape),
              " but its source '", from, "' is ", Describe(p.params_[fi].dtype, p.params_[fi].shape)));
        }
      } else {
        // The op reads the source as staged (a checkpoint-layout parameter: its registered
        // shape is the staged one).
        REFIT_ASSIGN_OR_RETURN(
            auto want, DerivedShape(*d->first, p.params_[i].name, {p.params_[fi].dtype, p.params_[fi].shape}, scale));
        if (want.first != p.params_[i].dtype || want.second != p.params_[i].shape) {
          return absl::InvalidArgumentError(absl::StrCat(
              "derived parameter '", p.params_[i].name, "' is registered as ",
              Describe(p.params_[i].dtype, p.params_[i].shape), "; from '", from, "' (",
              Describe(p.params_[fi].dtype, p.params_[fi].shape), ") it would be ", Describe(want.first, want.second)));
        }
      }
      src.kind = ParamSource::Kind::kDerived;
      p.derived_.push_back({i, static_cast<size_t>(fi), d->first->op, d->first, si});
      continue;
    }
    if (const spec::Rule* never = spec.NeverRuleFor(name)) {
      src.kind = ParamSource::Kind::kKept;
      src.rule = never;
      continue;
    }
    const spec::Rule* rule = nullptr;
    std::string base;
    spec::Captures caps;
    for (std::string_view suffix : suffixes) {
      if (name.size() < suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
      std::string b = name.substr(0, name.size() - suffix.size());
      if (b.empty()) continue;
      auto try_rule = [&](const spec::Rule& r) {
        if (r.never || !Emits(spec, r, suffix)) return false;
        const spec::NamePattern& pattern = r.target ? *r.target : r.match;
        std::optional<spec::Captures> c = pattern.Match(b);
        if (!c) return false;
        rule = &r;
        base = b;
        caps = *c;
        src.suffix = std::string(suffix);
        return true;
      };
      for (const spec::Rule* r : spec.TargetCandidates(b)) {
        if (try_rule(*r)) break;
      }
      if (rule == nullptr) try_rule(spec.defaults);
      if (rule != nullptr) break;
    }
    if (rule == nullptr) {
      rule = &spec.defaults;
      base = name;
      src.suffix = "";
    }
    src.kind = ParamSource::Kind::kBuilt;
    src.rule = rule;
    // A rank's part that differs from the other ranks' (its TP shard) is staged under its own key.
    const std::string& key_label = rule->shard && rule->shard->size > 1 ? rank.label : std::string();
    if (rule->target) {
      const int64_t first = FirstSlot(spec, *rule);
      for (int64_t s = 0; s < RankSlots(spec, *rule); ++s) {
        REFIT_ASSIGN_OR_RETURN(std::string key, SourceName(*rule, caps, first + s, src.suffix));
        src.slots.push_back(Qualified(key_label, key));
      }
    } else {
      src.slots.push_back(Qualified(key_label, name));
    }
    p.memo_limit_ += src.slots.size();
    p.expected_.push_back(i);
  }
  // Scales find their data tensor (pack_ue8m0 needs its rows).
  for (size_t i = 0; i < p.params_.size(); ++i) {
    ParamSource& src = p.sources_[i];
    if (src.kind != ParamSource::Kind::kBuilt || src.suffix.empty()) continue;
    const std::string& name = p.params_[i].name;
    int64_t d = p.IndexOf(name.substr(0, name.size() - src.suffix.size()));
    if (d >= 0 && p.sources_[d].kind == ParamSource::Kind::kBuilt && p.sources_[d].rule == src.rule) src.data_index = d;
  }
  // A derived op reads its sources as staged: each must be built from trainer tensors with no
  // layout step of its own (its registered dtype and shape are then the staged ones).
  for (const DerivedTarget& d : p.derived_) {
    if (d.op == spec::DerivedOp::kAddOne) continue;
    for (int64_t s : {static_cast<int64_t>(d.from_index), d.scale_index}) {
      if (s < 0) continue;
      const ParamSource& src = p.sources_[static_cast<size_t>(s)];
      const bool laid_out = src.kind == ParamSource::Kind::kBuilt &&
                            std::any_of(src.rule->layout.begin(), src.rule->layout.end(),
                                        [&](const spec::LayoutStep& step) { return step.AppliesTo(src.suffix); });
      if (src.kind != ParamSource::Kind::kBuilt || laid_out) {
        return absl::InvalidArgumentError(absl::StrCat(
            "derived parameter '", p.params_[d.target_index].name, "' reads '", p.params_[static_cast<size_t>(s)].name,
            "', which is ", laid_out ? "laid out by its rule's layout steps" : "not built from trainer tensors",
            ": derive from the checkpoint-layout parameter"));
      }
    }
  }
  return p;
}

int64_t Planner::IndexOf(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : static_cast<int64_t>(it->second);
}

absl::StatusOr<TensorPlan> Planner::Plan(const std::string& name, DType dtype, const Shape& shape) const {
  REFIT_ASSIGN_OR_RETURN(std::shared_ptr<const TensorPlan> plan, SharedPlan(name, dtype, shape));
  return *plan;
}

absl::StatusOr<std::shared_ptr<const TensorPlan>> Planner::SharedPlan(const std::string& name, DType dtype,
                                                                      const Shape& shape) const {
  {
    absl::MutexLock lock(&memo_->mu);
    auto it = memo_->plans.find(name);
    if (it != memo_->plans.end() && it->second.dtype == dtype && it->second.shape == shape) return it->second.plan;
  }
  REFIT_ASSIGN_OR_RETURN(TensorPlan resolved, Resolved(name, dtype, shape));
  auto plan = std::make_shared<const TensorPlan>(std::move(resolved));
  absl::MutexLock lock(&memo_->mu);
  auto it = memo_->plans.find(name);
  if (it != memo_->plans.end()) {
    it->second = Memo::Entry{dtype, shape, plan};  // the latest dtype/shape this name arrived with
  } else if (memo_->plans.size() < memo_limit_) {
    memo_->plans.emplace(name, Memo::Entry{dtype, shape, plan});
  }
  return plan;
}

bool Planner::ShapeChecked(size_t index, absl::Span<const TensorPlan* const> plans) const {
  absl::MutexLock lock(&memo_->mu);
  if (index >= memo_->shape_checked.size()) return false;
  const std::vector<std::shared_ptr<const TensorPlan>>& noted = memo_->shape_checked[index];
  if (noted.size() != plans.size()) return false;
  for (size_t k = 0; k < plans.size(); ++k) {
    if (noted[k].get() != plans[k]) return false;
  }
  return true;
}

void Planner::NoteShapeChecked(size_t index, std::vector<std::shared_ptr<const TensorPlan>> plans) const {
  absl::MutexLock lock(&memo_->mu);
  if (memo_->shape_checked.size() < params_.size()) memo_->shape_checked.resize(params_.size());
  if (index < memo_->shape_checked.size()) memo_->shape_checked[index] = std::move(plans);
}

bool Planner::GroupsChecked(absl::Span<const TensorPlan* const> plans) const {
  absl::MutexLock lock(&memo_->mu);
  const std::vector<std::shared_ptr<const TensorPlan>>& noted = memo_->groups_checked;
  if (noted.empty() || noted.size() != plans.size()) return false;
  for (size_t k = 0; k < plans.size(); ++k) {
    if (noted[k].get() != plans[k]) return false;
  }
  return true;
}

void Planner::NoteGroupsChecked(std::vector<std::shared_ptr<const TensorPlan>> plans) const {
  absl::MutexLock lock(&memo_->mu);
  memo_->groups_checked = std::move(plans);
}

absl::StatusOr<TensorPlan> Planner::Resolved(const std::string& name, DType dtype, const Shape& shape) const {
  TensorPlan plan;
  bool first = true;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    absl::Status st = PlanRank(r, name, dtype, shape, plan, first);
    if (!st.ok()) {
      if (ranks_.size() == 1) return st;
      return absl::Status(st.code(), absl::StrCat("engine ", ranks_[r].label, ": ", st.message()));
    }
  }
  if (first) {
    return absl::NotFoundError(absl::StrCat("tensor '", name, "': no engine rank holds its expert"));
  }
  return plan;
}

absl::Status Planner::PlanRank(size_t rank_index, const std::string& name, DType dtype, const Shape& shape,
                               TensorPlan& plan, bool& first) const {
  const RankParams& rank = ranks_[rank_index];
  REFIT_ASSIGN_OR_RETURN(Resolution r, Resolve(*rank.spec, name, dtype, shape));
  if (r.rule->never) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': ", r.rule->Describe(), " says refits never carry it"));
  }
  if (r.elsewhere) return absl::OkStatus();  // another expert-parallel rank's expert
  const bool own_key = r.rule->shard && r.rule->shard->size > 1;
  if (first) {
    plan.rule = r.rule;
    plan.kind = r.kind;
    plan.format = r.format;
    plan.transpose = r.transpose;
    plan.input_shape = r.input_shape;
    plan.shard_dim = r.shard_dim;
    if (r.rule->shard) {
      plan.shard_parts = r.rule->shard->size;
      plan.shard_index = r.rule->shard->rank;
    }
    plan.amax_group = r.amax_group;
    plan.amax_group_key = r.amax_group_key;
  }
  for (size_t out = 0; out < r.outputs.size(); ++out) {
    ResolvedOutput& o = r.outputs[out];
    const std::string key = Qualified(own_key ? rank.label : std::string(), o.checkpoint_name);
    int64_t i = IndexOf(Qualified(rank.label, o.engine_name));
    if (i < 0) {
      if (o.engine_name == name) {
        return absl::NotFoundError(absl::StrCat("tensor '", name, "': the engine has no parameter of this name"));
      }
      return absl::NotFoundError(absl::StrCat("tensor '", name, "': ", r.rule->Describe(), " produces '",
                                              o.engine_name, "', which the engine did not register"));
    }
    const storage::ParamInfo& e = params_[i];
    const ParamSource& src = sources_[i];
    if (src.kind != ParamSource::Kind::kBuilt || src.rule != r.rule ||
        o.slot >= static_cast<int64_t>(src.slots.size()) || src.slots[o.slot] != key) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", name, "': lands in engine parameter '", o.engine_name, "', which ",
          src.kind == ParamSource::Kind::kDerived ? "is derived at commit"
          : src.kind == ParamSource::Kind::kKept  ? "refits never change"
                                                  : absl::StrCat("is produced by ", src.rule->Describe())));
    }
    DType staged = o.dtype;
    if (r.conversion == spec::Conversion::kAuto) {
      if (e.dtype != dtype) {
        if (!IsCastTarget(e.dtype) || (dtype != DType::kBF16 && dtype != DType::kF32)) {
          return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': sent as ", DTypeName(dtype),
                                                         ", engine parameter is ", DTypeName(e.dtype),
                                                         " and no rule says how to convert it"));
        }
        if (!first && (plan.kind != ConvertKind::kQuantize || plan.format != CastFormat(e.dtype))) {
          return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': engine parameter '", e.name, "' is ",
                                                         DTypeName(e.dtype), ", unlike the other ranks'"));
        }
        plan.kind = ConvertKind::kQuantize;
        plan.format = CastFormat(e.dtype);
        staged = e.dtype;
      }
    }
    REFIT_ASSIGN_OR_RETURN(uint64_t bytes, DenseBytes(staged, o.shape));
    const bool direct = src.slots.size() == 1 && !HasLayout(*r.rule, o.suffix);
    if (direct && (e.dtype != staged || e.shape != o.shape)) {
      const char* what = r.conversion == spec::Conversion::kPassthrough ? "sent as" : "becomes";
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", name, "': ", what, " '", o.engine_name, "' ", Describe(staged, o.shape),
          r.rule->shard ? " (this rank's part)" : "", ", engine parameter is ", Describe(e.dtype, e.shape)));
    }
    if (!direct && e.dtype != staged && !HasLayout(*r.rule, o.suffix)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': becomes ", DTypeName(staged), " in '",
                                                     o.engine_name, "', engine parameter is ", DTypeName(e.dtype)));
    }
    Target t{static_cast<size_t>(i), o.slot, key, formats::OutputSpec{o.suffix, staged, o.shape, bytes}, o.full_shape};
    t.output = out;
    t.shard_index = r.rule->shard ? r.rule->shard->rank : 0;
    plan.targets.push_back(std::move(t));
  }
  first = false;
  return absl::OkStatus();
}

}  // namespace refit
