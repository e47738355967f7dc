// Bit-exact element and scale conversions shared by the CPU reference quantizers and the CUDA
// kernels (FORMATS.md §2). Every function is a pure inline over scalars and compiles for the
// device under nvcc. Library casts are deliberately not used: their overflow, NaN and
// rounding rules differ between versions (FORMATS.md §2.1, §2.3).
// Thread-safe: pure functions.
#ifndef REFIT_FORMATS_BITS_H_
#define REFIT_FORMATS_BITS_H_

#include <cstdint>
#if !defined(__CUDA_ARCH__)
#include <cstring>
#endif

#if defined(__CUDACC__)
#define REFIT_HD __host__ __device__ __forceinline__
#else
#define REFIT_HD inline
#endif

namespace refit::formats::bits {

REFIT_HD uint32_t F32Bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
#endif
}

REFIT_HD float F32FromBits(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
#endif
}

REFIT_HD bool IsNan(float f) { return (F32Bits(f) & 0x7FFFFFFFu) > 0x7F800000u; }
REFIT_HD bool IsFinite(float f) { return (F32Bits(f) & 0x7F800000u) != 0x7F800000u; }
REFIT_HD float AbsF(float f) { return F32FromBits(F32Bits(f) & 0x7FFFFFFFu); }

// max(acc, |v|) that propagates NaN like torch.amax.
REFIT_HD float AbsMaxNan(float acc, float v) {
  const float a = AbsF(v);
  if (IsNan(acc)) return acc;
  if (IsNan(a)) return a;
  return a > acc ? a : acc;
}

// ---- BF16 / FP16 ----

REFIT_HD float Bf16ToF32(uint16_t h) { return F32FromBits(static_cast<uint32_t>(h) << 16); }

// RNE; NaN -> 0x7FC0 (as torch's c10::round_to_nearest_even); overflow rounds to Inf.
REFIT_HD uint16_t F32ToBf16(float f) {
  const uint32_t b = F32Bits(f);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  return static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

REFIT_HD float RoundToBf16(float f) { return Bf16ToF32(F32ToBf16(f)); }

REFIT_HD float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  const uint32_t m = h & 0x3FFu;
  if (e == 0x1F) return F32FromBits(sign | 0x7F800000u | (m << 13));
  if (e != 0) return F32FromBits(sign | ((e + 112u) << 23) | (m << 13));
  // Subnormal half: m * 2^-24, exact in fp32.
  const float v = static_cast<float>(m) * F32FromBits(0x33800000u);
  return F32FromBits(sign | F32Bits(v));
}

// IEEE RNE; overflow -> Inf; NaN -> quiet NaN with the sign kept.
REFIT_HD uint16_t F32ToF16(float f) {
  const uint32_t b = F32Bits(f);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
  const uint32_t a = b & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7E00u;
  if (a >= 0x38800000u) {  // normal half range (or overflow)
    const uint32_t r = a + 0xFFFu + ((a >> 13) & 1u);
    const uint32_t h = (r - (112u << 23)) >> 13;
    return sign | static_cast<uint16_t>(h >= 0x7C00u ? 0x7C00u : h);
  }
  const uint32_t e = a >> 23;
  if (e < 102) return sign;  // below 2^-25: rounds to zero
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14..24: m * 2^(e-150) in units of 2^-24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return sign | static_cast<uint16_t>(q);
}

// ---- FP8 E4M3FN ----

// RNE with saturation to +-448 (CUDA __NV_SATFINITE): overflow and +-Inf -> 0x7E/0xFE,
// NaN -> 0x7F with the sign bit kept (torch CPU), -0.0 -> 0x80.
REFIT_HD uint8_t F32ToE4m3(float f) {
  const uint32_t b = F32Bits(f);
  const uint8_t sign = static_cast<uint8_t>((b >> 24) & 0x80u);
  const uint32_t a = b & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7Fu;
  if (a >= 0x43E00000u) return sign | 0x7Eu;  // >= 448
  if (a >= 0x3C800000u) {                    // >= 2^-6: normal E4M3
    const uint32_t r = a + 0x7FFFFu + ((a >> 20) & 1u);
    return sign | static_cast<uint8_t>((r >> 20) - (120u << 3));
  }
  const uint32_t e = a >> 23;
  if (e < 116) return sign;  // below 2^-11: rounds to zero
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 141u - e;  // 21..25: m * 2^(e-150) in units of 2^-9
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return sign | static_cast<uint8_t>(q);
}

REFIT_HD float E4m3ToF32(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t e = (c >> 3) & 0xFu;
  const uint32_t m = c & 0x7u;
  if (e == 0xF && m == 0x7) return F32FromBits(sign | 0x7FC00000u);
  if (e == 0) {
    const float v = static_cast<float>(m) * F32FromBits(0x3B000000u);  // m * 2^-9
    return F32FromBits(sign | F32Bits(v));
  }
  return F32FromBits(sign | ((e + 120u) << 23) | (m << 20));
}

// ---- FP4 E2M1 ----

// Magnitude code 0..7 of |y| under RNE with saturation to 6; NaN -> 7.
REFIT_HD uint8_t E2m1Magnitude(float y) {
  const float a = AbsF(y);
  if (IsNan(a)) return 7;
  return static_cast<uint8_t>((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) +
                              (a > 2.5f) + (a >= 3.5f) + (a > 5.0f));
}

// Sign from the fp32 sign bit: -0.0 -> 8 (triton_kernels, CUDA cvt, ml_dtypes).
REFIT_HD uint8_t F32ToE2m1SignBit(float y) {
  return static_cast<uint8_t>(((F32Bits(y) >> 28) & 0x8u) | E2m1Magnitude(y));
}

// Sign = (y < 0): -0.0 -> 0 and NaN -> 7 (ModelOpt NVFP4QTensor._cast_fp4).
REFIT_HD uint8_t F32ToE2m1SignLess(float y) {
  return static_cast<uint8_t>((y < 0.0f ? 0x8u : 0x0u) | E2m1Magnitude(y));
}

REFIT_HD float E2m1ToF32(uint8_t code) {
  // {0, .5, 1, 1.5, 2, 3, 4, 6} as fp32 bits, negatives with the sign bit.
  const uint32_t mag = code & 0x7u;
  uint32_t b;
  switch (mag) {
    case 0: b = 0x00000000u; break;
    case 1: b = 0x3F000000u; break;
    case 2: b = 0x3F800000u; break;
    case 3: b = 0x3FC00000u; break;
    case 4: b = 0x40000000u; break;
    case 5: b = 0x40400000u; break;
    case 6: b = 0x40800000u; break;
    default: b = 0x40C00000u; break;
  }
  return F32FromBits(b | (code & 0x8u ? 0x80000000u : 0u));
}

// ---- E8M0 scales (FORMATS.md §2.5) ----

// ceil-E8M0, TransformerEngine flavour (ptx float_to_e8m0, cvt.rp.satfinite.ue8m0x2.f32): the
// sign is ignored, NaN -> 255, otherwise rounds up, capped at 254 (so +Inf -> 254).
REFIT_HD uint8_t E8m0CeilTe(float v) {
  const uint32_t b = F32Bits(v) & 0x7FFFFFFFu;
  if (b > 0x7F800000u) return 255;
  const uint32_t e = b >> 23;
  const uint32_t m = b & 0x7FFFFFu;
  const uint32_t up = e == 0 ? (m > 0x400000u ? 1u : 0u) : (m != 0 ? 1u : 0u);
  const uint32_t r = e + up;
  return static_cast<uint8_t>(r > 254u ? 254u : r);
}

// ceil-E8M0 bits, triton_kernels ROUND_UP flavour: (bits + 0x7FFFFF) & 0x7F800000 (uint32
// arithmetic). Returns the fp32 bits of the rounded scale; the byte is bits >> 23.
REFIT_HD uint32_t E8m0CeilTritonBits(float v) {
  return (F32Bits(v) + 0x7FFFFFu) & 0x7F800000u;
}

// DeepGEMM ceil_to_ue8m0: 2^clamp(e + (m != 0), 1, 254) of |v|, as fp32.
REFIT_HD float CeilToUe8m0DeepGemm(float v) {
  const uint32_t b = F32Bits(v) & 0x7FFFFFFFu;
  uint32_t e = ((b >> 23) & 0xFFu) + ((b & 0x7FFFFFu) != 0 ? 1u : 0u);
  e = e < 1u ? 1u : (e > 254u ? 254u : e);
  return F32FromBits(e << 23);
}

// Decodes a biased E8M0 byte: 0 -> 2^-127, 255 -> NaN.
REFIT_HD float E8m0ToF32(uint8_t b) {
  if (b == 0) return F32FromBits(0x00400000u);
  if (b == 255) return F32FromBits(0x7FC00000u);
  return F32FromBits(static_cast<uint32_t>(b) << 23);
}

// TE exp2f_rcp: 2^(127 - e) exactly; e = 254 -> 2^-127, e = 255 -> NaN.
REFIT_HD float Exp2Rcp(uint8_t e) {
  if (e == 255) return F32FromBits(0x7FC00000u);
  if (e == 254) return F32FromBits(0x00400000u);
  return F32FromBits(static_cast<uint32_t>(254u - e) << 23);
}

inline constexpr float kFltMax = 3.40282346638528859812e+38F;

}  // namespace refit::formats::bits

#endif  // REFIT_FORMATS_BITS_H_
