// Resolution of one trainer tensor under a model spec, independent of any engine: which rule
// applies, how it is converted (copy, cast or quantize; transposed first or not), which
// checkpoint-format tensors it becomes, and where each lands — engine parameter name, slot of a
// fused/stacked parameter, and this rank's shard. The planner (online) and the offline
// conversion share it, so both agree by construction.
// Thread-safe: pure functions.
#ifndef REFIT_REFIT_RESOLVE_H_
#define REFIT_REFIT_RESOLVE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "formats/format.h"
#include "spec/model_spec.h"

namespace refit {

enum class ConvertKind : uint8_t { kCopy, kQuantize };

struct ResolvedOutput {
  std::string checkpoint_name;  // trainer name + suffix: what `refitctl convert` writes; staging key
  std::string suffix;
  DType dtype;
  Shape full_shape;         // as the format emits it for the whole tensor
  Shape shape;              // this rank's part (== full_shape without sharding)
  std::string engine_name;  // target base name + suffix
  int64_t slot = 0;         // position in a fused/stacked parameter (stack-major, then fuse order)
  int64_t slots = 1;
};

struct Resolution {
  const spec::Rule* rule = nullptr;
  spec::Conversion conversion = spec::Conversion::kAuto;  // effective (checkpoint resolved)
  ConvertKind kind = ConvertKind::kCopy;
  formats::Format format = formats::Format::kBf16;  // when kQuantize
  bool quantized = false;  // a quantized format (not a copy or cast)
  bool transpose = false;
  Shape input_shape;       // after the optional transpose
  std::optional<int> shard_dim;  // normalized; every output SplitsOutput says is split along it
  std::vector<ResolvedOutput> outputs;
  // Trainer tensors sharing one global amax with this one (fused NVFP4 members, this one
  // included, in fuse order); empty when the format needs none or the rule fuses nothing.
  std::vector<std::string> amax_group;
  std::string amax_group_key;
  // Under expert_parallel: a stacked tensor whose expert another rank holds. Its outputs are the
  // checkpoint's as ever (offline conversion writes them), but it lands in none of this rank's
  // parameters.
  bool elsewhere = false;
};

// Whether an output of `full_shape` is split into `parts` along `shard_dim`. Not when there is no
// split, the output is 0-d, or it has one element along the split dimension while its input
// splits: a scale spanning that whole dimension (ct_fp8_channel's [N, 1] under a split along K),
// which every rank holds whole, as vLLM's row-parallel layers load a per-channel weight_scale.
inline bool SplitsOutput(const Shape& full_shape, std::optional<int> shard_dim, int64_t parts) {
  if (!shard_dim || parts <= 1 || full_shape.empty()) return false;
  const size_t d = static_cast<size_t>(*shard_dim);
  return d < full_shape.size() && full_shape[d] != 1;
}

// The slots of a parameter `rule` builds on this rank (spec.ep_rank's experts under
// expert_parallel), and the global slot of the first.
int64_t RankSlots(const spec::ModelSpec& spec, const spec::Rule& rule);
int64_t FirstSlot(const spec::ModelSpec& spec, const spec::Rule& rule);

// `dtype`/`shape` as the trainer sends the tensor. Errors name the tensor and the rule.
// `never` rules resolve to a copy of the tensor itself (offline conversion keeps them).
absl::StatusOr<Resolution> Resolve(const spec::ModelSpec& spec, const std::string& name, DType dtype,
                                   const Shape& shape);

// The slot key of a fused/stacked parameter: the trainer tensor that fills `slot` of engine
// parameter base `target_base` under `rule` (suffix appended).
absl::StatusOr<std::string> SourceName(const spec::Rule& rule, const spec::Captures& target_captures, int64_t slot,
                                       const std::string& suffix);

}  // namespace refit

#endif  // REFIT_REFIT_RESOLVE_H_
