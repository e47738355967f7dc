// The flat-kernel skeleton: formats whose blocks lie inside one row (MXFP8, MXFP4, NVFP4, casts)
// see the tensor as a flat array. Each thread owns kUnroll chunks of 16 input bytes per tile; a
// warp's lanes own consecutive chunks, so every load instruction is a coalesced 512-byte access.
// Thread-safe: device code only.
#ifndef REFIT_KERNELS_FLAT_KERNELS_CUH_
#define REFIT_KERNELS_FLAT_KERNELS_CUH_

#include <type_traits>
#include <vector>

#include "kernels/numerics.cuh"

namespace refit::kernels::dev {

constexpr int kFlatThreads = 256;

// Per-thread state of ops that need none.
struct NoState {};
#ifndef REFIT_KERNELS_FLAT_UNROLL
#define REFIT_KERNELS_FLAT_UNROLL 2
#endif
constexpr int kUnroll = REFIT_KERNELS_FLAT_UNROLL;

// Loads the kUnroll chunks of tile `tile` owned by this thread (chunks past the end read as 0).
template <launch::Input kIn, bool kVec>
__device__ __forceinline__ void LoadTile(const void* in, int64_t n, int64_t n_chunks, int64_t tile,
                                         uint4 (&buf)[kUnroll]) {
  const int64_t first = tile * (kFlatThreads * kUnroll) + threadIdx.x;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t c = first + u * kFlatThreads;
    buf[u] = c < n_chunks ? LoadChunk<kIn, kVec>(in, c * Elems<kIn>::kCount, n) : make_uint4(0, 0, 0, 0);
  }
}

// Persistent CTAs walk tiles of kFlatThreads * kUnroll chunks, prefetching the next tile into
// registers before encoding the current one, so memory latency overlaps the arithmetic.
// Op::Prepare() runs once per thread before the first tile and returns the op's per-thread state
// (scalars that depend only on kernel arguments, e.g. NVFP4's global scale), which is passed to
// Op::Process(state, chunk, elem, raw, valid, n); Process is called by every lane (valid or not)
// so ops may shuffle across lanes. `kReverse` walks tiles from the end of the tensor to its start, so a
// pass that follows a forward pass over the same tensor begins with what is still in L2.
// An empty tensor still runs tile 0 once (with no valid chunk), for ops that write metadata.
template <launch::Input kIn, bool kVec, bool kReverse, class Op>
__global__ void __launch_bounds__(kFlatThreads) FlatKernel(const void* in, int64_t n,
                                                            int64_t n_chunks, Op op) {
  constexpr int kC = Elems<kIn>::kCount;
  constexpr int64_t kPerTile = kFlatThreads * kUnroll;
  const int64_t n_tiles = n_chunks == 0 ? 1 : (n_chunks + kPerTile - 1) / kPerTile;
  int64_t i = blockIdx.x;
  if (i >= n_tiles) return;
  const auto state = op.Prepare();
  uint4 cur[kUnroll], nxt[kUnroll];
  LoadTile<kIn, kVec>(in, n, n_chunks, kReverse ? n_tiles - 1 - i : i, cur);
  for (; i < n_tiles; i += gridDim.x) {
    const int64_t tile = kReverse ? n_tiles - 1 - i : i;
    const int64_t i_next = i + gridDim.x;
    if (i_next < n_tiles) LoadTile<kIn, kVec>(in, n, n_chunks, kReverse ? n_tiles - 1 - i_next : i_next, nxt);
    const int64_t first = tile * kPerTile + threadIdx.x;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = first + u * kFlatThreads;
      op.template Process<kIn, kVec>(state, c, c * kC, cur[u], c < n_chunks, n);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) cur[u] = nxt[u];
  }
}

// CTAs to launch for a persistent kernel: as many as fit on the device at once, at most `work`.
// The resident count depends only on the kernel, the block size and the device, so each thread
// asks the runtime once per (kernel, block size, device): the occupancy query and the attribute
// read cost several microseconds, against a launch's few, on the batched converter's path that
// launches per run of small tensors.
template <class Kernel>
inline int64_t PersistentGrid(Kernel kernel, int threads, int64_t work) {
  struct Known {
    const void* kernel;
    int threads, device;
    int64_t resident;
  };
  thread_local std::vector<Known> known;
  int device = 0;
  cudaGetDevice(&device);
  const void* key = reinterpret_cast<const void*>(kernel);
  int64_t resident = 0;
  for (const Known& k : known) {
    if (k.kernel == key && k.threads == threads && k.device == device) resident = k.resident;
  }
  if (resident == 0) {
    int sms = 132, per_sm = 1;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0);
    resident = static_cast<int64_t>(sms) * (per_sm > 0 ? per_sm : 1);
    known.push_back({key, threads, device, resident});
  }
  return work < resident ? (work > 0 ? work : 1) : resident;
}

inline int64_t FlatGrid(int64_t n_chunks) {
  const int64_t per_cta = kFlatThreads * kUnroll;
  return (n_chunks + per_cta - 1) / per_cta;
}

template <bool kReverse = false, class Op>
inline int LaunchFlat(const launch::Src& src, bool vec, Op op, void* stream, bool launch_empty = false) {
  const int64_t n = src.batch * src.rows * src.cols;
  if (n == 0 && !launch_empty) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  auto go = [&](auto in_tag, auto vec_tag) {
    constexpr launch::Input kIn = decltype(in_tag)::value;
    constexpr bool kVec = decltype(vec_tag)::value;
    const int64_t n_chunks = (n + Elems<kIn>::kCount - 1) / Elems<kIn>::kCount;
    const auto kernel = FlatKernel<kIn, kVec, kReverse, Op>;
    const int64_t grid = PersistentGrid(kernel, kFlatThreads, FlatGrid(n_chunks));
    kernel<<<static_cast<unsigned>(grid), kFlatThreads, 0, s>>>(src.data, n, n_chunks, op);
  };
  using T = std::true_type;
  using Fa = std::false_type;
  using IB = std::integral_constant<launch::Input, launch::Input::kBf16>;
  using IF = std::integral_constant<launch::Input, launch::Input::kF32>;
  using IR = std::integral_constant<launch::Input, launch::Input::kF32RoundBf16>;
  switch (src.input) {
    case launch::Input::kBf16: vec ? go(IB{}, T{}) : go(IB{}, Fa{}); break;
    case launch::Input::kF32: vec ? go(IF{}, T{}) : go(IF{}, Fa{}); break;
    case launch::Input::kF32RoundBf16: vec ? go(IR{}, T{}) : go(IR{}, Fa{}); break;
  }
  return static_cast<int>(cudaGetLastError());
}

inline bool Aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace refit::kernels::dev

#endif  // REFIT_KERNELS_FLAT_KERNELS_CUH_
