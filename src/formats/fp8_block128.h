// fp8_block128 and fp8_block128_ue8m0: DeepGEMM per_block_cast_to_fp8 (FORMATS.md A, B §4.2,
// §4.4). Data F8_E4M3 [..., N, K] (suffix ""), dequant scale F32 "_scale_inv"
// [..., ceil(N/128), ceil(K/128)]; leading dimensions are a batch (experts).
// Thread-safe: pure functions; callers own all buffers.
#ifndef REFIT_FORMATS_FP8_BLOCK128_H_
#define REFIT_FORMATS_FP8_BLOCK128_H_

#include <cstdint>
#include <span>

#include "formats/format.h"

namespace refit::formats::fp8_block128 {

inline constexpr int64_t kTile = 128;

// The entry points of fp8_block128 and fp8_block128_ue8m0 (format_info.h QuantizeFn; no global
// amax). Both are QuantizeTiles.
void Quantize(const ConstTensor& in, Fp32InputPolicy policy, float global_amax,
              std::span<const MutableBytes> outs);
void QuantizeUe8m0(const ConstTensor& in, Fp32InputPolicy policy, float global_amax,
                   std::span<const MutableBytes> outs);

// REQUIRES: `in` passed CheckQuantizableInput/CheckFinite; `outs` match PlanOutputs.
void QuantizeTiles(const ConstTensor& in, Fp32InputPolicy policy, bool ue8m0,
                   std::span<const MutableBytes> outs);

// REQUIRES: `parts` match PlanOutputs; out.size() == elements of shape.
void Dequantize(const Shape& shape, std::span<const ConstTensor> parts, std::span<float> out);

// The canonical UE8M0 form of one quantized tile (B §4.4): what a bf16 dequantize plus a
// DeepGEMM use_ue8m0 requantize yields. `q` holds `rows` x `cols` codes with row stride
// `stride`; `scale` is the tile's power-of-two scale. Both are rewritten in place; a tile
// already canonical is left unchanged.
void CanonicalizeUe8m0Tile(uint8_t* q, int64_t rows, int64_t cols, int64_t stride, float* scale);

}  // namespace refit::formats::fp8_block128

#endif  // REFIT_FORMATS_FP8_BLOCK128_H_
