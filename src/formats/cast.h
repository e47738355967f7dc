// bf16 / fp16 / fp32: IEEE round-to-nearest-even casts of the whole tensor (suffix ""), a
// byte copy when the input already has the target dtype (FORMATS.md A). Any rank.
// Thread-safe: pure functions; callers own all buffers.
#ifndef REFIT_FORMATS_CAST_H_
#define REFIT_FORMATS_CAST_H_

#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/format.h"

namespace refit::formats::cast {

// `target` is kBF16, kF16 or kF32. Inputs may be BF16, F16 or F32.
absl::StatusOr<std::vector<OutputSpec>> Plan(DType target, DType input, const Shape& shape);

// REQUIRES: `in` passed CheckFinite; `outs` match Plan(target, in.dtype, in.shape).
void Quantize(DType target, const ConstTensor& in, Fp32InputPolicy policy,
              std::span<const MutableBytes> outs);

void Dequantize(std::span<const ConstTensor> parts, std::span<float> out);

}  // namespace refit::formats::cast

#endif  // REFIT_FORMATS_CAST_H_
