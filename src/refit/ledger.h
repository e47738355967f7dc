// Ledger: what arrived in a session, and whether it is complete enough to commit
// (DESIGN.md invariant 2). Records every trainer tensor and every engine parameter it produced;
// Check() names every missing, duplicate, unexpected or mismatched tensor and every incomplete
// group. Thread-safe: all methods lock.
#ifndef REFIT_REFIT_LEDGER_H_
#define REFIT_REFIT_LEDGER_H_

#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "refit/planner.h"

namespace refit {

class Ledger {
 public:
  explicit Ledger(const Planner& planner) : planner_(planner), produced_(planner.params().size(), 0) {}

  // Records one arrival. A duplicate is recorded (and refused at Check) without planning again.
  // Returns the plan when this is the first arrival of `name` and it planned cleanly.
  absl::StatusOr<TensorPlan> Arrive(const TensorDesc& desc);
  // Records a failure converting `name` (e.g. NaN input); refuses the commit.
  void Fail(const std::string& name, const absl::Status& error);

  // OK when the refit may commit. `partial`: only whole groups of tensors whose rules allow
  // partial refits; otherwise every expected engine parameter exactly once.
  absl::Status Check(bool partial) const;

  size_t tensors() const;
  // Engine indices produced (each exactly once when Check passed).
  std::vector<size_t> Produced() const;

 private:
  const Planner& planner_;
  mutable absl::Mutex mu_;
  std::map<std::string, int> arrivals_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, const spec::Rule*> rules_ ABSL_GUARDED_BY(mu_);
  std::vector<int> produced_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> errors_ ABSL_GUARDED_BY(mu_);
};

}  // namespace refit

#endif  // REFIT_REFIT_LEDGER_H_
