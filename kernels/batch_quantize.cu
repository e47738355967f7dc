// Batched kernels for runs of small tensors (MoE experts, norms): one descriptor table upload and
// one launch per kernel for the whole run. Each CTA tile lies inside one tensor, so the per-tile
// work is exactly that of the single-tensor kernels (the same Nvfp4Op, the same amax decode);
// only the mapping from block index to (tensor, tile) is new.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/batch_launch.h"
#include "kernels/flat_kernels.cuh"
#include "kernels/nvfp4_op.cuh"

namespace refit::kernels {
namespace dev {
namespace {

// An item and where its tiles start in the batch's tile spaces (prefix sums).
struct Nvfp4Desc {
  launch::Nvfp4Item item;
  int64_t first_tile;       // encode tiles (kFlatThreads * kUnroll chunks each) before this item
  int64_t first_amax_tile;  // amax tiles (kFlatThreads * kBatchAmaxUnroll chunks each) before it
};

struct CopyDesc {
  launch::CopyItem item;
  uint64_t first_chunk;  // copy chunks (kCopyChunkBytes each) before this item
};

constexpr int kBatchAmaxUnroll = 8;
constexpr int64_t kAmaxTileChunks = kFlatThreads * kBatchAmaxUnroll;
constexpr int64_t kEncodeTileChunks = kFlatThreads * kUnroll;
constexpr uint64_t kCopyChunkBytes = 16 * 1024;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The last of table[0..hi] whose tiles start at or before tile g (table[0] starts at 0). Every
// thread of the CTA reads the same descriptors, so the loads are broadcasts.
__device__ __forceinline__ int FindNvfp4(const Nvfp4Desc* __restrict__ table, int hi, int64_t g) {
  int lo = 0;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table[mid].first_tile <= g) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// One CTA per amax tile: max|x| over kBatchAmaxUnroll chunks per thread, one atomicMax of the
// fp32 bits per warp into the tile's tensor's amax (NaN dominates, as in AmaxKernel).
template <launch::Input kIn>
__global__ void __launch_bounds__(kFlatThreads) BatchAmaxKernel(const Nvfp4Desc* __restrict__ table, int count) {
  constexpr int kC = Elems<kIn>::kCount;
  const int64_t g = blockIdx.x;
  int lo = 0, hi = count - 1;  // the last item whose tiles start at or before g
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table[mid].first_amax_tile <= g) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const launch::Nvfp4Item it = table[lo].item;
  const int64_t n_chunks = it.n / kC;
  const int64_t first = (g - table[lo].first_amax_tile) * kAmaxTileChunks + threadIdx.x;
  uint4 raw[kBatchAmaxUnroll];
#pragma unroll
  for (int u = 0; u < kBatchAmaxUnroll; ++u) {
    const int64_t c = first + u * kFlatThreads;
    raw[u] = c < n_chunks ? LoadChunk<kIn, true>(it.in, c * kC, it.n) : make_uint4(0, 0, 0, 0);
  }
  uint32_t m = 0;
#pragma unroll
  for (int u = 0; u < kBatchAmaxUnroll; ++u) {
    float v[kC];
    m = max(m, Decode<kIn>(raw[u], v));
  }
  m = __reduce_max_sync(0xFFFFFFFFu, m);
  if ((threadIdx.x & 31) == 0 && m != 0) atomicMax(reinterpret_cast<uint32_t*>(it.amax), m);
}

// FlatKernel over the concatenated tile space of the batch: each persistent CTA owns one
// contiguous range of tiles and walks it from its end to its start, prefetching the next tile,
// which may belong to another item. The op and its per-thread state are rebuilt, and the item
// looked up, only when the walk enters another item: with contiguous ranges that is at most once
// per item a range touches, where a grid-stride walk over items smaller than the grid's stride
// (a MoE layer's 3 MiB experts) entered another item at every tile and put the lookup's
// dependent loads before every prefetch.
template <launch::Input kIn, bool kTe>
__global__ void __launch_bounds__(kFlatThreads) BatchNvfp4Kernel(const Nvfp4Desc* __restrict__ table, int count,
                                                                  int64_t n_tiles) {
  constexpr int kC = Elems<kIn>::kCount;
  const int64_t per = (n_tiles + gridDim.x - 1) / gridDim.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * per;
  if (begin >= n_tiles) return;
  int64_t g = min(n_tiles, begin + per) - 1;
  int t = FindNvfp4(table, count - 1, g);
  launch::Nvfp4Item it = table[t].item;
  int64_t base = table[t].first_tile;
  Nvfp4Op<kTe> op{it.amax, 0.0f, it.q, it.scales, it.scale_2, it.first_bad};
  Nvfp4State st = op.Prepare();
  uint4 cur[kUnroll], nxt[kUnroll];
  LoadTile<kIn, true>(it.in, it.n, it.n / kC, g - base, cur);
  for (; g >= begin; --g) {
    const int64_t g_next = g - 1;
    int t_next = t;
    if (g_next >= begin) {
      if (base > g_next) t_next = FindNvfp4(table, t - 1, g_next);  // the walk only goes down
      LoadTile<kIn, true>(table[t_next].item.in, table[t_next].item.n, table[t_next].item.n / kC,
                          g_next - table[t_next].first_tile, nxt);
    }
    const int64_t n_chunks = it.n / kC;
    const int64_t first = (g - base) * kEncodeTileChunks + threadIdx.x;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = first + u * kFlatThreads;
      op.template Process<kIn, true>(st, c, c * kC, cur[u], c < n_chunks, it.n);
    }
    if (t_next != t) {
      t = t_next;
      it = table[t].item;
      base = table[t].first_tile;
      op = Nvfp4Op<kTe>{it.amax, 0.0f, it.q, it.scales, it.scale_2, it.first_bad};
      st = op.Prepare();
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) cur[u] = nxt[u];
  }
}

// One CTA per copy chunk of kCopyChunkBytes; 16-byte accesses when both ends allow.
__global__ void __launch_bounds__(kFlatThreads) BatchCopyKernel(const CopyDesc* __restrict__ table, int count) {
  const uint64_t c = blockIdx.x;
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table[mid].first_chunk <= c) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const launch::CopyItem it = table[lo].item;
  const uint64_t begin = (c - table[lo].first_chunk) * kCopyChunkBytes;
  const uint64_t len = min(it.bytes - begin, kCopyChunkBytes);
  char* dst = static_cast<char*>(it.dst) + begin;
  const char* src = static_cast<const char*>(it.src) + begin;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
    const uint64_t vecs = len / 16;
    for (uint64_t k = threadIdx.x; k < vecs; k += kFlatThreads) {
      reinterpret_cast<uint4*>(dst)[k] = __ldg(reinterpret_cast<const uint4*>(src) + k);
    }
    for (uint64_t k = vecs * 16 + threadIdx.x; k < len; k += kFlatThreads) dst[k] = src[k];
  } else {
    for (uint64_t k = threadIdx.x; k < len; k += kFlatThreads) dst[k] = src[k];
  }
}

template <launch::Input kIn>
int LaunchNvfp4(const Nvfp4Desc* table, int count, int64_t tiles, int64_t amax_tiles, bool te, cudaStream_t s) {
  BatchAmaxKernel<kIn><<<static_cast<unsigned>(amax_tiles), kFlatThreads, 0, s>>>(table, count);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return static_cast<int>(e);
  if (te) {
    const auto kernel = BatchNvfp4Kernel<kIn, true>;
    kernel<<<static_cast<unsigned>(PersistentGrid(kernel, kFlatThreads, tiles)), kFlatThreads, 0, s>>>(table, count,
                                                                                                        tiles);
  } else {
    const auto kernel = BatchNvfp4Kernel<kIn, false>;
    kernel<<<static_cast<unsigned>(PersistentGrid(kernel, kFlatThreads, tiles)), kFlatThreads, 0, s>>>(table, count,
                                                                                                        tiles);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace
}  // namespace dev

namespace launch {

uint64_t Nvfp4BatchTableBytes(size_t count) { return count * sizeof(dev::Nvfp4Desc); }
uint64_t CopyBatchTableBytes(size_t count) { return count * sizeof(dev::CopyDesc); }

int Nvfp4Batch(const Nvfp4Item* items, size_t count, Input input, bool te, void* host_table, void* device_table,
               void* stream) {
  if (count == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  auto* descs = static_cast<dev::Nvfp4Desc*>(host_table);
  const int64_t elems_per_chunk = input == Input::kBf16 ? 8 : 4;
  int64_t tiles = 0, amax_tiles = 0;
  for (size_t i = 0; i < count; ++i) {
    descs[i] = dev::Nvfp4Desc{items[i], tiles, amax_tiles};
    const int64_t chunks = items[i].n / elems_per_chunk;
    tiles += dev::CeilDiv(chunks, dev::kEncodeTileChunks);
    amax_tiles += dev::CeilDiv(chunks, dev::kAmaxTileChunks);
  }
  cudaError_t e = cudaMemcpyAsync(device_table, host_table, Nvfp4BatchTableBytes(count), cudaMemcpyHostToDevice, s);
  if (e != cudaSuccess) return static_cast<int>(e);
  const auto* table = static_cast<const dev::Nvfp4Desc*>(device_table);
  const int n = static_cast<int>(count);
  switch (input) {
    case Input::kBf16: return dev::LaunchNvfp4<Input::kBf16>(table, n, tiles, amax_tiles, te, s);
    case Input::kF32: return dev::LaunchNvfp4<Input::kF32>(table, n, tiles, amax_tiles, te, s);
    case Input::kF32RoundBf16: return dev::LaunchNvfp4<Input::kF32RoundBf16>(table, n, tiles, amax_tiles, te, s);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

int CopyBatch(const CopyItem* items, size_t count, void* host_table, void* device_table, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  auto* descs = static_cast<dev::CopyDesc*>(host_table);
  uint64_t chunks = 0;
  size_t used = 0;
  for (size_t i = 0; i < count; ++i) {
    if (items[i].bytes == 0) continue;
    descs[used++] = dev::CopyDesc{items[i], chunks};
    chunks += (items[i].bytes + dev::kCopyChunkBytes - 1) / dev::kCopyChunkBytes;
  }
  if (used == 0) return 0;
  cudaError_t e = cudaMemcpyAsync(device_table, host_table, CopyBatchTableBytes(used), cudaMemcpyHostToDevice, s);
  if (e != cudaSuccess) return static_cast<int>(e);
  dev::BatchCopyKernel<<<static_cast<unsigned>(chunks), dev::kFlatThreads, 0, s>>>(
      static_cast<const dev::CopyDesc*>(device_table), static_cast<int>(used));
  return static_cast<int>(cudaGetLastError());
}

}  // namespace launch
}  // namespace refit::kernels
