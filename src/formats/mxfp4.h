// mxfp4: triton_kernels downcast_to_mxfp_torch with ROUND_UP scales, gpt-oss naming
// (FORMATS.md A, B §7). 1x32 blocks along K. Tensors: "_blocks" U8 [..., N, K/32, 16] (32
// E2M1 codes per block, even element in the low nibble) and "_scales" U8 [..., N, K/32]
// (biased E8M0). K % 32 != 0 is refused (its row in format_table.cc).
// Thread-safe: pure functions; callers own all buffers.
#ifndef REFIT_FORMATS_MXFP4_H_
#define REFIT_FORMATS_MXFP4_H_

#include <cstdint>
#include <span>

#include "formats/format.h"

namespace refit::formats::mxfp4 {

inline constexpr int64_t kBlock = 32;

// The entry point (format_info.h QuantizeFn; no global amax).
// REQUIRES: `in` passed CheckQuantizableInput/CheckFinite; `outs` match PlanOutputs.
void Quantize(const ConstTensor& in, Fp32InputPolicy policy, float global_amax,
              std::span<const MutableBytes> outs);

// value = e2m1 * bitcast<float>(scale << 23), as triton_kernels upcast_from_mxfp_torch.
void Dequantize(const Shape& shape, std::span<const ConstTensor> parts, std::span<float> out);

}  // namespace refit::formats::mxfp4

#endif  // REFIT_FORMATS_MXFP4_H_
