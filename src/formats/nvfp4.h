// nvfp4 (ModelOpt NVFP4QTensor, FORMATS.md A, B §6.2) and nvfp4_te (TransformerEngine 1-D
// NVFP4, B §6.3). 1x16 blocks along K. Tensors: packed E2M1 U8 [..., N, K/2] (suffix "",
// even element in the low nibble), block scales F8_E4M3 "_scale" [..., N, K/16], global
// decode scale F32 "_scale_2" (0-d). K % 16 != 0 is refused (format_table.cc).
// Thread-safe: pure functions; callers own all buffers.
#ifndef REFIT_FORMATS_NVFP4_H_
#define REFIT_FORMATS_NVFP4_H_

#include <cstdint>
#include <span>

#include "formats/format.h"

namespace refit::formats::nvfp4 {

inline constexpr int64_t kBlock = 16;

// ModelOpt: weight_scale_2 = A/2688; block scale RNE_E4M3(b/(6*s2)) with 0 -> 1.0; data
// y = x / (S*s2), sign = (y < 0). REQUIRES: `in` validated, `outs` match Plan, A > 0 (0/0
// would make every scale NaN; its row's GlobalAmax::kNonzero has format.cc refuse it), A >= every
// |x| or NaN. The entry point of nvfp4 (format_info.h QuantizeFn).
void QuantizeModelOpt(const ConstTensor& in, Fp32InputPolicy policy, float global_amax,
                      std::span<const MutableBytes> outs);

// TE: S_enc = 2688/A (1 when A == 0), weight_scale_2 = S_dec = 1/S_enc, block scale
// E4M3_satfinite(b * (S_enc * (1/6))), data y = x * (1/(S*S_dec)), sign from the sign bit.
// The entry point of nvfp4_te.
void QuantizeTe(const ConstTensor& in, Fp32InputPolicy policy, float global_amax,
                std::span<const MutableBytes> outs);

// value = e2m1 * (float(S) * s2), for both producers.
void Dequantize(const Shape& shape, std::span<const ConstTensor> parts, std::span<float> out);

}  // namespace refit::formats::nvfp4

#endif  // REFIT_FORMATS_NVFP4_H_
