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

}  // namespace refit::kernels::dev

#endif  // REFIT_KERNELS_NVFP4_OP_CUH_
