#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/batch_copy.h"

namespace refit::kernels {
namespace {

constexpr uint64_t kChunkBytes = 128 * 1024;  // one CTA iteration
constexpr int kThreads = 512;
constexpr int kUnroll = 4;  // 512 threads x 4 x 16 B = 32 KiB in flight per CTA

struct Region {
  char* dst;
  const char* src;
  uint64_t bytes;
  uint64_t first_chunk;  // prefix sum of chunk counts
};

__global__ void BatchCopyKernel(const Region* __restrict__ regions, uint32_t n, uint64_t chunks) {
  for (uint64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    // The region holding chunk c: the last with first_chunk <= c.
    uint32_t lo = 0, hi = n - 1;
    while (lo < hi) {
      uint32_t mid = (lo + hi + 1) / 2;
      if (regions[mid].first_chunk <= c) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const Region r = regions[lo];
    const uint64_t begin = (c - r.first_chunk) * kChunkBytes;
    const uint64_t end = min(r.bytes, begin + kChunkBytes);
    char* dst = r.dst + begin;
    const char* src = r.src + begin;
    const uint64_t len = end - begin;
    const bool aligned = ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0;
    if (aligned) {
      // kUnroll independent 16-byte loads in flight per thread before their stores (a plain
      // load-store loop keeps one in flight and reaches ~0.77 of cudaMemcpy); streaming cache
      // hints: nothing copied here is read again soon.
      const uint64_t vecs = len / 16;
      const uint4* s = reinterpret_cast<const uint4*>(src);
      uint4* d = reinterpret_cast<uint4*>(dst);
      const uint64_t stride = blockDim.x;
      for (uint64_t base = threadIdx.x; base < vecs; base += stride * kUnroll) {
        uint4 v[kUnroll];
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) {
          const uint64_t i = base + k * stride;
          if (i < vecs) v[k] = __ldcs(s + i);
        }
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) {
          const uint64_t i = base + k * stride;
          if (i < vecs) __stcs(d + i, v[k]);
        }
      }
      for (uint64_t i = vecs * 16 + threadIdx.x; i < len; i += blockDim.x) dst[i] = src[i];
    } else {
      for (uint64_t i = threadIdx.x; i < len; i += blockDim.x) dst[i] = src[i];
    }
  }
}

// The regions of one CopyRegions launch, passed by value (3 KiB of kernel parameters).
struct RegionList {
  CopyRegion r[kCopyRegionsPerLaunch];
  uint32_t count;
};

// blockIdx.y: the region; the x blocks stride over its 16-byte vectors (or bytes, unaligned).
__global__ void __launch_bounds__(kThreads) CopyRegionsKernel(const RegionList list) {
  const CopyRegion r = list.r[blockIdx.y];
  char* dst = static_cast<char*>(r.dst);
  const char* src = static_cast<const char*>(r.src);
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const bool aligned = ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0;
  uint64_t done = 0;
  if (aligned) {
    const uint64_t vecs = r.bytes / 16;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (uint64_t i = first; i < vecs; i += stride) __stcs(d + i, __ldcs(s + i));
    done = vecs * 16;
  }
  for (uint64_t i = done + first; i < r.bytes; i += stride) dst[i] = src[i];
}

absl::Status Error(cudaError_t e, absl::string_view what) { return CudaStatus(e, absl::StrCat("batch copy: ", what)); }

}  // namespace

absl::StatusOr<std::unique_ptr<BatchCopy>> BatchCopy::Create(const CopyRegion* regions, size_t count, void* stream) {
  std::unique_ptr<BatchCopy> b(new BatchCopy());
  std::vector<Region> table;
  for (size_t i = 0; i < count; ++i) {
    const CopyRegion& r = regions[i];
    if (r.bytes == 0) continue;
    table.push_back({static_cast<char*>(r.dst), static_cast<const char*>(r.src), r.bytes, b->chunks_});
    b->chunks_ += (r.bytes + kChunkBytes - 1) / kChunkBytes;
    b->bytes_ += r.bytes;
  }
  b->regions_ = static_cast<uint32_t>(table.size());
  if (table.empty()) return b;
  const size_t table_bytes = table.size() * sizeof(Region);
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return Error(e, "table allocation");
  absl::StatusOr<DeviceAllocation> t = DeviceAllocation::Allocate(device, table_bytes);
  if (!t.ok()) return absl::InternalError(absl::StrCat("batch copy: table allocation: ", t.status().message()));
  b->table_ = std::move(*t);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t e = cudaMemcpyAsync(b->table_.get(), table.data(), table_bytes, cudaMemcpyHostToDevice, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e != cudaSuccess) return Error(e, "table upload");
  return b;
}

BatchCopy::~BatchCopy() = default;

absl::Status CopyRegions(const CopyRegion* regions, size_t count, void* stream) {
  constexpr uint64_t kBytesPerBlock = uint64_t{kThreads} * 16 * 8;  // 64 KiB: 8 vectors a thread
  constexpr uint64_t kMaxBlocksPerRegion = 64;
  RegionList list{};
  uint64_t largest = 0;
  auto launch = [&]() -> absl::Status {
    if (list.count == 0) return absl::OkStatus();
    const uint64_t x = std::clamp<uint64_t>((largest + kBytesPerBlock - 1) / kBytesPerBlock, 1, kMaxBlocksPerRegion);
    CopyRegionsKernel<<<dim3(static_cast<unsigned>(x), list.count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        list);
    list.count = 0;
    largest = 0;
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? absl::OkStatus() : Error(e, "launch");
  };
  for (size_t i = 0; i < count; ++i) {
    const CopyRegion& r = regions[i];
    if (r.bytes == 0) continue;
    list.r[list.count++] = r;
    largest = std::max(largest, r.bytes);
    if (list.count == kCopyRegionsPerLaunch) {
      if (absl::Status st = launch(); !st.ok()) return st;
    }
  }
  return launch();
}

absl::Status BatchCopy::Launch(void* stream) const {
  if (regions_ == 0) return absl::OkStatus();
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const uint64_t blocks = std::min<uint64_t>(chunks_, static_cast<uint64_t>(std::max(sms, 1)) * 4);
  BatchCopyKernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      table_.as<const Region>(), regions_, chunks_);
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? absl::OkStatus() : Error(e, "launch");
}

}  // namespace refit::kernels
