// fp8_block128_ue8m0's entry point and its UE8M0 canonicalization (FORMATS.md B §4.4): the
// tile as the engine holds it after SGLang's Blackwell load path dequantizes to bf16 and
// requantizes with DeepGEMM per_block_cast_to_fp8(use_ue8m0=True).
#include <algorithm>

#include "formats/bits.h"
#include "formats/fp8_block128.h"

namespace refit::formats::fp8_block128 {

void QuantizeUe8m0(const ConstTensor& in, Fp32InputPolicy policy, float /*global_amax*/,
                   std::span<const MutableBytes> outs) {
  QuantizeTiles(in, policy, /*ue8m0=*/true, outs);
}

void CanonicalizeUe8m0Tile(uint8_t* q, int64_t rows, int64_t cols, int64_t stride, float* scale) {
  // E4M3 codes are ordered by magnitude, so the largest |q| is the largest code & 0x7F
  // (NaN codes, which only propagate mode can produce, are left alone).
  uint8_t max_code = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = q + r * stride;
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t m = row[c] & 0x7F;
      if (m != 0x7F && m > max_code) max_code = m;
    }
  }
  const float s = *scale;
  // bf16(q * s) is exact for a power-of-two s, so the requantize sees amax = max|q| * s.
  float amax = bits::E4m3ToF32(max_code) * s;
  if (amax < 1e-4f) amax = 1e-4f;
  const float s2 = bits::CeilToUe8m0DeepGemm(amax / 448.0f);
  if (!(s2 < s)) return;  // the requantize reproduces the tile
  const float factor = s / s2;  // a power of two >= 2; q * factor stays exact and <= 448
  // A tile whose amax was NaN (propagate mode) has s = 2^127, and factor overflows to +Inf: its
  // zero codes become 0 * Inf, a NaN made by the arithmetic. Its sign is the platform's (negative
  // on x86, positive in CUDA, whose kernel this must equal): such a NaN is written as the positive
  // NaN code, whatever the platform.
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = q + r * stride;
    for (int64_t c = 0; c < cols; ++c) {
      if ((row[c] & 0x7F) == 0x7F) continue;
      const float v = bits::E4m3ToF32(row[c]) * factor;
      row[c] = bits::IsNan(v) ? uint8_t{0x7F} : bits::F32ToE4m3(v);
    }
  }
  *scale = s2;
}

}  // namespace refit::formats::fp8_block128
