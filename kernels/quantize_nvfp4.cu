// NVFP4 quantize kernels: ModelOpt NVFP4QTensor (FORMATS.md B §6.2) and TransformerEngine 1-D
// (B §6.3); 1x16 blocks, E4M3 block scales, one fp32 global scale per tensor (or fused group),
// plus the global amax reduction that the two-pass path runs first.
#include <cfloat>

#include "kernels/flat_kernels.cuh"
#include "kernels/launch.h"

namespace refit::kernels {
namespace dev {
namespace {

// Per-thread scalars of the global scale, computed once per thread (Nvfp4Op::Prepare).
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
    if constexpr (kVec) {
      if constexpr (kC == 8) {
        *reinterpret_cast<uint32_t*>(q + elem / 2) = packed;
      } else {
        *reinterpret_cast<uint16_t*>(q + elem / 2) = static_cast<uint16_t>(packed);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kC / 2; ++i) q[elem / 2 + i] = static_cast<uint8_t>(packed >> (8 * i));
    }
    if (chunk % kLanes == 0) scales[elem / 16] = static_cast<uint8_t>(scale_byte);
  }
};

// Grid-stride max|x| over the tensor; one atomicMax of the fp32 bits per warp. Read-only, so
// it keeps more loads in flight per thread than the quantize kernels.
constexpr int kAmaxUnroll = 8;

template <launch::Input kIn, bool kVec>
__global__ void __launch_bounds__(kFlatThreads) AmaxKernel(const void* in, int64_t n,
                                                            int64_t n_chunks, uint32_t* out) {
  constexpr int kC = Elems<kIn>::kCount;
  uint32_t m = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kFlatThreads * kAmaxUnroll;
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * kFlatThreads * kAmaxUnroll + threadIdx.x;
       first < n_chunks; first += stride) {
    uint4 raw[kAmaxUnroll];
#pragma unroll
    for (int u = 0; u < kAmaxUnroll; ++u) {
      const int64_t c = first + u * kFlatThreads;
      raw[u] = c < n_chunks ? LoadChunk<kIn, kVec>(in, c * kC, n) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kAmaxUnroll; ++u) {
      float v[kC];
      m = max(m, Decode<kIn>(raw[u], v));
    }
  }
  m = __reduce_max_sync(0xFFFFFFFFu, m);
  if ((threadIdx.x & 31) == 0 && m != 0) atomicMax(out, m);
}

template <launch::Input kIn>
void LaunchAmax(const launch::Src& src, bool vec, uint32_t* out, cudaStream_t s) {
  const int64_t n = src.batch * src.rows * src.cols;
  const int64_t n_chunks = (n + Elems<kIn>::kCount - 1) / Elems<kIn>::kCount;
  int device = 0, sms = 132;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const int64_t per_cta = kFlatThreads * kAmaxUnroll;
  const int64_t grid = std::min<int64_t>((n_chunks + per_cta - 1) / per_cta, static_cast<int64_t>(sms) * 8);
  if (vec) {
    AmaxKernel<kIn, true><<<static_cast<unsigned>(grid), kFlatThreads, 0, s>>>(src.data, n, n_chunks, out);
  } else {
    AmaxKernel<kIn, false><<<static_cast<unsigned>(grid), kFlatThreads, 0, s>>>(src.data, n, n_chunks, out);
  }
}

}  // namespace
}  // namespace dev

namespace launch {

int Nvfp4(const Src& src, bool te, const float* amax_dev, float amax_host, uint8_t* q,
          uint8_t* scales, float* scale_2, unsigned long long* first_bad, void* stream) {
  const bool vec = dev::Aligned(src.data, 16) && dev::Aligned(q, 4);
  // Reverse CTA order: after a forward amax pass, the tail of the tensor is still in L2.
  // launch_empty: an empty tensor still gets its weight_scale_2.
  if (te) {
    return dev::LaunchFlat<true>(
        src, vec, dev::Nvfp4Op<true>{amax_dev, amax_host, q, scales, scale_2, first_bad}, stream, true);
  }
  return dev::LaunchFlat<true>(
      src, vec, dev::Nvfp4Op<false>{amax_dev, amax_host, q, scales, scale_2, first_bad}, stream, true);
}

int AccumulateAmax(const Src& src, float* amax_dev, void* stream) {
  const int64_t n = src.batch * src.rows * src.cols;
  if (n == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  auto* out = reinterpret_cast<uint32_t*>(amax_dev);
  const bool vec = dev::Aligned(src.data, 16) &&
                   n % (src.input == Input::kBf16 ? 8 : 4) == 0;
  switch (src.input) {
    case Input::kBf16: dev::LaunchAmax<Input::kBf16>(src, vec, out, s); break;
    case Input::kF32: dev::LaunchAmax<Input::kF32>(src, vec, out, s); break;
    case Input::kF32RoundBf16: dev::LaunchAmax<Input::kF32RoundBf16>(src, vec, out, s); break;
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace launch
}  // namespace refit::kernels
