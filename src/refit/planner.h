// Planner: maps each trainer tensor to the engine parameters it produces, under the model spec,
// and says how every registered engine parameter is produced: built from staged
// checkpoint-format pieces (one per slot of a fused/stacked parameter), derived from another
// parameter at commit, or kept as the engine has it (`refit: never`).
// Built once per engine registration; immutable afterwards (thread-safe to read). Plans are
// memoized by tensor name (a plan depends only on the spec, the registration and the tensor's
// dtype and shape), so a tensor is resolved once per registration, not once per refit.
#ifndef REFIT_REFIT_PLANNER_H_
#define REFIT_REFIT_PLANNER_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "formats/format.h"
#include "refit/resolve.h"
#include "refit/types.h"
#include "spec/model_spec.h"
#include "storage/engine_storage.h"

namespace refit {

// One checkpoint-format output of a trainer tensor and the slot of the engine parameter it fills.
struct Target {
  size_t engine_index;
  int64_t slot = 0;
  std::string key;           // staging key: the checkpoint-format tensor name
  formats::OutputSpec spec;  // suffix, dtype as staged, shape of this rank's part, bytes
  Shape full_shape;          // the whole tensor's output (before the shard slice)
  size_t output = 0;         // which of the format's outputs (formats::PlanOutputs order)
  int64_t shard_index = 0;   // the part of full_shape this target's rank holds (TensorPlan::shard_dim)
};

struct TensorPlan {
  const spec::Rule* rule = nullptr;
  ConvertKind kind = ConvertKind::kCopy;
  formats::Format format = formats::Format::kBf16;  // when kQuantize
  bool transpose = false;
  Shape input_shape;               // after the transpose
  std::optional<int> shard_dim;    // outputs of rank > 0 are split into shard_parts
  int64_t shard_parts = 1, shard_index = 0;
  // In formats::PlanOutputs order; over several engine ranks, each rank's in rank order, and a
  // target whose bytes every rank shares (a replicated tensor) has one key for all of them.
  std::vector<Target> targets;
  std::vector<std::string> amax_group;  // fused NVFP4 members sharing one global amax
  std::string amax_group_key;
};

struct ParamSource {
  enum class Kind : uint8_t { kBuilt, kDerived, kKept };
  Kind kind = Kind::kBuilt;
  const spec::Rule* rule = nullptr;  // kBuilt, kKept
  std::string suffix;                // kBuilt: the checkpoint suffix ("" = data)
  std::vector<std::string> slots;    // kBuilt: staging key per slot
  int64_t data_index = -1;           // kBuilt scales: the sibling data parameter, or -1
};

struct DerivedTarget {
  size_t target_index;
  size_t from_index;
  spec::DerivedOp op;
  const spec::Derived* derived = nullptr;
  int64_t scale_index = -1;  // an FP8 kv_b_proj's block scales (mla ops with `scale`), or -1
};

// One engine rank's registered parameters, for a planner over every rank of the node's engine.
struct RankParams {
  std::shared_ptr<const spec::ModelSpec> spec;  // the node's spec as this rank sees it (spec::ForRank)
  // Prefixes the rank's parameter names ("rank1/model.norm.weight") and the staging keys of its
  // rank-specific parts; "" for a single engine.
  std::string label;
  std::vector<storage::ParamInfo> params;
};

class Planner {
 public:
  // Errors name the parameter: a derived parameter whose source is missing or of another
  // shape, a parameter two rules would produce.
  static absl::StatusOr<Planner> Create(const spec::ModelSpec& spec, std::vector<storage::ParamInfo> params);
  // A planner over the parameters of every rank of one engine (tensor/expert parallel), in rank
  // order: params() is their concatenation, names prefixed by each rank's label. A trainer
  // tensor's plan targets every rank that holds part of it; a rank's part that differs from the
  // others' (a TP shard) is staged under the label-prefixed key, a part every rank shares once.
  // Errors name the rank. `spec` is the node's (spec()).
  static absl::StatusOr<Planner> CreateRanks(const spec::ModelSpec& spec, std::vector<RankParams> ranks);

  // What `name` (dtype, shape as the trainer sends it) becomes. Errors name the tensor and say
  // why (no such engine parameter, dtype/shape mismatch, marked never, format cannot take it).
  absl::StatusOr<TensorPlan> Plan(const std::string& name, DType dtype, const Shape& shape) const;
  // The same plan, shared: the memoized one when `name` was planned before with this dtype and
  // shape (one hash lookup), else planned now and memoized when it planned cleanly. Errors are
  // never memoized. Memory stays bounded: only names that land in a registered slot plan cleanly,
  // and at most one plan per name is kept.
  absl::StatusOr<std::shared_ptr<const TensorPlan>> SharedPlan(const std::string& name, DType dtype,
                                                               const Shape& shape) const;

  // Ledger::Check's memo: engine parameter `index` assembled to its registered dtype and shape
  // from slots staged by `plans` (its slots' plans in slot order, then its data parameter's).
  // The plans noted stay alive here, so a pointer equal to a noted one is that same plan.
  bool ShapeChecked(size_t index, absl::Span<const TensorPlan* const> plans) const;
  void NoteShapeChecked(size_t index, std::vector<std::shared_ptr<const TensorPlan>> plans) const;
  // Ledger::Check's memo of the spec's groups: the tensors arrived (their plans, in name order)
  // left no group incomplete. An RL loop sends the same tensors each refit; the check of every
  // arrived name against every group member's pattern runs once.
  bool GroupsChecked(absl::Span<const TensorPlan* const> plans) const;
  void NoteGroupsChecked(std::vector<std::shared_ptr<const TensorPlan>> plans) const;

  const spec::ModelSpec& spec() const { return *spec_; }
  const std::vector<storage::ParamInfo>& params() const { return params_; }
  const ParamSource& source(size_t index) const { return sources_[index]; }
  // Engine parameters that every full refit must produce (not `never`, not derived).
  const std::vector<size_t>& expected() const { return expected_; }
  const std::vector<DerivedTarget>& derived() const { return derived_; }
  // Index of an engine parameter by name, or -1.
  int64_t IndexOf(const std::string& name) const;
  // Engine ranks planned over (1 for a single engine), and the rank of parameter `index`.
  size_t ranks() const { return ranks_.size(); }
  size_t rank_of(size_t index) const { return rank_of_[index]; }

 private:
  const spec::ModelSpec* spec_ = nullptr;
  std::vector<storage::ParamInfo> params_;
  std::vector<ParamSource> sources_;
  std::map<std::string, size_t> by_name_;
  std::vector<size_t> expected_;
  std::vector<DerivedTarget> derived_;
  std::vector<RankParams> ranks_;  // params moved out into params_
  std::vector<size_t> rank_of_;

  static std::string Qualified(const std::string& label, const std::string& name) {
    return label.empty() ? name : label + "/" + name;
  }
  // Plans `name` for rank `r` into `plan` (first: the plan's fields are set from it).
  absl::Status PlanRank(size_t r, const std::string& name, DType dtype, const Shape& shape, TensorPlan& plan,
                        bool& first) const;

  absl::StatusOr<TensorPlan> Resolved(const std::string& name, DType dtype, const Shape& shape) const;
  struct Memo {
    struct Entry {
      DType dtype;
      Shape shape;
      std::shared_ptr<const TensorPlan> plan;
    };
    absl::Mutex mu;
    absl::flat_hash_map<std::string, Entry> plans ABSL_GUARDED_BY(mu);
    std::vector<std::vector<std::shared_ptr<const TensorPlan>>> shape_checked ABSL_GUARDED_BY(mu);  // by index
    std::vector<std::shared_ptr<const TensorPlan>> groups_checked ABSL_GUARDED_BY(mu);
  };
  size_t memo_limit_ = 0;  // every slot of every built parameter: the most names that plan cleanly
  std::unique_ptr<Memo> memo_ = std::make_unique<Memo>();
};

}  // namespace refit

#endif  // REFIT_REFIT_PLANNER_H_
