// The NVFP4 encode op of the flat kernels: ModelOpt NVFP4QTensor (FORMATS.md B §6.2) and
// TransformerEngine 1-D (B §6.3) on 1x16 blocks against a global amax. Shared by the
// single-tensor kernel (quantize_nvfp4.cu) and the batched kernel (batch_quantize.cu), so both
// run the same device code and emit the same bytes.
// Thread-safe: device code only.
#ifndef REFIT_KERNELS_NVFP4_OP_CUH_
#define REFIT_KERNELS_NVFP4_OP_CUH_

#include <cfloat>

#include "kernels/flat_kernels.cuh"
#include "kernels/launch.h"

namespace refit::kernels::dev {

// Per-thread scalars of the global scale, computed once per thread and tensor (Nvfp4Op::Prepare).
struct Nvfp4State {
  float global;  // weight_scale_2 (ModelOpt: s2 = A / 2688) or TE's decode scale
  float c;       // ModelOpt: 6 * s2, the divisor of the block scale
  float rc;      // ModelOpt: RN(1 / c)
  bool c_fast;   // ModelOpt: c in [2^-60, 2^60], where b / c may use rc
  float k;       // TE: s_enc / 6
};

template <bool kTe>
struct Nvfp4Op {
  const float* amax_dev;
  float amax_host;
  uint8_t* q;
  uint8_t* scales;
  float* scale_2;
  unsigned long long* first_bad;
  // A trainer-supplied amax of the tensor (claim_word non-null): a block whose max|x| exceeds
  // `claim` lowers *claim_word to kAmaxClaimBit | its flat index (kernels/quantize.h).
  float claim = 0.0f;
  unsigned long long* claim_word = nullptr;

  __device__ __forceinline__ Nvfp4State Prepare() const {
    const float A = amax_dev != nullptr ? *amax_dev : amax_host;
    Nvfp4State st{};
    if constexpr (kTe) {
      // Comparisons, not fminf, so NaN stays NaN as in the reference.
      float s_enc = __fdiv_rn(2688.0f, A);
      if (s_enc > FLT_MAX) s_enc = FLT_MAX;
      if (A == 0.0f || s_enc == 0.0f) s_enc = 1.0f;
      st.global = __frcp_rn(s_enc);
      st.k = s_enc * (1.0f / 6.0f);
    } else {
      st.global = __fdiv_rn(A, 2688.0f);
      st.c = 6.0f * st.global;
      st.rc = __frcp_rn(st.c);
      st.c_fast = B(st.c) - 0x21800000u <= 0x3C000000u;
    }
    return st;
  }

  template <launch::Input kIn, bool kVec>
  __device__ __forceinline__ void Process(const Nvfp4State& st, int64_t chunk, int64_t elem,
                                          const uint4& raw, bool valid, int64_t n) const {
    constexpr int kC = Elems<kIn>::kCount;
    constexpr int kLanes = 16 / kC;
    float v[kC];
    const uint32_t lane_amax = Decode<kIn>(raw, v);
    if (first_bad != nullptr && valid && lane_amax >= kInfBits) RecordNonfinite<kIn>(raw, elem, first_bad);
    const float b = F(GroupMax<kLanes>(lane_amax));
    if (claim_word != nullptr && valid && b > claim) {
      atomicMin(claim_word, (1ULL << 63) | static_cast<unsigned long long>(elem));
    }
    uint32_t scale_byte;
    uint32_t packed = 0;
    if constexpr (kTe) {
      float sf = b * st.k;
      if (sf > FLT_MAX) sf = FLT_MAX;
      scale_byte = E4m3Byte(sf);
      float enc = __frcp_rn(E4m3Value(scale_byte) * st.global);
      if (enc > FLT_MAX) enc = FLT_MAX;
      float y[kC];
#pragma unroll
      for (int i = 0; i < kC; ++i) y[i] = v[i] * enc;
      packed = PackE2m1SignBit(y);
    } else {
      // s = RN(b / c): Markstein's correction of b * RN(1/c) is exact while c, b and the
      // quotient are normal (and for b = 0); otherwise a true division.
      float s;
      if (st.c_fast && (B(b) - 0x21800000u <= 0x3C000000u || b == 0.0f)) {
        const float q0 = b * st.rc;
        s = fmaf(fmaf(-q0, st.c, b), st.rc, q0);
      } else {
        s = __fdiv_rn(b, st.c);
      }
      if (s == 0.0f) s = 1.0f;
      scale_byte = E4m3Byte(s);
      const float d = E4m3Value(scale_byte) * st.global;
      // y = x / d, correctly rounded. Fast path: one reciprocal per block and a Markstein
      // correction per element, exact while d and the quotient are normal; otherwise (tiny
      // quotients, d out of range, non-finite input) a true division.
      const float r = __frcp_rn(d);
      const float tiny = d * 0x1p-125f;
      bool slow = !(d >= 0x1p-100f && d <= 0x1p100f) || lane_amax >= kInfBits;
      float y[kC];
#pragma unroll
      for (int i = 0; i < kC; ++i) {
        const float q0 = v[i] * r;
        y[i] = fmaf(fmaf(-q0, d, v[i]), r, q0);
      }
      if constexpr (kIn == launch::Input::kBf16) {
        // Smallest nonzero |x| of the chunk, in BF16 bits, minus 1 (0xFFFF if all are zero):
        // per half, 0x7FFF + |h| has bit 15 set iff h != 0, so the xor gives |h| - 1, or 0xFFFF.
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
        uint32_t mn = 0xFFFFFFFFu;
#pragma unroll
        for (int i = 0; i < 4; ++i) mn = MinU16x2(mn, ((w[i] & 0x7FFF7FFFu) + 0x7FFF7FFFu) ^ 0x80008000u);
        const uint32_t min_nz = min(mn & 0xFFFFu, mn >> 16) + 1u;
        slow |= min_nz < (B(tiny) + 0xFFFFu) >> 16;  // some 0 < |x| < tiny (tiny rounded up)
      } else {
#pragma unroll
        for (int i = 0; i < kC; ++i) {
          const float ax = fabsf(v[i]);
          slow |= (ax < tiny) & (ax > 0.0f);
        }
      }
      if (slow) {
        // Here the sign rule (y < 0) differs from the sign bit for -0 and negative NaN quotients:
        // clear those signs. (On the fast path y is never -0: x = -0 gives +0 through the fma.)
#pragma unroll
        for (int i = 0; i < kC; ++i) {
          const float yi = __fdiv_rn(v[i], d);
          y[i] = yi < 0.0f ? yi : fabsf(yi);
        }
      }
      packed = PackE2m1SignBit(y);
    }
    if (chunk == 0) *scale_2 = st.global;  // written even for an empty tensor
    if (!valid) return;
    StorePackedNibbles<kC, kVec>(q, elem, packed);
    if (chunk % kLanes == 0) scales[elem / 16] = static_cast<uint8_t>(scale_byte);
  }
};


// ---- ModelOpt NVFP4 on BF16 input, one thread per 1x16 block (Nvfp4BlockKernel). ----
//
// The thread owns the block's 32 input bytes, so the block amax needs no shuffle and the block
// scale (about 30 scalar instructions) is computed once per block instead of in both lanes that
// share it. Per element the quotient y = RN(|x| / d) comes from Markstein's correction on the
// divisor 2d (h = y / 2, exact), and its E2M1 magnitude code from three saturated terms on the
// FP32 pipe instead of integer exponent clamping:
//   code = RNE(4 sat(h)) + RNE(2 sat(h - 1)) + RNE(sat(h - 2))
// i.e. RNE(2 min(y, 2)) (codes 0-4, spacing 0.5), RNE(clamp(y, 2, 4) - 2) (0-2, spacing 1) and
// RNE((clamp(y, 4, 6) - 4) / 2) (0-1, spacing 2); each RNE is the float adder's rounding of the
// term added to M = 1.5 * 2^23 (ulp 1). The terms are chained into one sum (a1 = 4 t1 + M,
// a2 = 2 t2 + a1, a3 = t3 + a2) and RNE of a chained sum equals the sum of the RNEs because a
// later term is nonzero only when the earlier ones are saturated at even integers (4, then 6).
// h - 1 and h - 2 are exact where they are not saturated (Sterbenz). B(a3) - B(M) is the code.
// The sign is the input's sign bit where |x| != 0 (the ModelOpt rule y < 0: -0 gives +0, and a
// nonzero x gives a nonzero y while d <= 2^14, since |x| >= 2^-133 for BF16).
//
// Why the tiny-quotient check of Nvfp4Op is not needed here: a quotient below the normal range
// has magnitude code 0 whatever its rounding, and its sign is x's (the fast-path y has x's sign
// bit: the products keep it and the correction cannot cancel to an exact zero). So only the sign
// matters, and it comes from x. A block whose d is outside [2^-100, 2^14] or that holds a
// non-finite value takes Nvfp4Op's arithmetic (true divisions).

constexpr float kE2m1Magic = 12582912.0f;  // 1.5 * 2^23
constexpr uint32_t kE2m1MagicBits = 0x4B400000u;

__device__ __forceinline__ float AddSat(float a, float b) {
  float r;
  asm("add.rn.sat.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// B(M + code) of |x| / (2 rh^-1): see above. xa = |x| (>= 0), d2 = 2d, rh = RN(1 / d2).
__device__ __forceinline__ uint32_t E2m1MagicCode(float xa, float d2, float rh) {
  const float q0 = xa * rh;
  const float e = fmaf(-q0, d2, xa);
  const float h = fmaf(e, rh, q0);
  const float a1 = fmaf(AddSat(h, 0.0f), 4.0f, kE2m1Magic);
  const float a2 = fmaf(AddSat(h, -1.0f), 2.0f, a1);
  return B(AddSat(h, -2.0f) + a2);
}

// sum over i of (B(M) << 4i), modulo 2^32: what the magic adds to eight packed codes.
constexpr uint32_t MagicPackOffset() {
  uint32_t s = 0;
  for (int i = 0; i < 8; ++i) s += kE2m1MagicBits << (4 * i);
  return s;
}

// Eight BF16 values (four words, element 2k in the low half of word k) to eight E2M1 nibbles
// (element i in nibble i): magnitudes through E2m1MagicCode, signs of the nonzero inputs.
__device__ __forceinline__ uint32_t PackNvfp4Bf16x8(const uint32_t (&w)[4], const uint32_t (&a)[4], float d2,
                                                   float rh) {
  uint32_t mags = 0u - MagicPackOffset();
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    mags += E2m1MagicCode(F(a[k] << 16), d2, rh) << (8 * k);
    mags += E2m1MagicCode(F(a[k] & 0xFFFF0000u), d2, rh) << (8 * k + 4);
  }
  // Sign bits (15 and 31 of each word) of the nonzero halves: 0x7FFF + |h| has bit 15 set iff
  // |h| != 0. Gather byte 1 (even element) and byte 3 (odd element) of the four words, so byte k
  // of `ev` / `od` has bit 7 = sign of element 2k / 2k+1; nibble bits 3 and 7 of byte k.
  uint32_t s[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) s[k] = w[k] & (a[k] + 0x7FFF7FFFu) & 0x80008000u;
  const uint32_t x = __byte_perm(s[0], s[1], 0x7531), y = __byte_perm(s[2], s[3], 0x7531);
  const uint32_t ev = __byte_perm(x, y, 0x6420), od = __byte_perm(x, y, 0x7531);
  return mags | (ev >> 4) | od;
}

// The block's codes and scale byte. `raw` = the 32 input bytes of the block. Returns the scale
// byte; the 16 codes go to lo (elements 0-7) and hi (8-15). `nonfinite` is set when the block
// holds a NaN or Inf (the codes then follow Nvfp4Op's true-division arithmetic).
__device__ __forceinline__ uint32_t Nvfp4BlockBf16(const Nvfp4State& st, const uint4& r0, const uint4& r1,
                                                   uint32_t& lo, uint32_t& hi, bool& nonfinite,
                                                   float& block_max) {
  const uint32_t w0[4] = {r0.x, r0.y, r0.z, r0.w}, w1[4] = {r1.x, r1.y, r1.z, r1.w};
  uint32_t a0[4], a1[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    a0[k] = w0[k] & 0x7FFF7FFFu;
    a1[k] = w1[k] & 0x7FFF7FFFu;
  }
  uint32_t m = MaxU16x2(MaxU16x2(MaxU16x2(a0[0], a0[1]), MaxU16x2(a0[2], a0[3])),
                        MaxU16x2(MaxU16x2(a1[0], a1[1]), MaxU16x2(a1[2], a1[3])));
  const uint32_t b_bits = max(m << 16, m & 0xFFFF0000u);
  nonfinite = b_bits >= kInfBits;
  const float b = F(b_bits);
  block_max = b;
  float s;
  if (st.c_fast && (b_bits - 0x21800000u <= 0x3C000000u || b == 0.0f)) {
    const float q0 = b * st.rc;
    s = fmaf(fmaf(-q0, st.c, b), st.rc, q0);
  } else {
    s = __fdiv_rn(b, st.c);
  }
  if (s == 0.0f) s = 1.0f;
  const uint32_t scale_byte = E4m3Byte(s);
  const float d = E4m3Value(scale_byte) * st.global;
  if (!nonfinite && d >= 0x1p-100f && d <= 0x1p14f) {
    const float rh = 0.5f * __frcp_rn(d);
    lo = PackNvfp4Bf16x8(w0, a0, 2.0f * d, rh);
    hi = PackNvfp4Bf16x8(w1, a1, 2.0f * d, rh);
  } else {
    // Nvfp4Op's slow path: true divisions, sign rule y < 0.
    float y[16];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      y[2 * k] = F(w0[k] << 16);
      y[2 * k + 1] = F(w0[k] & 0xFFFF0000u);
      y[8 + 2 * k] = F(w1[k] << 16);
      y[8 + 2 * k + 1] = F(w1[k] & 0xFFFF0000u);
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const float yi = __fdiv_rn(y[i], d);
      y[i] = yi < 0.0f ? yi : fabsf(yi);
    }
    float y0[8], y1[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      y0[i] = y[i];
      y1[i] = y[8 + i];
    }
    lo = PackE2m1SignBit(y0);
    hi = PackE2m1SignBit(y1);
  }
  return scale_byte;
}

}  // namespace refit::kernels::dev

#endif  // REFIT_KERNELS_NVFP4_OP_CUH_
