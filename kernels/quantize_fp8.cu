// FP8 block-128 quantize kernels: DeepGEMM per_block_cast_to_fp8 (FORMATS.md B §4.2), with the
// UE8M0 variant and its canonicalization (B §4.4). A CTA owns one 128x128 tile at a time: the
// tile sits in registers (16-byte loads), its amax is reduced across the CTA, then it is encoded
// and stored while the CTA's next tile is already being loaded.
#include "kernels/launch.h"
#include "kernels/flat_kernels.cuh"

namespace refit::kernels {
namespace dev {
namespace {

#ifndef REFIT_KERNELS_FP8_TILE_THREADS
#define REFIT_KERNELS_FP8_TILE_THREADS 512
#endif
constexpr int kTileThreads = REFIT_KERNELS_FP8_TILE_THREADS;

// Tile coordinates (batch entry g, tile row tr, tile column tc) of the tiles a persistent CTA
// visits: blockIdx.x, then + gridDim.x each step. The first tile and the step are decomposed
// once (32-bit divisions; the launcher guarantees fewer than 2^32 tiles); each step is then a
// few adds with carries instead of two divisions and the 64-bit products they fed.
struct TileWalk {
  uint32_t tiles_r, tiles_c;
  uint32_t g, tr, tc;
  uint32_t step_g, step_tr, step_tc;

  __device__ static void Split(uint32_t t, uint32_t tiles_r, uint32_t tiles_c, uint32_t& g, uint32_t& tr,
                               uint32_t& tc) {
    g = t / (tiles_r * tiles_c);
    const uint32_t in_g = t - g * (tiles_r * tiles_c);
    tr = in_g / tiles_c;
    tc = in_g - tr * tiles_c;
  }
  __device__ TileWalk(const launch::Src& src, uint32_t first, uint32_t step) {
    tiles_r = static_cast<uint32_t>((src.rows + 127) / 128);
    tiles_c = static_cast<uint32_t>((src.cols + 127) / 128);
    Split(first, tiles_r, tiles_c, g, tr, tc);
    Split(step, tiles_r, tiles_c, step_g, step_tr, step_tc);
  }
  __device__ void Advance() {
    tc += step_tc;
    tr += step_tr;
    g += step_g;
    if (tc >= tiles_c) {
      tc -= tiles_c;
      ++tr;
    }
    if (tr >= tiles_r) {
      tr -= tiles_r;
      ++g;
    }
  }
};

// The chunks of one 128x128 tile this thread owns: column `col`, rows row0 + p*kRowsPerPass.
template <launch::Input kIn>
struct TileGeometry {
  static constexpr int kC = Elems<kIn>::kCount;
  static constexpr int kLanesPerRow = 128 / kC;                   // 16 (bf16) or 32 (fp32)
  static constexpr int kRowsPerPass = kTileThreads / kLanesPerRow;  // 32 or 16 (512 threads)
  static constexpr int kPasses = 128 / kRowsPerPass;                // 4 or 8 (512 threads)
  int64_t base, row0, col;
  bool full;  // the whole tile lies inside the tensor: no per-pass bounds checks

  __device__ TileGeometry(const launch::Src& src, const TileWalk& w) {
    const int64_t r = static_cast<int64_t>(w.tr) * 128, c = static_cast<int64_t>(w.tc) * 128;
    row0 = r + threadIdx.x / kLanesPerRow;
    col = c + (threadIdx.x % kLanesPerRow) * kC;
    base = static_cast<int64_t>(w.g) * src.rows * src.cols + row0 * src.cols + col;
    full = r + 128 <= src.rows && c + 128 <= src.cols;
  }
  __device__ bool Inside(const launch::Src& src, int p) const {
    return full || (row0 + p * kRowsPerPass < src.rows && col < src.cols);
  }
  __device__ int64_t Elem(const launch::Src& src, int p) const {
    return base + static_cast<int64_t>(p) * kRowsPerPass * src.cols;
  }
};

template <launch::Input kIn, bool kVec>
__device__ __forceinline__ void LoadTileChunks(const launch::Src& src, const TileGeometry<kIn>& t,
                                               uint4 (&raw)[TileGeometry<kIn>::kPasses]) {
  constexpr int kC = Elems<kIn>::kCount;
#pragma unroll
  for (int p = 0; p < TileGeometry<kIn>::kPasses; ++p) {
    const bool in = t.Inside(src, p);
    if constexpr (kVec) {
      raw[p] = in ? LoadVec(src.data, t.Elem(src, p) * Elems<kIn>::kBytes) : make_uint4(0, 0, 0, 0);
    } else {
      // Elements past the last column read as zero (the zero padding of a partial tile).
      const int64_t valid = in ? (src.cols - t.col < kC ? src.cols - t.col : kC) : 0;
      raw[p] = in ? LoadChunk<kIn, false>(static_cast<const char*>(src.data) + t.Elem(src, p) * Elems<kIn>::kBytes,
                                          0, valid)
                  : make_uint4(0, 0, 0, 0);
    }
  }
}

// Persistent CTAs walk the tiles; each prefetches its next tile into registers before reducing
// and encoding the current one, so memory latency overlaps the reduction and the stores.
template <launch::Input kIn, bool kVec, bool kUe8m0>
__global__ void __launch_bounds__(kTileThreads) Fp8TileKernel(launch::Src src, uint8_t* q,
                                                              float* scale_inv,
                                                              unsigned long long* first_bad) {
  using G = TileGeometry<kIn>;
  constexpr int kC = G::kC;
  constexpr int kPasses = G::kPasses;
  const int64_t n_tiles = src.batch * ((src.rows + 127) / 128) * ((src.cols + 127) / 128);
  int64_t tile = blockIdx.x;
  if (tile >= n_tiles) return;
  // Warp maxima of the current tile, double-buffered by tile parity so that one barrier per
  // tile suffices: a warp can only overwrite a buffer after every warp passed the next barrier,
  // i.e. after every warp read it.
  __shared__ uint32_t warp_max[2][2][kTileThreads / 32];
  int parity = 0;
  uint4 cur[kPasses], nxt[kPasses];
  TileWalk walk(src, static_cast<uint32_t>(tile), gridDim.x);
  LoadTileChunks<kIn, kVec>(src, G(src, walk), cur);
  for (; tile < n_tiles; tile += gridDim.x) {
    const G t(src, walk);
    walk.Advance();
    if (tile + gridDim.x < n_tiles) LoadTileChunks<kIn, kVec>(src, G(src, walk), nxt);
    // m: max|x| bits (NaN dominant). m_num: max over the non-NaN elements, which the UE8M0
    // canonicalization needs (NaN codes are left out of max|q|, as in the reference).
    uint32_t m = 0, m_num = 0;
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      float v[kC];
      const uint32_t lane_amax = Decode<kIn>(cur[p], v);
      m = max(m, lane_amax);
      if (lane_amax >= kInfBits) {
        if (first_bad != nullptr && t.Inside(src, p)) RecordNonfinite<kIn>(cur[p], t.Elem(src, p), first_bad);
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
    m = __reduce_max_sync(0xFFFFFFFFu, m);
    if constexpr (kUe8m0) m_num = __reduce_max_sync(0xFFFFFFFFu, m_num);
    if ((threadIdx.x & 31) == 0) {
      warp_max[parity][0][threadIdx.x / 32] = m;
      warp_max[parity][1][threadIdx.x / 32] = m_num;
    }
    __syncthreads();
    // Every thread reduces the warp maxima and derives the (identical) scale itself: no second
    // barrier, no thread waiting for thread 0's scalar arithmetic.
    constexpr int kWarps = kTileThreads / 32;
    const int lane = threadIdx.x & 31;
    const uint32_t all = __reduce_max_sync(0xFFFFFFFFu, lane < kWarps ? warp_max[parity][0][lane] : 0u);
    uint32_t num = 0;
    if constexpr (kUe8m0) {
      num = __reduce_max_sync(0xFFFFFFFFu, lane < kWarps ? warp_max[parity][1][lane] : 0u);
    }
    parity ^= 1;
    float rcp, ratio = 1.0f;
    {
      float a = F(all);
      // clamp(min=1e-4) keeps NaN, as torch does.
      if (!(a != a) && a < 1e-4f) a = 1e-4f;
      float s = __fdiv_rn(a, 448.0f);
      if (a != a) s = F(B(a) | 0x00400000u);  // keep the NaN's payload, as the CPU division does
      float stored = s;
      if constexpr (kUe8m0) {
        s = formats::bits::CeilToUe8m0DeepGemm(s);
        stored = s;
        // s = 2^k, k in [-126, 127]: 1/s by exponent arithmetic where it is normal (k < 127).
        rcp = B(s) <= 0x7E800000u ? F(0x7F000000u - B(s)) : __frcp_rn(s);
        // Canonicalization (B §4.4): max|q| over non-NaN codes is the code of max|x| * (1/s)
        // (RNE is monotonic); amax' = max|q| * s, clamped; s' = ceil_ue8m0(amax' / 448).
        const uint32_t max_code = E4m3Byte(F(num) * rcp) & 0x7F;
        float amax2 = E4m3Value(max_code) * s;
        if (amax2 < 1e-4f) amax2 = 1e-4f;
        const float s2 = formats::bits::CeilToUe8m0DeepGemm(__fdiv_rn(amax2, 448.0f));
        if (s2 < s) {
          ratio = __fdiv_rn(s, s2);
          stored = s2;
        }
      }
      if (threadIdx.x == 0) scale_inv[tile] = stored;
      if constexpr (!kUe8m0) rcp = __frcp_rn(s);
    }
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      if (!t.Inside(src, p)) continue;
      float v[kC];
      Decode<kIn>(cur[p], v);
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
            const uint32_t c2 = (c & 0x7F) == 0x7F ? c : E4m3Byte(E4m3Value(c) * ratio);
            out |= c2 << (8 * j);
          }
          w[i] = out;
        }
      }
      uint8_t* dst = q + t.Elem(src, p);
      if constexpr (kVec) {
        if constexpr (kC == 8) {
          *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
        } else {
          *reinterpret_cast<uint32_t*>(dst) = w[0];
        }
      } else {
#pragma unroll
        for (int i = 0; i < kC; ++i) {
          if (t.col + i < src.cols) dst[i] = static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4)));
        }
      }
    }
#pragma unroll
    for (int p = 0; p < kPasses; ++p) cur[p] = nxt[p];
  }
}

template <launch::Input kIn, bool kUe8m0>
void LaunchTiles(const launch::Src& src, bool vec, uint8_t* q, float* scale_inv,
                 unsigned long long* first_bad, cudaStream_t s) {
  const int64_t tiles = src.batch * ((src.rows + 127) / 128) * ((src.cols + 127) / 128);
  const auto kernel = vec ? Fp8TileKernel<kIn, true, kUe8m0> : Fp8TileKernel<kIn, false, kUe8m0>;
  const int64_t grid = PersistentGrid(kernel, kTileThreads, tiles);
  kernel<<<static_cast<unsigned>(grid), kTileThreads, 0, s>>>(src, q, scale_inv, first_bad);
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
  // The tile kernel indexes tiles (and tiles per batch entry) in 32 bits.
  const int64_t tiles = src.batch * ((src.rows + 127) / 128) * ((src.cols + 127) / 128);
  if (tiles > static_cast<int64_t>(UINT32_MAX)) return static_cast<int>(cudaErrorInvalidValue);
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
