// The compressed-tensors formats (formats/compressed_tensors.h) on the GPU, byte for byte the CPU
// reference: per-channel FP8 runs one CTA per row (the row's amax is a CTA reduction), per-tensor
// FP8 one thread per element with the resolved global amax, NVFP4 one thread per 16-block and
// W4A16 one thread per 128-group. Divisions and products use the _rn intrinsics, so nothing is
// contracted or approximated.
#include <cuda_runtime.h>

#include <cstdint>

#include "formats/bits.h"
#include "kernels/launch.h"

namespace refit::kernels {
namespace dev {
namespace {

namespace bits = formats::bits;

constexpr int kCtThreads = 256;
constexpr float kBf16Eps = 0.0078125f;        // torch.finfo(torch.bfloat16).eps
constexpr float kBf16Tiny = 1.17549435e-38f;  // torch.finfo(torch.bfloat16).tiny
constexpr uint8_t kE4m3Eighth = 0x20;         // 0.125

__device__ __forceinline__ float Load(const launch::Src& s, int64_t i) {
  if (s.input == launch::Input::kBf16) return bits::Bf16ToF32(static_cast<const uint16_t*>(s.data)[i]);
  const float f = static_cast<const float*>(s.data)[i];
  return s.input == launch::Input::kF32RoundBf16 ? bits::RoundToBf16(f) : f;
}

// Loads element i and records it in `first_bad` when it is not finite.
__device__ __forceinline__ float LoadChecked(const launch::Src& s, int64_t i, unsigned long long* first_bad) {
  const float v = Load(s, i);
  if (first_bad != nullptr && !bits::IsFinite(v)) atomicMin(first_bad, static_cast<unsigned long long>(i));
  return v;
}

// |v| as ordered bits: the max over them is max|x| with NaN dominating (bits::AbsMaxNan).
__device__ __forceinline__ uint32_t AbsBits(float v) { return bits::F32Bits(v) & 0x7FFFFFFFu; }

__device__ __forceinline__ float Bf16(float v) { return bits::RoundToBf16(v); }

__device__ __forceinline__ float SymmetricScale(float amax, float half_range) {
  const float s = Bf16(__fdiv_rn(amax, half_range));
  return s == 0.0f ? kBf16Eps : s;
}

__device__ __forceinline__ uint8_t Fp8Code(float x, float s) {
  return bits::F32ToE4m3(__fadd_rn(Bf16(__fdiv_rn(x, s)), 0.0f));
}

__device__ __forceinline__ uint8_t E2m1Code(float y) {
  if (bits::IsNan(y)) return 0;
  return static_cast<uint8_t>(bits::E2m1Magnitude(y) | (y < 0.0f ? 8 : 0));
}

__global__ void __launch_bounds__(kCtThreads)
    Fp8ChannelKernel(launch::Src src, uint8_t* q, uint16_t* scales, unsigned long long* first_bad) {
  __shared__ uint32_t red[kCtThreads];
  __shared__ float scale;
  const int64_t rows = src.batch * src.rows, k = src.cols;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    uint32_t m = 0;
    for (int64_t i = threadIdx.x; i < k; i += kCtThreads) m = max(m, AbsBits(LoadChecked(src, r * k + i, first_bad)));
    red[threadIdx.x] = m;
    __syncthreads();
    for (int w = kCtThreads / 2; w > 0; w >>= 1) {
      if (threadIdx.x < w) red[threadIdx.x] = max(red[threadIdx.x], red[threadIdx.x + w]);
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      scale = SymmetricScale(bits::F32FromBits(red[0]), 448.0f);
      scales[r] = bits::F32ToBf16(scale);
    }
    __syncthreads();
    const float s = scale;
    for (int64_t i = threadIdx.x; i < k; i += kCtThreads) q[r * k + i] = Fp8Code(Load(src, r * k + i), s);
    __syncthreads();  // red and scale are reused by the next row
  }
}

__global__ void __launch_bounds__(kCtThreads)
    Fp8TensorKernel(launch::Src src, const float* amax_dev, float amax_host, uint8_t* q, uint16_t* scale,
                    unsigned long long* first_bad, float claim, unsigned long long* claim_word) {
  const float s = SymmetricScale(amax_dev != nullptr ? *amax_dev : amax_host, 448.0f);
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale = bits::F32ToBf16(s);
  const int64_t n = src.batch * src.rows * src.cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kCtThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kCtThreads) {
    const float v = LoadChecked(src, i, first_bad);
    if (claim_word != nullptr && bits::AbsF(v) > claim) {
      atomicMin(claim_word, (1ULL << 63) | static_cast<unsigned long long>(i));
    }
    q[i] = Fp8Code(v, s);
  }
}

__global__ void __launch_bounds__(kCtThreads)
    Nvfp4Kernel(launch::Src src, const float* amax_dev, float amax_host, uint8_t* packed, uint8_t* scales,
                float* global_scale, unsigned long long* first_bad, float claim, unsigned long long* claim_word) {
  float a = amax_dev != nullptr ? *amax_dev : amax_host;
  a = a < kBf16Tiny ? kBf16Tiny : a;
  float g = Bf16(__fmul_rn(Bf16(__frcp_rn(a)), 2688.0f));
  if (!bits::IsFinite(g)) g = 1.0f;
  if (blockIdx.x == 0 && threadIdx.x == 0) *global_scale = g;
  const int64_t blocks = src.batch * src.rows * src.cols / 16;
  for (int64_t b = blockIdx.x * static_cast<int64_t>(kCtThreads) + threadIdx.x; b < blocks;
       b += static_cast<int64_t>(gridDim.x) * kCtThreads) {
    float x[16];
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      x[i] = LoadChecked(src, 16 * b + i, first_bad);
      m = max(m, AbsBits(x[i]));
    }
    const float bmax = bits::F32FromBits(m);
    if (claim_word != nullptr && bmax > claim) {
      atomicMin(claim_word, (1ULL << 63) | static_cast<unsigned long long>(16 * b));
    }
    uint8_t sc = bits::F32ToE4m3(__fmul_rn(g, Bf16(__fdiv_rn(bmax, 6.0f))));
    if (bits::E4m3ToF32(sc) == 0.0f) sc = kE4m3Eighth;
    const float d = __fdiv_rn(bits::E4m3ToF32(sc), g);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      packed[8 * b + j] =
          static_cast<uint8_t>(E2m1Code(__fdiv_rn(x[2 * j], d)) | (E2m1Code(__fdiv_rn(x[2 * j + 1], d)) << 4));
    }
    scales[b] = sc;
  }
}

__global__ void __launch_bounds__(kCtThreads) W4a16Kernel(launch::Src src, int rank, uint32_t* words, uint16_t* scales,
                                                          int64_t* shape, unsigned long long* first_bad) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const int64_t dims[3] = {src.batch, src.rows, src.cols};
    for (int d = 0; d < rank; ++d) shape[d] = dims[3 - rank + d];
  }
  const int64_t groups = src.batch * src.rows * src.cols / 128;
  for (int64_t b = blockIdx.x * static_cast<int64_t>(kCtThreads) + threadIdx.x; b < groups;
       b += static_cast<int64_t>(gridDim.x) * kCtThreads) {
    uint32_t m = 0;
    for (int i = 0; i < 128; ++i) m = max(m, AbsBits(LoadChecked(src, 128 * b + i, first_bad)));
    const float s = SymmetricScale(bits::F32FromBits(m), 7.5f);
    scales[b] = bits::F32ToBf16(s);
    for (int w = 0; w < 16; ++w) {
      uint32_t word = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float y = __fadd_rn(Bf16(__fdiv_rn(Load(src, 128 * b + 8 * w + j), s)), 0.0f);
        y = y < -8.0f ? -8.0f : (y > 7.0f ? 7.0f : y);
        const int qv = bits::IsNan(y) ? 0 : static_cast<int>(rintf(y));
        word |= static_cast<uint32_t>(qv + 8) << (4 * j);
      }
      words[16 * b + w] = word;
    }
  }
}

unsigned GridFor(int64_t work) {
  const int64_t ctas = (work + kCtThreads - 1) / kCtThreads;
  return static_cast<unsigned>(ctas < 1 ? 1 : (ctas > 65535 ? 65535 : ctas));
}

}  // namespace
}  // namespace dev

namespace launch {

int CtFp8Channel(const Src& src, uint8_t* q, uint16_t* scales, unsigned long long* first_bad, void* stream) {
  const int64_t rows = src.batch * src.rows;
  if (rows == 0) return 0;
  const unsigned grid = static_cast<unsigned>(rows < 65535 ? rows : 65535);
  dev::Fp8ChannelKernel<<<grid, dev::kCtThreads, 0, static_cast<cudaStream_t>(stream)>>>(src, q, scales, first_bad);
  return static_cast<int>(cudaGetLastError());
}

int CtFp8Tensor(const Src& src, const float* amax_dev, float amax_host, uint8_t* q, uint16_t* scale,
                unsigned long long* first_bad, float claim, unsigned long long* claim_word, void* stream) {
  dev::Fp8TensorKernel<<<dev::GridFor(src.batch * src.rows * src.cols), dev::kCtThreads, 0,
                         static_cast<cudaStream_t>(stream)>>>(src, amax_dev, amax_host, q, scale, first_bad, claim,
                                                              claim_word);
  return static_cast<int>(cudaGetLastError());
}

int CtNvfp4(const Src& src, const float* amax_dev, float amax_host, uint8_t* packed, uint8_t* scales,
            float* global_scale, unsigned long long* first_bad, float claim, unsigned long long* claim_word,
            void* stream) {
  dev::Nvfp4Kernel<<<dev::GridFor(src.batch * src.rows * src.cols / 16), dev::kCtThreads, 0,
                     static_cast<cudaStream_t>(stream)>>>(src, amax_dev, amax_host, packed, scales, global_scale,
                                                          first_bad, claim, claim_word);
  return static_cast<int>(cudaGetLastError());
}

int CtW4a16(const Src& src, int rank, uint32_t* words, uint16_t* scales, int64_t* shape, unsigned long long* first_bad,
            void* stream) {
  // Rank 4 and above: the [batch, rows, cols] view no longer holds the leading dimensions.
  if (rank < 2 || rank > 3) return static_cast<int>(cudaErrorInvalidValue);
  dev::W4a16Kernel<<<dev::GridFor(src.batch * src.rows * src.cols / 128), dev::kCtThreads, 0,
                     static_cast<cudaStream_t>(stream)>>>(src, rank, words, scales, shape, first_bad);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace launch
}  // namespace refit::kernels
