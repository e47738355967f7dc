// Ledger: what arrived in a session, and whether it is complete enough to commit
// (DESIGN.md invariant 2). Records every trainer tensor and every slot of every engine
// parameter it fills (a fused or stacked parameter has one slot per member and expert).
// Check() names every missing, duplicate, unexpected or mismatched tensor, every parameter
// with an unfilled slot (a stranded gate/up half, a missing expert), every incomplete group,
// and every parameter whose assembled shape would not be the registered one.
// Thread-safe: all methods lock.
#ifndef REFIT_REFIT_LEDGER_H_
#define REFIT_REFIT_LEDGER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "refit/planner.h"

namespace refit {

class Ledger {
 public:
  explicit Ledger(const Planner& planner);

  // Records one arrival. A duplicate is recorded (and refused at Check) without planning again.
  // Returns the plan when this is the first arrival of `name` and it planned cleanly.
  absl::StatusOr<std::shared_ptr<const TensorPlan>> Arrive(const TensorDesc& desc);
  // Records a failure converting `name` (e.g. NaN input); refuses the commit.
  void Fail(const std::string& name, const absl::Status& error);

  // OK when the refit may commit. `partial`: only whole parameters whose rules allow partial
  // refits; otherwise every expected engine parameter, every slot exactly once.
  absl::Status Check(bool partial) const;

  size_t tensors() const;
  // Counts Arrive and Fail calls: equal counts, the same verdict from Check.
  uint64_t changes() const;
  // Engine indices with at least one slot filled (every slot exactly once when Check passed).
  std::vector<size_t> Produced() const;

 private:
  struct Slot {
    int count = 0;
    const formats::OutputSpec* out = nullptr;  // dtype and shape as staged, in `plan`
    std::shared_ptr<const TensorPlan> plan;
  };
  struct Arrival {
    int count = 0;
    std::shared_ptr<const TensorPlan> plan;  // when the first arrival planned cleanly
  };
  // Arrived names in name order (messages list them sorted).
  std::vector<const std::string*> SortedNames() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Planner& planner_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Arrival> arrivals_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<Slot>> slots_ ABSL_GUARDED_BY(mu_);  // per engine parameter
  std::vector<std::string> errors_ ABSL_GUARDED_BY(mu_);
  uint64_t changes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace refit

#endif  // REFIT_REFIT_LEDGER_H_
