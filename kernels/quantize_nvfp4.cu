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

}  // namespace
}  // namespace dev

namespace launch {

int Nvfp4(const Src& src, bool te, const float* amax_dev, float amax_host, uint8_t* q,
          uint8_t* scales, float* scale_2, unsigned long long* first_bad, float claim,
          unsigned long long* claim_word, void* stream) {
  const bool vec = dev::Aligned(src.data, 16) && dev::Aligned(q, 4);
  // Reverse CTA order: after a forward amax pass, the tail of the tensor is still in L2.
  // launch_empty: an empty tensor still gets its weight_scale_2.
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
