// Planner: maps each trainer tensor to the engine parameters it produces, under the model spec.
// Built once per engine registration; immutable afterwards (thread-safe to read).
#ifndef REFIT_REFIT_PLANNER_H_
#define REFIT_REFIT_PLANNER_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/format.h"
#include "refit/types.h"
#include "spec/model_spec.h"
#include "storage/engine_storage.h"

namespace refit {

enum class ConvertKind : uint8_t { kCopy, kQuantize };

struct Target {
  size_t engine_index;
  formats::OutputSpec spec;
};

struct TensorPlan {
  const spec::Rule* rule = nullptr;
  ConvertKind kind = ConvertKind::kCopy;
  formats::Format format = formats::Format::kBf16;
  std::vector<Target> targets;  // in formats::PlanOutputs order
};

struct DerivedTarget {
  size_t target_index;
  size_t from_index;
  spec::DerivedOp op;
};

class Planner {
 public:
  // Errors when a derived parameter's source is missing or of another shape, naming both.
  static absl::StatusOr<Planner> Create(const spec::ModelSpec& spec, std::vector<storage::ParamInfo> params);

  // What `name` (dtype, shape as the trainer sends it) becomes. Errors name the tensor and say
  // why (no such engine parameter, dtype/shape mismatch, marked never, format cannot take it).
  absl::StatusOr<TensorPlan> Plan(const std::string& name, DType dtype, const Shape& shape) const;

  const spec::ModelSpec& spec() const { return *spec_; }
  const std::vector<storage::ParamInfo>& params() const { return params_; }
  // Engine parameters that every full refit must produce (not `never`, not derived).
  const std::vector<size_t>& expected() const { return expected_; }
  const std::vector<DerivedTarget>& derived() const { return derived_; }
  // Index of an engine parameter by name, or -1.
  int64_t IndexOf(const std::string& name) const;

 private:
  const spec::ModelSpec* spec_ = nullptr;
  std::vector<storage::ParamInfo> params_;
  std::map<std::string, size_t> by_name_;
  std::vector<size_t> expected_;
  std::vector<DerivedTarget> derived_;
};

}  // namespace refit

#endif  // REFIT_REFIT_PLANNER_H_
