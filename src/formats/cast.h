// bf16 / fp16 / fp32: IEEE round-to-nearest-even casts of the whole tensor (suffix ""), a
// byte copy when the input already has the target dtype (FORMATS.md A). Any rank.
// Thread-safe: pure functions; callers own all buffers.
#ifndef REFIT_FORMATS_CAST_H_
#define REFIT_FORMATS_CAST_H_

#include <span>
#include <vector>

#include "formats/format.h"

namespace refit::formats::cast {

// `target` is kBF16, kF16 or kF32; inputs may be BF16, F16 or F32 (format.cc checks).
// REQUIRES: `in` passed CheckFinite; `outs` match PlanOutputs.
void Quantize(DType target, const ConstTensor& in, Fp32InputPolicy policy,
              std::span<const MutableBytes> outs);

// The entry point of the cast to `kTarget` (format_info.h QuantizeFn; no global amax).
template <DType kTarget>
void QuantizeTo(const ConstTensor& in, Fp32InputPolicy policy, float /*global_amax*/,
                std::span<const MutableBytes> outs) {
  Quantize(kTarget, in, policy, outs);
}

void Dequantize(const Shape& shape, std::span<const ConstTensor> parts, std::span<float> out);

}  // namespace refit::formats::cast

#endif  // REFIT_FORMATS_CAST_H_
