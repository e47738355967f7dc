#include "refit/ledger.h"

#include <algorithm>
#include <set>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "refit/param_build.h"

namespace refit {
namespace {

// Scale tensors that belong to the weight named by stripping the suffix.
constexpr std::string_view kScaleSuffixes[] = {"_scale_inv", "_scale_2", "_scale", "_scales", "_blocks"};

constexpr size_t kMaxListed = 64;
constexpr size_t kMaxSlotsListed = 8;

}  // namespace

Ledger::Ledger(const Planner& planner) : planner_(planner) {
  slots_.resize(planner.params().size());
  for (size_t i = 0; i < slots_.size(); ++i) slots_[i].resize(planner.source(i).slots.size());
}

absl::StatusOr<std::shared_ptr<const TensorPlan>> Ledger::Arrive(const TensorDesc& desc) {
  absl::MutexLock lock(&mu_);
  ++changes_;
  Arrival& arrival = arrivals_[desc.name];
  ++arrival.count;
  if (arrival.count > 1) {
    return absl::AlreadyExistsError(absl::StrCat("tensor '", desc.name, "' arrived ", arrival.count, " times"));
  }
  absl::StatusOr<std::shared_ptr<const TensorPlan>> plan = planner_.SharedPlan(desc.name, desc.dtype, desc.shape);
  if (!plan.ok()) {
    errors_.push_back(std::string(plan.status().message()));
    return plan;
  }
  arrival.plan = *plan;
  for (const Target& t : (*plan)->targets) {
    Slot& s = slots_[t.engine_index][static_cast<size_t>(t.slot)];
    ++s.count;
    s.out = &t.spec;
    s.plan = *plan;
  }
  return plan;
}

std::vector<const std::string*> Ledger::SortedNames() const {
  std::vector<const std::string*> names;
  names.reserve(arrivals_.size());
  for (const auto& [name, arrival] : arrivals_) names.push_back(&name);
  std::sort(names.begin(), names.end(), [](const std::string* a, const std::string* b) { return *a < *b; });
  return names;
}

void Ledger::Fail(const std::string& name, const absl::Status& error) {
  absl::MutexLock lock(&mu_);
  ++changes_;
  std::string msg(error.message());
  if (msg.find(name) == std::string::npos) msg = absl::StrCat("tensor '", name, "': ", msg);
  errors_.push_back(std::move(msg));
}

absl::Status Ledger::Check(bool partial) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> problems = errors_;
  std::vector<const std::string*> duplicates;
  for (const auto& [name, arrival] : arrivals_) {
    if (arrival.count > 1) duplicates.push_back(&name);
  }
  std::sort(duplicates.begin(), duplicates.end(), [](const std::string* a, const std::string* b) { return *a < *b; });
  for (const std::string* name : duplicates) {
    problems.push_back(absl::StrCat("duplicate: tensor '", *name, "' arrived ", arrivals_.find(*name)->second.count,
                                    " times"));
  }
  // Arrived names in name order, for the checks below that list them (partial refits, groups).
  std::vector<const std::string*> names;
  if (partial || !planner_.spec().groups.empty()) names = SortedNames();
  const auto& params = planner_.params();
  std::vector<bool> produced(params.size(), false), complete(params.size(), false);
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamSource& src = planner_.source(i);
    std::vector<std::string> absent;
    bool any = false;
    for (size_t s = 0; s < slots_[i].size(); ++s) {
      const int c = slots_[i][s].count;
      if (c > 1) {
        problems.push_back(absl::StrCat("duplicate: engine parameter '", params[i].name, "' slot from '",
                                        src.slots[s], "' produced ", c, " times"));
      }
      if (c > 0) {
        any = true;
      } else {
        absent.push_back(src.slots[s]);
      }
    }
    produced[i] = any;
    complete[i] = any && absent.empty();
    if (any && !absent.empty()) {
      size_t n = absent.size();
      if (absent.size() > kMaxSlotsListed) absent.resize(kMaxSlotsListed);
      problems.push_back(absl::StrCat("incomplete: engine parameter '", params[i].name, "' lacks '",
                                      absl::StrJoin(absent, "', '"), "'",
                                      n > kMaxSlotsListed ? absl::StrCat(" and ", n - kMaxSlotsListed, " more") : ""));
    }
  }
  // Assembled dtype and shape must be the registered ones.
  auto data_rows = [&](size_t i) -> int64_t {
    const ParamSource& src = planner_.source(i);
    if (src.data_index < 0 || !complete[static_cast<size_t>(src.data_index)]) return -1;
    std::vector<Shape> shapes;
    for (const Slot& s : slots_[static_cast<size_t>(src.data_index)]) shapes.push_back(s.out->shape);
    absl::StatusOr<Shape> a = AssembledShape(*src.rule, shapes);
    return a.ok() && a->size() >= 2 ? (*a)[a->size() - 2] : -1;
  };
  // The plans a parameter's check depends on: its slots', then its data parameter's (when complete).
  auto for_each_plan = [&](size_t i, const auto& f) {
    for (const Slot& s : slots_[i]) f(s.plan);
    const int64_t d = planner_.source(i).data_index;
    if (d >= 0 && complete[static_cast<size_t>(d)]) {
      for (const Slot& s : slots_[static_cast<size_t>(d)]) f(s.plan);
    }
  };
  absl::InlinedVector<const TensorPlan*, 8> key;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!complete[i]) continue;
    key.clear();
    for_each_plan(i, [&](const std::shared_ptr<const TensorPlan>& p) { key.push_back(p.get()); });
    if (planner_.ShapeChecked(i, key)) continue;  // the same plans checked out before
    const ParamSource& src = planner_.source(i);
    std::vector<Shape> shapes;
    for (const Slot& s : slots_[i]) shapes.push_back(s.out->shape);
    absl::StatusOr<Shape> assembled = AssembledShape(*src.rule, shapes);
    if (!assembled.ok()) {
      problems.push_back(absl::StrCat("engine parameter '", params[i].name, "': ", assembled.status().message()));
      continue;
    }
    absl::StatusOr<std::pair<DType, Shape>> laid =
        LayoutShape(*src.rule, src.suffix, slots_[i][0].out->dtype, *assembled, data_rows(i));
    if (!laid.ok()) {
      problems.push_back(absl::StrCat("engine parameter '", params[i].name, "': ", laid.status().message()));
    } else if (laid->first != params[i].dtype || laid->second != params[i].shape) {
      problems.push_back(absl::StrCat("mismatch: engine parameter '", params[i].name, "' would be ",
                                      DTypeName(laid->first), ShapeString(laid->second), ", registered as ",
                                      DTypeName(params[i].dtype), ShapeString(params[i].shape)));
    } else {
      std::vector<std::shared_ptr<const TensorPlan>> plans;
      plans.reserve(key.size());
      for_each_plan(i, [&](const std::shared_ptr<const TensorPlan>& p) { plans.push_back(p); });
      planner_.NoteShapeChecked(i, std::move(plans));
    }
  }
  if (!partial) {
    for (size_t i : planner_.expected()) {
      if (produced[i]) continue;
      const ParamSource& src = planner_.source(i);
      if (src.slots.size() == 1 && src.slots[0] == params[i].name) {
        problems.push_back(absl::StrCat("missing: '", params[i].name, "'"));
      } else {
        std::vector<std::string> from(src.slots.begin(), src.slots.begin() + std::min(src.slots.size(), kMaxSlotsListed));
        problems.push_back(absl::StrCat("missing: '", params[i].name, "' (from '", absl::StrJoin(from, "', '"), "'",
                                        src.slots.size() > kMaxSlotsListed ? ", ..." : "", ")"));
      }
    }
  } else {
    for (const std::string* name : names) {
      const std::shared_ptr<const TensorPlan>& plan = arrivals_.find(*name)->second.plan;
      if (plan != nullptr && !plan->rule->partial) {
        problems.push_back(absl::StrCat("partial refit: tensor '", *name, "' (", plan->rule->Describe(),
                                        ") may not be refit alone"));
      }
    }
    // Tensors sent pre-quantized: every weight with all of its scales, every scale with its weight.
    std::set<std::string> reported;
    for (size_t i = 0; i < params.size(); ++i) {
      if (!produced[i]) continue;
      std::string base = params[i].name;
      for (std::string_view suffix : kScaleSuffixes) {
        if (base.size() > suffix.size() && base.compare(base.size() - suffix.size(), suffix.size(), suffix) == 0) {
          int64_t b = planner_.IndexOf(base.substr(0, base.size() - suffix.size()));
          if (b >= 0) base = params[b].name;
          break;
        }
      }
      std::vector<std::string> family = {base};
      for (std::string_view suffix : kScaleSuffixes) family.push_back(base + std::string(suffix));
      for (const std::string& member : family) {
        int64_t m = planner_.IndexOf(member);
        if (m >= 0 && planner_.source(m).kind == ParamSource::Kind::kBuilt && !produced[m] &&
            reported.insert(member).second) {
          problems.push_back(absl::StrCat("incomplete weight: '", params[i].name, "' arrived without '", member, "'"));
        }
      }
    }
  }
  // Explicit groups: any member present means every member present. Checked once for the same
  // tensors (Planner::GroupsChecked: the arrivals' plans, in name order).
  absl::InlinedVector<const TensorPlan*, 8> arrived_plans;
  bool plans_known = !planner_.spec().groups.empty();
  for (const std::string* name : names) {
    if (!plans_known) break;
    const TensorPlan* plan = arrivals_.find(*name)->second.plan.get();
    plans_known = plan != nullptr;
    arrived_plans.push_back(plan);
  }
  const bool groups_checked = plans_known && planner_.GroupsChecked(arrived_plans);
  const size_t problems_before_groups = problems.size();
  for (const spec::Group& g : planner_.spec().groups) {
    if (groups_checked) break;
    std::set<std::string> seen_instances;
    for (const std::string* arrived : names) {
      const std::string& name = *arrived;
      for (const spec::NamePattern& member : g.members) {
        std::optional<spec::Captures> caps = member.Match(name);
        if (!caps) continue;
        std::vector<std::string> absent;
        std::string key;
        for (const spec::NamePattern& other : g.members) {
          absl::StatusOr<std::string> want = other.Expand(*caps);
          if (!want.ok()) continue;
          key += *want + ";";
          if (!arrivals_.count(*want)) absent.push_back(absl::StrCat("'", *want, "'"));
        }
        if (!absent.empty() && seen_instances.insert(key).second) {
          problems.push_back(absl::StrCat("incomplete group '", g.name, "': '", name, "' arrived without ",
                                          absl::StrJoin(absent, ", ")));
        }
      }
    }
  }
  if (plans_known && !groups_checked && problems.size() == problems_before_groups) {
    std::vector<std::shared_ptr<const TensorPlan>> plans;
    plans.reserve(names.size());
    for (const std::string* name : names) plans.push_back(arrivals_.find(*name)->second.plan);
    planner_.NoteGroupsChecked(std::move(plans));
  }
  if (problems.empty()) return absl::OkStatus();
  size_t total = problems.size();
  if (problems.size() > kMaxListed) problems.resize(kMaxListed);
  std::string msg = absl::StrCat("refit refused (", total, " problem", total == 1 ? "" : "s", "): ",
                                 absl::StrJoin(problems, "; "));
  if (total > kMaxListed) absl::StrAppend(&msg, "; ... and ", total - kMaxListed, " more");
  return absl::FailedPreconditionError(msg);
}

uint64_t Ledger::changes() const {
  absl::MutexLock lock(&mu_);
  return changes_;
}

size_t Ledger::tensors() const {
  absl::MutexLock lock(&mu_);
  return arrivals_.size();
}

std::vector<size_t> Ledger::Produced() const {
  absl::MutexLock lock(&mu_);
  std::vector<size_t> out;
  for (size_t i = 0; i < slots_.size(); ++i) {
    bool any = false;
    for (const Slot& s : slots_[i]) any = any || s.count > 0;
    if (any) out.push_back(i);
  }
  return out;
}

}  // namespace refit
