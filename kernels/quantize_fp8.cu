// FP8 block-128 quantize kernels: DeepGEMM per_block_cast_to_fp8 (FORMATS.md B §4.2), with the
// UE8M0 variant and its canonicalization (B §4.4). One CTA per 128x128 tile: the tile is loaded
// into registers once (16-byte loads), its amax reduced across the CTA, then encoded and stored.
#include "kernels/launch.h"
#include "kernels/numerics.cuh"

namespace refit::kernels {
namespace dev {
namespace {

constexpr int kTileThreads = 256;

// A 16-byte load the compiler may not merge with an earlier load of the same address.
__device__ __forceinline__ uint4 ReloadVec(const void* base, int64_t byte_offset) {
  uint4 r;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(static_cast<const char*>(base) + byte_offset));
  return r;
}

template <launch::Input kIn, bool kVec, bool kUe8m0>
__global__ void __launch_bounds__(kTileThreads) Fp8TileKernel(launch::Src src, uint8_t* q,
                                                              float* scale_inv,
                                                              unsigned long long* first_bad) {
  constexpr int kC = Elems<kIn>::kCount;
  constexpr int kLanesPerRow = 128 / kC;                   // 16 (bf16) or 32 (fp32)
  constexpr int kRowsPerPass = kTileThreads / kLanesPerRow;  // 16 or 8
  constexpr int kPasses = 128 / kRowsPerPass;                // 8 or 16
  const int64_t rows = src.rows, cols = src.cols;
  const int64_t tiles_r = (rows + 127) / 128, tiles_c = (cols + 127) / 128;
  const int64_t tile = blockIdx.x;
  const int64_t g = tile / (tiles_r * tiles_c);
  const int64_t tr = (tile / tiles_c) % tiles_r, tc = tile % tiles_c;
  const int64_t col = tc * 128 + (threadIdx.x % kLanesPerRow) * kC;
  const int64_t row0 = tr * 128 + threadIdx.x / kLanesPerRow;
  const int64_t base = g * rows * cols;

  uint4 raw[kPasses];
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int64_t r = row0 + p * kRowsPerPass;
    const bool in = r < rows && col < cols;
    if constexpr (kVec) {
      raw[p] = in ? LoadVec(src.data, (base + r * cols + col) * Elems<kIn>::kBytes)
                  : make_uint4(0, 0, 0, 0);
    } else {
      // Elements past the last column read as zero (the zero padding of a partial tile).
      const int64_t valid = in ? (cols - col < kC ? cols - col : kC) : 0;
      raw[p] = LoadChunk<kIn, false>(static_cast<const char*>(src.data) +
                                         (base + r * cols + col) * Elems<kIn>::kBytes * (in ? 1 : 0),
                                     0, valid);
    }
  }
  // m: max|x| bits (NaN dominant). m_num: max over the non-NaN elements, which the UE8M0
  // canonicalization needs (NaN codes are left out of max|q|, as in the reference).
  uint32_t m = 0, m_num = 0;
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    float v[kC];
    const uint32_t lane_amax = Decode<kIn>(raw[p], v);
    m = max(m, lane_amax);
    if (lane_amax >= kInfBits) {
      const int64_t r = row0 + p * kRowsPerPass;
      if (first_bad != nullptr && r < rows && col < cols) RecordNonfinite(v, base + r * cols + col, first_bad);
      if constexpr (kUe8m0) {
#pragma unroll
        for (int i = 0; i < kC; ++i) {
          const uint32_t a = B(v[i]) & kAbsMask;
          if (a <= kInfBits) m_num = max(m_num, a);
        }
      }
    } else {
      m_num = max(m_num, lane_amax);
    }
  }
  __shared__ uint32_t warp_max[2][kTileThreads / 32];
  __shared__ float tile_scale[2];
  m = __reduce_max_sync(0xFFFFFFFFu, m);
  if constexpr (kUe8m0) m_num = __reduce_max_sync(0xFFFFFFFFu, m_num);
  if ((threadIdx.x & 31) == 0) {
    warp_max[0][threadIdx.x / 32] = m;
    warp_max[1][threadIdx.x / 32] = m_num;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t t = 0, t_num = 0;
    for (int w = 0; w < kTileThreads / 32; ++w) {
      t = max(t, warp_max[0][w]);
      t_num = max(t_num, warp_max[1][w]);
    }
    float a = F(t);
    // clamp(min=1e-4) keeps NaN, as torch does.
    if (!(a != a) && a < 1e-4f) a = 1e-4f;
    float s = __fdiv_rn(a, 448.0f);
    if (a != a) s = F(B(a) | 0x00400000u);  // keep the NaN's payload, as the CPU division does
    float ratio = 1.0f;
    if constexpr (kUe8m0) {
      s = formats::bits::CeilToUe8m0DeepGemm(s);
      // Canonicalization (B §4.4): max|q| over non-NaN codes is the code of max|x| * (1/s)
      // (RNE is monotonic); amax' = max|q| * s, clamped; s' = ceil_ue8m0(amax' / 448).
      const uint8_t max_code = formats::bits::F32ToE4m3(F(t_num) * __frcp_rn(s)) & 0x7F;
      float amax2 = formats::bits::E4m3ToF32(max_code) * s;
      if (amax2 < 1e-4f) amax2 = 1e-4f;
      const float s2 = formats::bits::CeilToUe8m0DeepGemm(__fdiv_rn(amax2, 448.0f));
      if (s2 < s) {
        ratio = __fdiv_rn(s, s2);
        scale_inv[tile] = s2;
      } else {
        scale_inv[tile] = s;
      }
    } else {
      scale_inv[tile] = s;
    }
    tile_scale[0] = __frcp_rn(s);
    tile_scale[1] = ratio;
  }
  __syncthreads();
  const float rcp = tile_scale[0], ratio = tile_scale[1];
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    const int64_t r = row0 + p * kRowsPerPass;
    if (!(r < rows && col < cols)) continue;
    // Re-read the chunk (an L1/L2 hit: this CTA read it moments ago) rather than keeping the
    // whole tile in registers, which would cap occupancy at two CTAs per SM.
    uint4 chunk;
    if constexpr (kVec) {
      chunk = ReloadVec(src.data, (base + r * cols + col) * Elems<kIn>::kBytes);
    } else {
      const int64_t valid = cols - col < kC ? cols - col : kC;
      chunk = LoadChunk<kIn, false>(static_cast<const char*>(src.data) + (base + r * cols + col) * Elems<kIn>::kBytes,
                                    0, valid);
    }
    float v[kC];
    Decode<kIn>(chunk, v);
    uint32_t w[kC / 4];
#pragma unroll
    for (int i = 0; i < kC / 4; ++i) {
      w[i] = E4m3x2(v[4 * i] * rcp, v[4 * i + 1] * rcp) |
             (E4m3x2(v[4 * i + 2] * rcp, v[4 * i + 3] * rcp) << 16);
    }
    if (kUe8m0 && ratio != 1.0f) {
#pragma unroll
      for (int i = 0; i < kC / 4; ++i) {
        uint32_t out = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint8_t c = static_cast<uint8_t>(w[i] >> (8 * j));
          const uint32_t c2 = (c & 0x7F) == 0x7F
                                  ? c
                                  : formats::bits::F32ToE4m3(formats::bits::E4m3ToF32(c) * ratio);
          out |= c2 << (8 * j);
        }
        w[i] = out;
      }
    }
    uint8_t* dst = q + base + r * cols + col;
    if constexpr (kVec) {
      if constexpr (kC == 8) {
        *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
      } else {
        *reinterpret_cast<uint32_t*>(dst) = w[0];
      }
    } else {
#pragma unroll
      for (int i = 0; i < kC; ++i) {
        if (col + i < cols) dst[i] = static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4)));
      }
    }
  }
}

template <launch::Input kIn, bool kUe8m0>
void LaunchTiles(const launch::Src& src, bool vec, uint8_t* q, float* scale_inv,
                 unsigned long long* first_bad, cudaStream_t s) {
  const int64_t tiles = src.batch * ((src.rows + 127) / 128) * ((src.cols + 127) / 128);
  if (vec) {
    Fp8TileKernel<kIn, true, kUe8m0>
        <<<static_cast<unsigned>(tiles), kTileThreads, 0, s>>>(src, q, scale_inv, first_bad);
  } else {
    Fp8TileKernel<kIn, false, kUe8m0>
        <<<static_cast<unsigned>(tiles), kTileThreads, 0, s>>>(src, q, scale_inv, first_bad);
  }
}

template <launch::Input kIn>
void LaunchTiles(const launch::Src& src, bool ue8m0, bool vec, uint8_t* q, float* scale_inv,
                 unsigned long long* first_bad, cudaStream_t s) {
  if (ue8m0) {
    LaunchTiles<kIn, true>(src, vec, q, scale_inv, first_bad, s);
  } else {
    LaunchTiles<kIn, false>(src, vec, q, scale_inv, first_bad, s);
  }
}

}  // namespace
}  // namespace dev

namespace launch {

int Fp8Block128(const Src& src, bool ue8m0, uint8_t* q, float* scale_inv,
                unsigned long long* first_bad, void* stream) {
  if (src.batch * src.rows * src.cols == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  const int kC = src.input == Input::kBf16 ? 8 : 4;
  const bool vec = reinterpret_cast<uintptr_t>(src.data) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(q) % 8 == 0 && src.cols % 8 == 0 && kC > 0;
  switch (src.input) {
    case Input::kBf16: dev::LaunchTiles<Input::kBf16>(src, ue8m0, vec, q, scale_inv, first_bad, s); break;
    case Input::kF32: dev::LaunchTiles<Input::kF32>(src, ue8m0, vec, q, scale_inv, first_bad, s); break;
    case Input::kF32RoundBf16:
      dev::LaunchTiles<Input::kF32RoundBf16>(src, ue8m0, vec, q, scale_inv, first_bad, s);
      break;
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace launch
}  // namespace refit::kernels
