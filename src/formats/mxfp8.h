// mxfp8: TransformerEngine MXFP8 "RCEIL" (FORMATS.md A, B §5.2). 1x32 blocks along K; data
// F8_E4M3 [..., N, K] (suffix ""), biased E8M0 scale bytes U8 "_scale_inv" [..., N, K/32],
// row-major and unswizzled. K % 32 != 0 is refused (its row in format_table.cc).
// Thread-safe: pure functions; callers own all buffers.
#ifndef REFIT_FORMATS_MXFP8_H_
#define REFIT_FORMATS_MXFP8_H_

#include <cstdint>
#include <span>

#include "formats/format.h"

namespace refit::formats::mxfp8 {

inline constexpr int64_t kBlock = 32;

// The entry point (format_info.h QuantizeFn; no global amax).
// REQUIRES: `in` passed CheckQuantizableInput/CheckFinite; `outs` match PlanOutputs.
void Quantize(const ConstTensor& in, Fp32InputPolicy policy, float global_amax,
              std::span<const MutableBytes> outs);

// REQUIRES: `parts` match PlanOutputs; out.size() == elements of shape.
void Dequantize(const Shape& shape, std::span<const ConstTensor> parts, std::span<float> out);

}  // namespace refit::formats::mxfp8

#endif  // REFIT_FORMATS_MXFP8_H_
