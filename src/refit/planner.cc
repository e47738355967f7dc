#include "refit/planner.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace refit {
namespace {

bool IsCastTarget(DType t) { return t == DType::kBF16 || t == DType::kF16 || t == DType::kF32; }

formats::Format CastFormat(DType t) {
  switch (t) {
    case DType::kF16:
      return formats::Format::kFp16;
    case DType::kF32:
      return formats::Format::kFp32;
    default:
      return formats::Format::kBf16;
  }
}

std::string Describe(DType t, const Shape& s) { return absl::StrCat(DTypeName(t), ShapeString(s)); }

}  // namespace

absl::StatusOr<Planner> Planner::Create(const spec::ModelSpec& spec, std::vector<storage::ParamInfo> params) {
  Planner p;
  p.spec_ = &spec;
  p.params_ = std::move(params);
  for (size_t i = 0; i < p.params_.size(); ++i) {
    if (!p.by_name_.emplace(p.params_[i].name, i).second) {
      return absl::InvalidArgumentError(absl::StrCat("engine registered parameter '", p.params_[i].name, "' twice"));
    }
  }
  for (size_t i = 0; i < p.params_.size(); ++i) {
    const std::string& name = p.params_[i].name;
    if (auto d = spec.DerivedFor(name)) {
      REFIT_ASSIGN_OR_RETURN(std::string from, d->first->from.Expand(d->second));
      int64_t fi = p.IndexOf(from);
      if (fi < 0) {
        return absl::InvalidArgumentError(absl::StrCat("derived parameter '", name, "' (", spec.path, ":", d->first->line,
                                                       ") reads '", from, "', which the engine did not register"));
      }
      if (p.params_[fi].shape != p.params_[i].shape) {
        return absl::InvalidArgumentError(absl::StrCat("derived parameter '", name, "' has shape ",
                                                       ShapeString(p.params_[i].shape), " but its source '", from,
                                                       "' has ", ShapeString(p.params_[fi].shape)));
      }
      p.derived_.push_back({i, static_cast<size_t>(fi), d->first->op});
      continue;
    }
    REFIT_ASSIGN_OR_RETURN(const spec::Rule* rule, spec.RuleFor(name));
    if (rule->never) continue;
    p.expected_.push_back(i);
  }
  return p;
}

int64_t Planner::IndexOf(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : static_cast<int64_t>(it->second);
}

absl::StatusOr<TensorPlan> Planner::Plan(const std::string& name, DType dtype, const Shape& shape) const {
  REFIT_ASSIGN_OR_RETURN(const spec::Rule* rule, spec_->RuleFor(name));
  TensorPlan plan;
  plan.rule = rule;
  if (rule->never) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "': ", rule->Describe(), " says refits never carry it"));
  }
  auto same_name_param = [&]() -> absl::StatusOr<size_t> {
    int64_t i = IndexOf(name);
    if (i < 0) return absl::NotFoundError(absl::StrCat("tensor '", name, "': the engine has no parameter of this name"));
    return static_cast<size_t>(i);
  };
  switch (rule->conversion) {
    case spec::Conversion::kPassthrough: {
      REFIT_ASSIGN_OR_RETURN(size_t i, same_name_param());
      const storage::ParamInfo& e = params_[i];
      if (e.dtype != dtype || e.shape != shape) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': sent as ", Describe(dtype, shape),
                                                       ", engine parameter is ", Describe(e.dtype, e.shape)));
      }
      plan.kind = ConvertKind::kCopy;
      plan.targets.push_back({i, {"", dtype, shape, e.nbytes}});
      return plan;
    }
    case spec::Conversion::kAuto: {
      REFIT_ASSIGN_OR_RETURN(size_t i, same_name_param());
      const storage::ParamInfo& e = params_[i];
      if (e.shape != shape) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': sent with shape ", ShapeString(shape),
                                                       ", engine parameter has ", ShapeString(e.shape)));
      }
      if (e.dtype == dtype) {
        plan.kind = ConvertKind::kCopy;
      } else if (IsCastTarget(e.dtype) && (dtype == DType::kBF16 || dtype == DType::kF32)) {
        plan.kind = ConvertKind::kQuantize;
        plan.format = CastFormat(e.dtype);
      } else {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': sent as ", DTypeName(dtype),
                                                       ", engine parameter is ", DTypeName(e.dtype),
                                                       " and no rule says how to convert it"));
      }
      plan.targets.push_back({i, {"", e.dtype, shape, e.nbytes}});
      return plan;
    }
    case spec::Conversion::kFormat: {
      if (dtype != DType::kBF16 && dtype != DType::kF32) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", rule->Describe(), " quantizes to ",
                                                       formats::FormatName(rule->format),
                                                       ", which takes BF16 or F32 input, not ", DTypeName(dtype)));
      }
      absl::StatusOr<std::vector<formats::OutputSpec>> outs = formats::PlanOutputs(rule->format, dtype, shape);
      if (!outs.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", outs.status().message()));
      }
      plan.kind = ConvertKind::kQuantize;
      plan.format = rule->format;
      for (formats::OutputSpec& o : *outs) {
        std::string target = name + o.suffix;
        int64_t i = IndexOf(target);
        if (i < 0) {
          return absl::NotFoundError(absl::StrCat("tensor '", name, "': ", formats::FormatName(rule->format),
                                                  " produces '", target, "', which the engine did not register"));
        }
        const storage::ParamInfo& e = params_[i];
        if (e.dtype != o.dtype || e.shape != o.shape) {
          return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", formats::FormatName(rule->format),
                                                         " produces '", target, "' as ", Describe(o.dtype, o.shape),
                                                         ", engine parameter is ", Describe(e.dtype, e.shape)));
        }
        plan.targets.push_back({static_cast<size_t>(i), std::move(o)});
      }
      return plan;
    }
  }
  return absl::InternalError("unreachable");
}

}  // namespace refit
