// Wire format checkpoint, refitd's side: which manifest tensors the trainer converts itself
// before sending (planned at begin from the spec's plans), how their checkpoint-format outputs
// are recognized in a bucket, and what is checked before they are staged. Outputs are staged as
// copies into their plan's targets (the passthrough path), so shards, fusion, stacking, layout
// steps and the ledger's checks run exactly as for tensors refitd converted itself.
// Immutable after Create (thread-safe to read).
#ifndef REFIT_REFIT_WIRE_PLAN_H_
#define REFIT_REFIT_WIRE_PLAN_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "formats/format.h"
#include "refit/planner.h"
#include "refit/types.h"

namespace refit {

struct WireEntry {
  TensorDesc input;  // as the manifest declares it
  std::shared_ptr<const TensorPlan> plan;
  std::vector<formats::OutputSpec> outputs;  // the whole tensor's, in formats::PlanOutputs order
  std::vector<bool> is_scale;                // per output: a block or tensor-wide scale
  // NVFP4: the output holding the global scale (weight_scale_2, F32 scalar), else -1. Members of
  // a fused group (plan->amax_group) must all send the same one; so must every rank of a slice.
  int global_scale = -1;
  // Per output: the copy of its bytes into the plan's targets of that output (one per engine rank
  // that holds its own part of it).
  std::vector<std::shared_ptr<const TensorPlan>> copies;
};

class WireTable {
 public:
  // The tensors of `manifest` the trainer converts: those the spec quantizes (an FP8/FP4 format),
  // members of fused NVFP4 groups included (listed with their group: the trainer reduces the
  // group's amax), except Megatron-core names under a spec `source` (refitd maps those first). Every manifest
  // tensor must plan (Node::Begin checked it).
  static absl::StatusOr<std::shared_ptr<const WireTable>> Create(const Planner& planner, const Manifest& manifest);

  // What begin and join answer.
  const WirePlan& plan() const { return plan_; }
  const std::vector<WireEntry>& entries() const { return entries_; }
  // The entry whose output `name` is (its index in *output), or nullptr.
  const WireEntry* FindOutput(const std::string& name, size_t* output) const;
  // The entry of trainer tensor `name`, or nullptr.
  const WireEntry* FindTensor(const std::string& name) const;

 private:
  WirePlan plan_;
  std::vector<WireEntry> entries_;
  absl::flat_hash_map<std::string, std::pair<size_t, size_t>> by_output_;  // -> (entry, output)
  absl::flat_hash_map<std::string, size_t> by_tensor_;
};

// Checks one arrived output of `entry` against the plan: its dtype and shape (a slice's full
// shape; SliceAssembler checks the slice itself); errors name the tensor and say what the plan wants.
absl::Status CheckWireOutput(const WireEntry& entry, size_t output, const TensorDesc& arrived);
// Refuses a non-finite scale (NaN/Inf F32, E4M3 NaN, E8M0 NaN byte 0xFF) in `host_bytes`, the
// output's bytes, naming the tensor and the first bad index. Data outputs pass.
absl::Status CheckWireScales(const WireEntry& entry, size_t output, const uint8_t* host_bytes, uint64_t bytes);
// The global scale (entry.global_scale's F32 value) must be positive: NVFP4 encodes it from an
// amax (ModelOpt: amax / 2688, refused at 0; TE: 1 / (2688 / amax), 1 at 0). Errors name the tensor.
absl::Status CheckWireGlobalScale(const WireEntry& entry, float scale_2);

}  // namespace refit

#endif  // REFIT_REFIT_WIRE_PLAN_H_
