// Engine-side scale layouts (FORMATS.md B §8): DeepGEMM's MN-major TMA-aligned packed UE8M0
// int32 scales (B §8.6) and the 128x4 swizzled block-scale layout (B §8.1).
#include "kernels/launch.h"
#include "kernels/numerics.cuh"

namespace refit::kernels {
namespace dev {
namespace {

constexpr int kLayoutThreads = 256;

// One thread per output word (g, p, r) at offset g*A*kp + p*A + r, A = align(mn, 4).
__global__ void PackUe8m0Kernel(const float* sf, int64_t groups, int64_t mn, int64_t kb,
                                int gran_mn, int32_t* out, unsigned long long* first_bad) {
  const int64_t A = (mn + 3) / 4 * 4, kp = (kb + 3) / 4;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kLayoutThreads + threadIdx.x;
  if (idx >= groups * A * kp) return;
  const int64_t g = idx / (A * kp), p = (idx / A) % kp, r = idx % A;
  uint32_t word = 0;
  if (r < mn) {
    const int64_t sf_rows = (mn + gran_mn - 1) / gran_mn;
    const float* row = sf + (g * sf_rows + r / gran_mn) * kb;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t k = 4 * p + j;
      if (k < kb) {
        const uint32_t bits = B(row[k]);
        if ((bits & 0x807FFFFFu) != 0 && first_bad != nullptr) {
          atomicMin(first_bad, static_cast<unsigned long long>((g * sf_rows + r / gran_mn) * kb + k));
        }
        word |= (bits >> 23 & 0xFFu) << (8 * j);
      }
    }
  }
  out[idx] = static_cast<int32_t>(word);
}

// One thread per output 4-byte group of the padded [batch, Mp, Kp] swizzled buffer.
__global__ void Swizzle128x4Kernel(const uint8_t* s, int64_t batch, int64_t rows, int64_t cols,
                                   uint8_t* out) {
  const int64_t mp = (rows + 127) / 128 * 128, kp = (cols + 3) / 4 * 4;
  const int64_t words = batch * mp * kp / 4;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kLayoutThreads + threadIdx.x;
  if (idx >= words) return;
  const int64_t b = idx / (mp * kp / 4);
  const int64_t w = idx % (mp * kp / 4);
  const int64_t tile = w / 128, in_tile = w % 128;
  const int64_t k4 = tile % (kp / 4), m_tile = tile / (kp / 4);
  // Within a tile, word (m%32)*4 + (m%128)/32 holds row m, columns 4*k4 .. 4*k4+3.
  const int64_t m = m_tile * 128 + (in_tile % 4) * 32 + in_tile / 4;
  uint32_t word = 0;
  if (m < rows) {
    const uint8_t* src = s + (b * rows + m) * cols;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t k = 4 * k4 + j;
      if (k < cols) word |= static_cast<uint32_t>(src[k]) << (8 * j);
    }
  }
  reinterpret_cast<uint32_t*>(out + b * mp * kp)[w] = word;
}

// Tiled transpose of the last two dims: out[b, j, i] = in[b, i, j], 32x32 tiles through shared
// memory so that both the reads and the writes are coalesced. T is the element's storage type.
constexpr int kTile = 32;
template <typename T>
__global__ void TransposeKernel(const T* in, int64_t rows, int64_t cols, T* out) {
  __shared__ T tile[kTile][kTile + 1];
  const int64_t b = blockIdx.z;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile, c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const T* src = in + b * rows * cols;
  T* dst = out + b * rows * cols;
  for (int y = threadIdx.y; y < kTile; y += blockDim.y) {
    const int64_t r = r0 + y, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[y][threadIdx.x] = src[r * cols + c];
  }
  __syncthreads();
  for (int y = threadIdx.y; y < kTile; y += blockDim.y) {
    const int64_t c = c0 + y, r = r0 + threadIdx.x;
    if (r < rows && c < cols) dst[c * rows + r] = tile[threadIdx.x][y];
  }
}

}  // namespace
}  // namespace dev

namespace launch {

int PackUe8m0(const float* sf, int64_t groups, int64_t mn, int64_t kb, int gran_mn, int32_t* out,
              unsigned long long* first_bad, void* stream) {
  const int64_t words = groups * ((mn + 3) / 4 * 4) * ((kb + 3) / 4);
  if (words == 0) return 0;
  const unsigned grid = static_cast<unsigned>((words + dev::kLayoutThreads - 1) / dev::kLayoutThreads);
  dev::PackUe8m0Kernel<<<grid, dev::kLayoutThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      sf, groups, mn, kb, gran_mn, out, first_bad);
  return static_cast<int>(cudaGetLastError());
}

int Swizzle128x4(const uint8_t* s, int64_t batch, int64_t rows, int64_t cols, uint8_t* out,
                 void* stream) {
  const int64_t words = batch * ((rows + 127) / 128 * 128) * ((cols + 3) / 4 * 4) / 4;
  if (words == 0) return 0;
  const unsigned grid = static_cast<unsigned>((words + dev::kLayoutThreads - 1) / dev::kLayoutThreads);
  dev::Swizzle128x4Kernel<<<grid, dev::kLayoutThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      s, batch, rows, cols, out);
  return static_cast<int>(cudaGetLastError());
}

int TransposeLast2(const void* in, int64_t batch, int64_t rows, int64_t cols, int elem_bytes, void* out,
                   void* stream) {
  if (batch == 0 || rows == 0 || cols == 0) return 0;
  const dim3 grid(static_cast<unsigned>((cols + dev::kTile - 1) / dev::kTile),
                  static_cast<unsigned>((rows + dev::kTile - 1) / dev::kTile), static_cast<unsigned>(batch));
  const dim3 block(dev::kTile, 8);
  auto s = static_cast<cudaStream_t>(stream);
  switch (elem_bytes) {
    case 1:
      dev::TransposeKernel<<<grid, block, 0, s>>>(static_cast<const uint8_t*>(in), rows, cols, static_cast<uint8_t*>(out));
      break;
    case 2:
      dev::TransposeKernel<<<grid, block, 0, s>>>(static_cast<const uint16_t*>(in), rows, cols, static_cast<uint16_t*>(out));
      break;
    case 4:
      dev::TransposeKernel<<<grid, block, 0, s>>>(static_cast<const uint32_t*>(in), rows, cols, static_cast<uint32_t*>(out));
      break;
    default:
      dev::TransposeKernel<<<grid, block, 0, s>>>(static_cast<const uint64_t*>(in), rows, cols, static_cast<uint64_t*>(out));
      break;
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace launch
}  // namespace refit::kernels
