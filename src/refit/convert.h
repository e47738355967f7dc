// One trainer tensor's bytes into its checkpoint-format outputs, and this rank's part of them:
// the conversion step shared by the session (online) and the offline conversion, so both
// produce identical bytes. Thread-safe: pure functions; callers own all buffers.
#ifndef REFIT_REFIT_CONVERT_H_
#define REFIT_REFIT_CONVERT_H_

#include <optional>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "formats/format.h"
#include "refit/resolve.h"

namespace refit {

struct ConvertStep {
  ConvertKind kind = ConvertKind::kCopy;
  formats::Format format = formats::Format::kBf16;
  bool transpose = false;
};

// Converts `in` (as the trainer sent it) into `outs`, the whole tensor's outputs in
// formats::PlanOutputs order (one output, the input bytes, for a copy). `global_amax` and
// `supplied_amax` as for formats::Quantize. Errors name `name`.
absl::Status ConvertFull(const ConvertStep& step, const formats::ConstTensor& in, const formats::QuantizeOptions& options,
                         std::optional<float> global_amax, std::span<const formats::MutableBytes> outs,
                         std::string_view name, std::optional<float> supplied_amax = std::nullopt);

// max|x| of `in` under the input policy (what a fused NVFP4 group's members contribute).
absl::StatusOr<float> TensorAmax(const formats::ConstTensor& in, const formats::QuantizeOptions& options,
                                 std::string_view name);

// Copies this rank's part of a whole output (`full_shape`) into `dst`; a plain copy when the
// output is not split (SplitsOutput: replicated).
void ShardPart(const uint8_t* src, DType dtype, const Shape& full_shape, std::optional<int> shard_dim, int64_t parts,
               int64_t index, uint8_t* dst);

}  // namespace refit

#endif  // REFIT_REFIT_CONVERT_H_
