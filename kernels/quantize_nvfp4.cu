// NVFP4 quantize kernels: ModelOpt NVFP4QTensor (FORMATS.md B §6.2) and TransformerEngine 1-D
// (B §6.3); 1x16 blocks, E4M3 block scales, one fp32 global scale per tensor (or fused group),
// plus the global amax reduction that the two-pass path runs first.
#include "kernels/flat_kernels.cuh"
#include "kernels/launch.h"
#include "kernels/nvfp4_op.cuh"

namespace refit::kernels {
namespace dev {
namespace {

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


#ifndef REFIT_KERNELS_NVFP4_BLOCKS
#define REFIT_KERNELS_NVFP4_BLOCKS 2
#endif
constexpr int kNvfp4Blocks = REFIT_KERNELS_NVFP4_BLOCKS;  // 1x16 blocks per thread and tile
#ifdef REFIT_KERNELS_NVFP4_FLAT_ONLY
constexpr bool kNvfp4BlockPath = false;  // measurement switch: every NVFP4 tensor on FlatKernel
#else
constexpr bool kNvfp4BlockPath = true;
#endif

// ModelOpt NVFP4, BF16 input, 16-byte aligned input and 8-byte aligned codes, fewer than 2^31
// blocks: one thread per block (Nvfp4BlockBf16), kNvfp4Blocks blocks per thread and tile.
// Persistent CTAs walk the tiles from the end of the tensor (what a preceding amax pass left in
// L2) and prefetch their next tile into registers, as FlatKernel does.
__global__ void __launch_bounds__(kFlatThreads) Nvfp4BlockKernel(const uint4* __restrict__ in, int32_t n_blocks,
                                                                  Nvfp4Op<false> op) {
  constexpr int32_t kPerTile = kFlatThreads * kNvfp4Blocks;
  const int32_t n_tiles = (n_blocks + kPerTile - 1) / kPerTile;
  int32_t i = blockIdx.x;
  if (i >= n_tiles) return;
  const Nvfp4State st = op.Prepare();
  if (blockIdx.x == 0 && threadIdx.x == 0) *op.scale_2 = st.global;
  uint4 cur[2 * kNvfp4Blocks], nxt[2 * kNvfp4Blocks];
  auto load = [&](int32_t tile, uint4(&buf)[2 * kNvfp4Blocks]) {
#pragma unroll
    for (int u = 0; u < kNvfp4Blocks; ++u) {
      const int32_t blk = tile * kPerTile + u * kFlatThreads + static_cast<int32_t>(threadIdx.x);
      if (blk < n_blocks) {
        buf[2 * u] = __ldg(in + 2 * static_cast<uint32_t>(blk));
        buf[2 * u + 1] = __ldg(in + 2 * static_cast<uint32_t>(blk) + 1);
      } else {
        buf[2 * u] = buf[2 * u + 1] = make_uint4(0, 0, 0, 0);
      }
    }
  };
  load(n_tiles - 1 - i, cur);
  for (; i < n_tiles; i += gridDim.x) {
    const int32_t tile = n_tiles - 1 - i;
    if (i + static_cast<int32_t>(gridDim.x) < n_tiles) load(n_tiles - 1 - (i + gridDim.x), nxt);
#pragma unroll
    for (int u = 0; u < kNvfp4Blocks; ++u) {
      const int32_t blk = tile * kPerTile + u * kFlatThreads + static_cast<int32_t>(threadIdx.x);
      uint32_t lo, hi;
      bool nonfinite;
      float block_max;
      const uint32_t scale_byte = Nvfp4BlockBf16(st, cur[2 * u], cur[2 * u + 1], lo, hi, nonfinite, block_max);
      if (blk < n_blocks) {
        // A trainer-supplied amax below this block's max|x| (as Nvfp4Op::Apply checks it).
        if (op.claim_word != nullptr && block_max > op.claim) {
          atomicMin(op.claim_word, (1ULL << 63) | static_cast<unsigned long long>(16 * static_cast<int64_t>(blk)));
        }
        if (nonfinite && op.first_bad != nullptr) {
          RecordNonfinite<launch::Input::kBf16>(cur[2 * u], 16 * static_cast<int64_t>(blk), op.first_bad);
          RecordNonfinite<launch::Input::kBf16>(cur[2 * u + 1], 16 * static_cast<int64_t>(blk) + 8, op.first_bad);
        }
        reinterpret_cast<uint2*>(op.q)[blk] = make_uint2(lo, hi);
        op.scales[blk] = static_cast<uint8_t>(scale_byte);
      }
    }
#pragma unroll
    for (int u = 0; u < 2 * kNvfp4Blocks; ++u) cur[u] = nxt[u];
  }
}

}  // namespace
}  // namespace dev

namespace launch {

int Nvfp4(const Src& src, bool te, const float* amax_dev, float amax_host, uint8_t* q,
          uint8_t* scales, float* scale_2, unsigned long long* first_bad, float claim,
          unsigned long long* claim_word, void* stream) {
  const bool vec = dev::Aligned(src.data, 16) && dev::Aligned(q, 4);
  // Reverse CTA order: after a forward amax pass, the tail of the tensor is still in L2.
  // launch_empty: an empty tensor still gets its weight_scale_2.
  // The block kernel's 32-bit block indices: n / 16 plus one tile must fit in int32.
  const int64_t n = src.batch * src.rows * src.cols;
  const int64_t per_tile = dev::kFlatThreads * dev::kNvfp4Blocks;
  if (dev::kNvfp4BlockPath && !te && src.input == Input::kBf16 && n > 0 && n % 16 == 0 &&
      n / 16 <= INT32_MAX - per_tile && dev::Aligned(src.data, 16) && dev::Aligned(q, 8)) {
    const auto kernel = dev::Nvfp4BlockKernel;
    const int64_t grid = dev::PersistentGrid(kernel, dev::kFlatThreads, (n / 16 + per_tile - 1) / per_tile);
    kernel<<<static_cast<unsigned>(grid), dev::kFlatThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const uint4*>(src.data), static_cast<int32_t>(n / 16),
        dev::Nvfp4Op<false>{amax_dev, amax_host, q, scales, scale_2, first_bad, claim, claim_word});
    return static_cast<int>(cudaGetLastError());
  }
  if (te) {
    return dev::LaunchFlat<true>(
        src, vec, dev::Nvfp4Op<true>{amax_dev, amax_host, q, scales, scale_2, first_bad, claim, claim_word}, stream, true);
  }
  return dev::LaunchFlat<true>(
      src, vec, dev::Nvfp4Op<false>{amax_dev, amax_host, q, scales, scale_2, first_bad, claim, claim_word}, stream, true);
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
