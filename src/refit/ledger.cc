#include "refit/ledger.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace refit {
namespace {

// Scale tensors that belong to the weight named by stripping the suffix.
constexpr std::string_view kScaleSuffixes[] = {"_scale_inv", "_scale_2", "_scale", "_scales", "_blocks"};

constexpr size_t kMaxListed = 64;

}  // namespace

absl::StatusOr<TensorPlan> Ledger::Arrive(const TensorDesc& desc) {
  absl::MutexLock lock(&mu_);
  int& count = arrivals_[desc.name];
  ++count;
  if (count > 1) return absl::AlreadyExistsError(absl::StrCat("tensor '", desc.name, "' arrived ", count, " times"));
  absl::StatusOr<TensorPlan> plan = planner_.Plan(desc.name, desc.dtype, desc.shape);
  if (!plan.ok()) {
    errors_.push_back(std::string(plan.status().message()));
    return plan;
  }
  rules_[desc.name] = plan->rule;
  for (const Target& t : plan->targets) ++produced_[t.engine_index];
  return plan;
}

void Ledger::Fail(const std::string& name, const absl::Status& error) {
  absl::MutexLock lock(&mu_);
  std::string msg(error.message());
  if (msg.find(name) == std::string::npos) msg = absl::StrCat("tensor '", name, "': ", msg);
  errors_.push_back(std::move(msg));
}

absl::Status Ledger::Check(bool partial) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> problems = errors_;
  for (const auto& [name, count] : arrivals_) {
    if (count > 1) problems.push_back(absl::StrCat("duplicate: tensor '", name, "' arrived ", count, " times"));
  }
  const auto& params = planner_.params();
  for (size_t i = 0; i < produced_.size(); ++i) {
    if (produced_[i] > 1) {
      problems.push_back(absl::StrCat("duplicate: engine parameter '", params[i].name, "' produced ", produced_[i],
                                      " times"));
    }
  }
  if (!partial) {
    for (size_t i : planner_.expected()) {
      if (produced_[i] == 0) problems.push_back(absl::StrCat("missing: '", params[i].name, "'"));
    }
  } else {
    for (const auto& [name, rule] : rules_) {
      if (!rule->partial) {
        problems.push_back(absl::StrCat("partial refit: tensor '", name, "' (", rule->Describe(),
                                        ") may not be refit alone"));
      }
    }
    // Every weight with all of its scales, every scale with its weight.
    std::set<std::string> reported;
    for (size_t i = 0; i < produced_.size(); ++i) {
      if (produced_[i] == 0) continue;
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
        if (m >= 0 && produced_[m] == 0 && reported.insert(member).second) {
          problems.push_back(absl::StrCat("incomplete weight: '", params[i].name, "' arrived without '", member, "'"));
        }
      }
    }
  }
  // Fused groups: any member present means every member present.
  for (const spec::Group& g : planner_.spec().groups) {
    std::set<std::string> seen_instances;
    for (const auto& [name, count] : arrivals_) {
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
  if (problems.empty()) return absl::OkStatus();
  size_t total = problems.size();
  if (problems.size() > kMaxListed) problems.resize(kMaxListed);
  std::string msg = absl::StrCat("refit refused (", total, " problem", total == 1 ? "" : "s", "): ",
                                 absl::StrJoin(problems, "; "));
  if (total > kMaxListed) absl::StrAppend(&msg, "; ... and ", total - kMaxListed, " more");
  return absl::FailedPreconditionError(msg);
}

size_t Ledger::tensors() const {
  absl::MutexLock lock(&mu_);
  return arrivals_.size();
}

std::vector<size_t> Ledger::Produced() const {
  absl::MutexLock lock(&mu_);
  std::vector<size_t> out;
  for (size_t i = 0; i < produced_.size(); ++i) {
    if (produced_[i] > 0) out.push_back(i);
  }
  return out;
}

}  // namespace refit
