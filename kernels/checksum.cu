// Device twin of refit::ParallelChecksum64 (src/common/parallel_checksum.h): an order-free sum
// of mixed, position-keyed 64-bit words, reduced per warp and added atomically, then finalized.
#include <algorithm>

#include "common/parallel_checksum.h"
#include "kernels/launch.h"
#include "kernels/numerics.cuh"

namespace refit::kernels {
namespace dev {
namespace {

constexpr int kSumThreads = 256;

__device__ __forceinline__ uint64_t Term(uint64_t w, uint64_t i) {
  return ParallelChecksumMix(w + (i + 1) * kParallelChecksumPosition);
}

// Words [0, 2 * vec_units) are read as 16-byte vectors; the rest byte by byte.
__global__ void __launch_bounds__(kSumThreads) SumKernel(const unsigned char* p, uint64_t bytes,
                                                          uint64_t vec_units,
                                                          unsigned long long* acc) {
  uint64_t s = 0;
  const uint64_t tid = static_cast<uint64_t>(blockIdx.x) * kSumThreads + threadIdx.x;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * kSumThreads;
  for (uint64_t u = tid; u < vec_units; u += stride) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + u);
    s += Term((static_cast<uint64_t>(v.y) << 32) | v.x, 2 * u);
    s += Term((static_cast<uint64_t>(v.w) << 32) | v.z, 2 * u + 1);
  }
  const uint64_t words = (bytes + 7) / 8;
  for (uint64_t i = 2 * vec_units + tid; i < words; i += stride) {
    uint64_t w = 0;
    for (uint64_t j = 0; j < 8 && 8 * i + j < bytes; ++j) w |= static_cast<uint64_t>(p[8 * i + j]) << (8 * j);
    s += Term(w, i);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
  if ((threadIdx.x & 31) == 0 && s != 0) atomicAdd(acc, static_cast<unsigned long long>(s));
}

__global__ void FinalizeKernel(unsigned long long* acc, uint64_t bytes, uint64_t seed) {
  *acc = ParallelChecksumMix(*acc ^ ParallelChecksumMix(seed + bytes));
}

}  // namespace
}  // namespace dev

namespace launch {

int Checksum(const void* data, uint64_t bytes, uint64_t seed, unsigned long long* result,
             void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaMemsetAsync(result, 0, sizeof(*result), s);
  if (err != cudaSuccess) return static_cast<int>(err);
  const uint64_t vec_units = reinterpret_cast<uintptr_t>(data) % 16 == 0 ? bytes / 16 : 0;
  if (bytes > 0) {
    int device = 0, sms = 132;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    const uint64_t units = vec_units > 0 ? vec_units : (bytes + 7) / 8;
    const uint64_t grid = std::min<uint64_t>((units + dev::kSumThreads - 1) / dev::kSumThreads,
                                             static_cast<uint64_t>(sms) * 8);
    dev::SumKernel<<<static_cast<unsigned>(grid), dev::kSumThreads, 0, s>>>(
        static_cast<const unsigned char*>(data), bytes, vec_units, result);
  }
  dev::FinalizeKernel<<<1, 1, 0, s>>>(result, bytes, seed);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace launch
}  // namespace refit::kernels
