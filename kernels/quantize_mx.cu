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


// MXFP4 on BF16 input, one thread per 1x32 block: the thread loads the block's 64 bytes itself,
// so the block amax needs no shuffle and the scale is computed once per block instead of in each
// of the 4 lanes that share it in Mxfp4Op; the element arithmetic is Mxfp4Op's (same bytes).
// Returns the scale byte; `codes` gets the block's 16 bytes of nibbles.
__device__ __forceinline__ uint32_t Mxfp4BlockBf16(const uint4 (&r)[4], uint4& codes, bool& nonfinite) {
  uint32_t w[16];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    w[4 * c] = r[c].x;
    w[4 * c + 1] = r[c].y;
    w[4 * c + 2] = r[c].z;
    w[4 * c + 3] = r[c].w;
  }
  uint32_t m = 0;
#pragma unroll
  for (int k = 0; k < 16; ++k) m = MaxU16x2(m, w[k] & 0x7FFF7FFFu);
  const uint32_t a_bits = max(m << 16, m & 0xFFFF0000u);
  nonfinite = a_bits >= kInfBits;
  const uint32_t sbits = formats::bits::E8m0CeilTritonBits(DivBy6(F(a_bits)));
  uint32_t out[4];
  if (sbits - 0x00800000u <= 0x7E000000u) {
    const uint32_t q2 = ((0x7F000000u - sbits) >> 16) * 0x00010001u;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const uint32_t c0 = E2m1x2Bf16(MulBf16x2(w[4 * c], q2)), c1 = E2m1x2Bf16(MulBf16x2(w[4 * c + 1], q2));
      const uint32_t c2 = E2m1x2Bf16(MulBf16x2(w[4 * c + 2], q2)), c3 = E2m1x2Bf16(MulBf16x2(w[4 * c + 3], q2));
      const uint32_t t01 = c0 | (c1 << 8), t23 = c2 | (c3 << 8);
      out[c] = ((t01 | (t01 >> 12)) & 0xFFFFu) | (((t23 | (t23 >> 12)) & 0xFFFFu) << 16);
    }
  } else {
    const float qs = sbits - 0x00800000u <= 0x7E000000u ? F(0x7F000000u - sbits)
                                                         : (sbits == 0 ? 0.0f : __frcp_rn(F(sbits)));
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      float y[8];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        y[2 * k] = F(w[4 * c + k] << 16) * qs;
        y[2 * k + 1] = F(w[4 * c + k] & 0xFFFF0000u) * qs;
      }
      out[c] = PackE2m1SignBit(y);
    }
  }
  codes = make_uint4(out[0], out[1], out[2], out[3]);
  return sbits >> 23;
}

#ifndef REFIT_KERNELS_MXFP4_BLOCKS
#define REFIT_KERNELS_MXFP4_BLOCKS 2
#endif
constexpr int kMxfp4Blocks = REFIT_KERNELS_MXFP4_BLOCKS;  // 1x32 blocks per thread and tile
#ifdef REFIT_KERNELS_MXFP4_FLAT_ONLY
constexpr bool kMxfp4BlockPath = false;  // measurement switch: every MXFP4 tensor on FlatKernel
#else
constexpr bool kMxfp4BlockPath = true;
#endif

// BF16 input, 16-byte aligned input and output blocks, fewer than 2^30 blocks. Persistent CTAs
// prefetch their next tile into registers, as FlatKernel does.
__global__ void __launch_bounds__(kFlatThreads) Mxfp4BlockKernel(const uint4* __restrict__ in, int32_t n_blocks,
                                                                  uint4* __restrict__ blocks, uint8_t* scales,
                                                                  unsigned long long* first_bad) {
  constexpr int32_t kPerTile = kFlatThreads * kMxfp4Blocks;
  const int32_t n_tiles = (n_blocks + kPerTile - 1) / kPerTile;
  int32_t i = blockIdx.x;
  if (i >= n_tiles) return;
  uint4 cur[kMxfp4Blocks][4], nxt[kMxfp4Blocks][4];
  auto load = [&](int32_t tile, uint4(&buf)[kMxfp4Blocks][4]) {
#pragma unroll
    for (int u = 0; u < kMxfp4Blocks; ++u) {
      const int32_t blk = tile * kPerTile + u * kFlatThreads + static_cast<int32_t>(threadIdx.x);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        buf[u][c] = blk < n_blocks ? __ldg(in + 4 * static_cast<uint32_t>(blk) + c) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  load(i, cur);
  for (; i < n_tiles; i += gridDim.x) {
    if (i + static_cast<int32_t>(gridDim.x) < n_tiles) load(i + gridDim.x, nxt);
#pragma unroll
    for (int u = 0; u < kMxfp4Blocks; ++u) {
      const int32_t blk = i * kPerTile + u * kFlatThreads + static_cast<int32_t>(threadIdx.x);
      uint4 codes;
      bool nonfinite;
      const uint32_t scale = Mxfp4BlockBf16(cur[u], codes, nonfinite);
      if (blk < n_blocks) {
        if (nonfinite && first_bad != nullptr) {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            RecordNonfinite<launch::Input::kBf16>(cur[u][c], 32 * static_cast<int64_t>(blk) + 8 * c, first_bad);
          }
        }
        blocks[blk] = codes;
        scales[blk] = static_cast<uint8_t>(scale);
      }
    }
#pragma unroll
    for (int u = 0; u < kMxfp4Blocks; ++u) {
#pragma unroll
      for (int c = 0; c < 4; ++c) cur[u][c] = nxt[u][c];
    }
  }
}

}  // namespace
}  // namespace dev

namespace launch {

int Mxfp8(const Src& src, uint8_t* q, uint8_t* scales, unsigned long long* first_bad, void* stream) {
  const bool vec = dev::Aligned(src.data, 16) && dev::Aligned(q, 8);
  return dev::LaunchFlat(src, vec, dev::Mxfp8Op{q, scales, first_bad}, stream);
}

int Mxfp4(const Src& src, uint8_t* blocks, uint8_t* scales, unsigned long long* first_bad,
          void* stream) {
  // The block kernel indexes 16-byte input chunks in 32 bits (4 per block, plus one tile).
  const int64_t n = src.batch * src.rows * src.cols;
  const int64_t per_tile = dev::kFlatThreads * dev::kMxfp4Blocks;
  if (dev::kMxfp4BlockPath && src.input == Input::kBf16 && n > 0 && n % 32 == 0 &&
      n / 32 <= (int64_t{1} << 30) - per_tile && dev::Aligned(src.data, 16) && dev::Aligned(blocks, 16)) {
    const auto kernel = dev::Mxfp4BlockKernel;
    const int64_t grid = dev::PersistentGrid(kernel, dev::kFlatThreads, (n / 32 + per_tile - 1) / per_tile);
    kernel<<<static_cast<unsigned>(grid), dev::kFlatThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const uint4*>(src.data), static_cast<int32_t>(n / 32), reinterpret_cast<uint4*>(blocks), scales,
        first_bad);
    return static_cast<int>(cudaGetLastError());
  }
  const bool vec = dev::Aligned(src.data, 16) && dev::Aligned(blocks, 4);
  return dev::LaunchFlat(src, vec, dev::Mxfp4Op{blocks, scales, first_bad}, stream);
}

}  // namespace launch
}  // namespace refit::kernels
