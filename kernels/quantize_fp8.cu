// FP8 block-128 quantize kernels: DeepGEMM per_block_cast_to_fp8 (FORMATS.md B §4.2), with the
// UE8M0 variant and its canonicalization (B §4.4). One CTA per 128x128 tile: the tile is loaded
// into registers once (16-byte loads), its amax reduced across the CTA, then encoded and stored.
#include "kernels/launch.h"
#include "kernels/numerics.cuh"

namespace refit::kernels {
namespace dev {
namespace {

constexpr int kTileThreads = 256;

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
  uint32_t m = 0;
#pragma unroll
  for (int p = 0; p < kPasses; ++p) {
    float v[kC];
    const uint32_t lane_amax = Decode<kIn>(raw[p], v);
    m = max(m, lane_amax);
    const int64_t r = row0 + p * kRowsPerPass;
    if (first_bad != nullptr && lane_amax >= kInfBits && r < rows && col < cols) {
      RecordNonfinite(v, base + r * cols + col, first_bad);
    }
  }
  __shared__ uint32_t warp_max[kTileThreads / 32];
  __shared__ float tile_scale[2];
  m = __reduce_max_sync(0xFFFFFFFFu, m);
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t t = 0;
    for (int w = 0; w < kTileThreads / 32; ++w) t = max(t, warp_max[w]);
    const float raw_amax = F(t);
    // clamp(min=1e-4) keeps NaN, as torch does.
    const float a = raw_amax != raw_amax ? raw_amax : fmaxf(raw_amax, 1e-4f);
    float s = __fdiv_rn(a, 448.0f);
    float ratio = 1.0f;
    if constexpr (kUe8m0) {
      s = CeilUe8m0DeepGemm(s);
      // Canonicalization: M = max|q| = RNE_E4M3(fl(amax * (1/s))) (rounding is monotonic);
      // s' = ceil_ue8m0(max(M*s, 1e-4) / 448); q' = q * (s / s').
      const float M = E4m3ToFloat(E4m3(raw_amax * __frcp_rn(s)));
      const float s_new = CeilUe8m0DeepGemm(__fdiv_rn(fmaxf(M * s, 1e-4f), 448.0f));
      if (s_new == s_new && s_new != s) {
        ratio = __fdiv_rn(s, s_new);
        scale_inv[tile] = s_new;
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
    float v[kC];
    Decode<kIn>(raw[p], v);
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
          out |= E4m3(E4m3ToFloat((w[i] >> (8 * j)) & 0xFFu) * ratio) << (8 * j);
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
