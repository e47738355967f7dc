// MXFP8 (TransformerEngine RCEIL, FORMATS.md B §5.2) and MXFP4 (triton_kernels ROUND_UP,
// B §7.2) quantize kernels: 1x32 blocks along the last dimension.
#include "kernels/flat_kernels.cuh"
#include "kernels/launch.h"

namespace refit::kernels {
namespace dev {
namespace {

// RN(a / 6) for a >= 0 or NaN. Markstein's correction of a * RN(1/6) is the correctly rounded
// quotient while a and the quotient are normal (and for a = 0); other inputs divide.
__device__ __forceinline__ float DivBy6(float a) {
  constexpr float kRcp6 = 0x1.555556p-3f;  // RN(1/6)
  if (B(a) - 0x21800000u <= 0x3C000000u || a == 0.0f) {  // a in [2^-60, 2^60], or 0
    const float q0 = a * kRcp6;
    return fmaf(fmaf(-q0, 6.0f, a), kRcp6, q0);
  }
  return __fdiv_rn(a, 6.0f);
}

struct Mxfp8Op {
  uint8_t* q;
  uint8_t* scales;
  unsigned long long* first_bad;

  __device__ __forceinline__ NoState Prepare() const { return {}; }

  template <launch::Input kIn, bool kVec>
  __device__ __forceinline__ void Process(NoState, int64_t chunk, int64_t elem, const uint4& raw,
                                          bool valid, int64_t n) const {
    constexpr int kC = Elems<kIn>::kCount;
    constexpr int kLanes = 32 / kC;
    float v[kC];
    uint32_t lane_amax = Decode<kIn>(raw, v);
    if (first_bad != nullptr && valid && lane_amax >= kInfBits) RecordNonfinite<kIn>(raw, elem, first_bad);
    const float a = F(GroupMax<kLanes>(lane_amax));
    const uint32_t e = formats::bits::E8m0CeilTe(a * (1.0f / 448.0f));
    const float m = formats::bits::Exp2Rcp(static_cast<uint8_t>(e));
    uint32_t w[kC / 4];
#pragma unroll
    for (int i = 0; i < kC / 4; ++i) {
      w[i] = E4m3x2(v[4 * i] * m, v[4 * i + 1] * m) |
             (E4m3x2(v[4 * i + 2] * m, v[4 * i + 3] * m) << 16);
    }
    if (!valid) return;
    if constexpr (kVec) {
      if constexpr (kC == 8) {
        *reinterpret_cast<uint2*>(q + elem) = make_uint2(w[0], w[1]);
      } else {
        *reinterpret_cast<uint32_t*>(q + elem) = w[0];
      }
    } else {
#pragma unroll
      for (int i = 0; i < kC; ++i) q[elem + i] = static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4)));
    }
    if (chunk % kLanes == 0) scales[elem / 32] = static_cast<uint8_t>(e);
  }
};

struct Mxfp4Op {
  uint8_t* blocks;
  uint8_t* scales;
  unsigned long long* first_bad;

  __device__ __forceinline__ NoState Prepare() const { return {}; }

  template <launch::Input kIn, bool kVec>
  __device__ __forceinline__ void Process(NoState, int64_t chunk, int64_t elem, const uint4& raw,
                                          bool valid, int64_t n) const {
    constexpr int kC = Elems<kIn>::kCount;
    constexpr int kLanes = 32 / kC;
    float v[kC];
    uint32_t lane_amax = Decode<kIn>(raw, v);
    if (first_bad != nullptr && valid && lane_amax >= kInfBits) RecordNonfinite<kIn>(raw, elem, first_bad);
    const float a = F(GroupMax<kLanes>(lane_amax));
    // d = a / 6; scale bits = (bits(d) + 0x7FFFFF) & 0x7F800000 (uint32 wrap as triton's int32).
    const uint32_t sbits = formats::bits::E8m0CeilTritonBits(DivBy6(a));
    // 1 / 2^e: exact by exponent arithmetic while both are normal; else the rounded reciprocal.
    const float qs = sbits - 0x00800000u <= 0x7E000000u ? F(0x7F000000u - sbits)
                                                         : (sbits == 0 ? 0.0f : __frcp_rn(F(sbits)));
    uint32_t packed;
    bool packed_done = false;
    if constexpr (kIn == launch::Input::kBf16) {
      // BF16 input and a normal power-of-two qs: x * qs is exact in BF16 (or, below BF16's
      // range, rounds to a value whose code is the same signed zero code), so the E2M1 rounding
      // runs on packed halves, two elements per instruction.
      if (sbits - 0x00800000u <= 0x7E000000u) {
        const uint32_t q2 = ((0x7F000000u - sbits) >> 16) * 0x00010001u;
        const uint32_t c0 = E2m1x2Bf16(MulBf16x2(raw.x, q2)), c1 = E2m1x2Bf16(MulBf16x2(raw.y, q2));
        const uint32_t c2 = E2m1x2Bf16(MulBf16x2(raw.z, q2)), c3 = E2m1x2Bf16(MulBf16x2(raw.w, q2));
        // Word i holds elements 2i (bits 0-3) and 2i+1 (bits 16-19); gather into nibbles.
        const uint32_t t01 = c0 | (c1 << 8), t23 = c2 | (c3 << 8);  // e0@0 e2@8 e1@16 e3@24
        packed = ((t01 | (t01 >> 12)) & 0xFFFFu) | (((t23 | (t23 >> 12)) & 0xFFFFu) << 16);
        packed_done = true;
      }
    }
    if (!packed_done) {
      float y[kC];
#pragma unroll
      for (int i = 0; i < kC; ++i) y[i] = v[i] * qs;
      packed = PackE2m1SignBit(y);
    }
    if (!valid) return;
    StorePackedNibbles<kC, kVec>(blocks, elem, packed);
    if (chunk % kLanes == 0) scales[elem / 32] = static_cast<uint8_t>(sbits >> 23);
  }
};

}  // namespace
}  // namespace dev

namespace launch {

int Mxfp8(const Src& src, uint8_t* q, uint8_t* scales, unsigned long long* first_bad, void* stream) {
  const bool vec = dev::Aligned(src.data, 16) && dev::Aligned(q, 8);
  return dev::LaunchFlat(src, vec, dev::Mxfp8Op{q, scales, first_bad}, stream);
}

int Mxfp4(const Src& src, uint8_t* blocks, uint8_t* scales, unsigned long long* first_bad,
          void* stream) {
  const bool vec = dev::Aligned(src.data, 16) && dev::Aligned(blocks, 4);
  return dev::LaunchFlat(src, vec, dev::Mxfp4Op{blocks, scales, first_bad}, stream);
}

}  // namespace launch
}  // namespace refit::kernels
