// The flat-kernel skeleton: formats whose blocks lie inside one row (MXFP8, MXFP4, NVFP4, casts)
// see the tensor as a flat array. Each thread owns kUnroll chunks of 16 input bytes; a warp's
// lanes own consecutive chunks, so every load instruction is a coalesced 512-byte access. All
// loads of a thread are issued before any is used, to keep enough bytes in flight.
// Thread-safe: device code only.
#ifndef REFIT_KERNELS_FLAT_KERNELS_CUH_
#define REFIT_KERNELS_FLAT_KERNELS_CUH_

#include <type_traits>

#include "kernels/numerics.cuh"

namespace refit::kernels::dev {

constexpr int kFlatThreads = 256;
#ifndef REFIT_KERNELS_FLAT_UNROLL
#define REFIT_KERNELS_FLAT_UNROLL 4
#endif
constexpr int kUnroll = REFIT_KERNELS_FLAT_UNROLL;

// Op::Process(chunk, elem, raw, valid) is called by every lane (valid or not) so ops may
// shuffle across lanes. `kReverse` walks CTAs from the end of the tensor to its start, so a
// pass that follows a forward pass over the same tensor begins with what is still in L2.
template <launch::Input kIn, bool kVec, bool kReverse, class Op>
__global__ void __launch_bounds__(kFlatThreads) FlatKernel(const void* in, int64_t n,
                                                            int64_t n_chunks, Op op) {
  constexpr int kC = Elems<kIn>::kCount;
  int64_t cta = kReverse ? (gridDim.x - 1 - blockIdx.x) : blockIdx.x;
  int64_t first = cta * (kFlatThreads * kUnroll) + threadIdx.x;
  uint4 raw[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    int64_t c = first + u * kFlatThreads;
    raw[u] = c < n_chunks ? LoadChunk<kIn, kVec>(in, c * kC, n) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    int64_t c = first + u * kFlatThreads;
    op.template Process<kIn, kVec>(c, c * kC, raw[u], c < n_chunks, n);
  }
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
    const int64_t grid = n_chunks == 0 ? 1 : FlatGrid(n_chunks);
    FlatKernel<kIn, kVec, kReverse, Op><<<static_cast<unsigned>(grid), kFlatThreads, 0, s>>>(src.data, n, n_chunks, op);
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
