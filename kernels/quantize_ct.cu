// The compressed-tensors formats (formats/compressed_tensors.h) on the GPU, byte for byte the CPU
// reference. Per-tensor FP8, NVFP4 and W4A16 are flat-kernel ops (flat_kernels.cuh): a lane owns
// 16-byte input chunks, and the lanes sharing a 16-block (NVFP4) or 128-group (W4A16) reduce its
// amax with shuffles. Per-channel FP8 needs the whole row's amax first: a warp (short rows) or a
// CTA (long rows) owns a row, keeps up to kRowRegs chunks per thread in registers and re-reads
// the rest of a longer row (from L2) to encode it. Products and the scales' divisions use the _rn
// intrinsics, so nothing is contracted or approximated; the elements' quotients x / s are
// correctly rounded too (DivChunk: one reciprocal per chunk and Markstein's correction where
// that is exact, a true division elsewhere).
#include "kernels/flat_kernels.cuh"
#include "kernels/launch.h"

namespace refit::kernels {
namespace dev {
namespace {

namespace bits = formats::bits;

constexpr float kBf16Eps = 0.0078125f;        // torch.finfo(torch.bfloat16).eps
constexpr float kBf16Tiny = 1.17549435e-38f;  // torch.finfo(torch.bfloat16).tiny
constexpr uint8_t kE4m3Eighth = 0x20;         // 0.125

__device__ __forceinline__ float Bf16(float v) { return bits::RoundToBf16(v); }

// RN(x / d) for a divisor d in [2^-60, 2^60] with r = RN(1 / d): Markstein's correction of x * r
// where x is +0 or in [2^-60, 2^60] (the conditions of DivChunk below hold: the quotient is normal
// and the remainder exact), else a true division (negative, tiny, huge or non-finite x).
__device__ __forceinline__ float DivByNormal(float x, float d, float r) {
  if (B(x) - 0x21800000u <= 0x3C000000u || B(x) == 0u) {
    const float q0 = x * r;
    return fmaf(fmaf(-q0, d, x), r, q0);
  }
  return __fdiv_rn(x, d);
}

__device__ __forceinline__ float SymmetricScale(float amax, float half_range) {
  const float s = Bf16(__fdiv_rn(amax, half_range));
  return s == 0.0f ? kBf16Eps : s;
}

// SymmetricScale for W4A16's half range 7.5, per group: the division by the constant through
// DivByNormal.
__device__ __forceinline__ float W4Scale(float amax) {
  const float s = Bf16(DivByNormal(amax, 7.5f, 0x1.111112p-3f /* RN(1 / 7.5) */));
  return s == 0.0f ? kBf16Eps : s;
}

// Bf16(lo) and Bf16(hi) + 0 by one hardware conversion (cvt.rn.bf16x2.f32: RNE, overflow to Inf,
// subnormals kept), equal to bits::RoundToBf16 but for the sign and payload of a NaN, which no
// caller's code depends on (FP8: the conversion gives 0x7F for every NaN; W4A16: NaN -> 0).
__device__ __forceinline__ float2 Bf16x2Plus0(float lo, float hi) {
  uint32_t p;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p) : "f"(hi), "f"(lo));
  return make_float2(__fadd_rn(F(p << 16), 0.0f), __fadd_rn(F(p & 0xFFFF0000u), 0.0f));
}

// The FP8 codes of y0 = RN(x0 / s) and y1 in bytes 0 and 1. The hardware conversion (RNE,
// saturation to 448, NaN -> 0x7F) is bits::F32ToE4m3 for every input but -0 and a negative NaN,
// which the + 0 rules out (it also gives 0x7F for the reference's NaN, whose BF16 is positive).
__device__ __forceinline__ uint32_t Fp8Codes(float y0, float y1) {
  const float2 b = Bf16x2Plus0(y0, y1);
  return E4m3x2(b.x, b.y);
}

// The reference's E2M1 code: sign y < 0, NaN -> 0 (E2m1Mag is bits::E2m1Magnitude).
__device__ __forceinline__ uint32_t E2m1Code(float y) { return bits::IsNan(y) ? 0u : E2m1SignLt(y); }

// y[i] = RN(x[i] / d) for a chunk whose max|x| has the bits `amax`, with r = RN(1 / d): one
// reciprocal per divisor instead of a division per element. Markstein's correction of x * r (as
// in Nvfp4Op) is the correctly rounded quotient while d lies in [2^-100, 2^100], no x is
// non-finite and every nonzero |x| is at least d * 2^-125 (the quotient is normal) and 2^-101
// (the remainder x - q0 * d is a multiple of 2^-148, so the fma computes it exactly); |x| below
// d * 2^120 keeps the quotient finite. Other chunks divide. The fast path turns -0 / d into +0,
// which every caller encodes as it encodes -0 (+0 is added, or the sign rule is y < 0).
template <int kC>
__device__ __forceinline__ bool DivChunk(const float (&x)[kC], uint32_t amax, float d, float r, float (&y)[kC]) {
  const float lo = fmaxf(d * 0x1p-125f, 0x1p-101f);
  bool slow = !(d >= 0x1p-100f && d <= 0x1p100f) || amax >= kInfBits || F(amax) > d * 0x1p120f;
#pragma unroll
  for (int i = 0; i < kC; ++i) {
    const float q0 = x[i] * r;
    y[i] = fmaf(fmaf(-q0, d, x[i]), r, q0);
    const float ax = fabsf(x[i]);
    slow |= (ax < lo) & (ax > 0.0f);
  }
  if (slow) {
#pragma unroll
    for (int i = 0; i < kC; ++i) y[i] = __fdiv_rn(x[i], d);
  }
  return slow;
}

// The kC FP8 codes of a chunk at q + elem: one vector store on the vector path (q + elem is then
// aligned to it), otherwise bytes for the elements before `n`.
template <int kC, bool kVec>
__device__ __forceinline__ void StoreFp8(uint8_t* q, int64_t elem, int64_t n, const uint32_t (&w)[kC / 4]) {
  if constexpr (kVec) {
    if constexpr (kC == 8) {
      *reinterpret_cast<uint2*>(q + elem) = make_uint2(w[0], w[1]);
    } else {
      *reinterpret_cast<uint32_t*>(q + elem) = w[0];
    }
  } else {
#pragma unroll
    for (int i = 0; i < kC; ++i) {
      if (elem + i < n) q[elem + i] = static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4)));
    }
  }
}

// The FP8 codes of a chunk (max|x| bits `amax`) under the scale s, r = RN(1 / s).
template <int kC>
__device__ __forceinline__ void EncodeFp8(const float (&v)[kC], uint32_t amax, float s, float r,
                                          uint32_t (&w)[kC / 4]) {
  float y[kC];
  DivChunk<kC>(v, amax, s, r, y);
#pragma unroll
  for (int i = 0; i < kC / 4; ++i) {
    w[i] = Fp8Codes(y[4 * i], y[4 * i + 1]) | (Fp8Codes(y[4 * i + 2], y[4 * i + 3]) << 16);
  }
}

struct CtFp8TensorOp {
  const float* amax_dev;
  float amax_host;
  uint8_t* q;
  uint16_t* scale;
  unsigned long long* first_bad;
  float claim;
  unsigned long long* claim_word;

  __device__ __forceinline__ float2 Prepare() const {
    const float s = SymmetricScale(amax_dev != nullptr ? *amax_dev : amax_host, 448.0f);
    return make_float2(s, __frcp_rn(s));
  }

  template <launch::Input kIn, bool kVec>
  __device__ __forceinline__ void Process(float2 sr, int64_t chunk, int64_t elem, const uint4& raw, bool valid,
                                          int64_t n) const {
    constexpr int kC = Elems<kIn>::kCount;
    if (chunk == 0) *scale = bits::F32ToBf16(sr.x);  // written even for an empty tensor
    if (!valid) return;
    float v[kC];
    const uint32_t lane_amax = Decode<kIn>(raw, v);
    if (first_bad != nullptr && lane_amax >= kInfBits) RecordNonfinite<kIn>(raw, elem, first_bad);
    if (claim_word != nullptr) {
      int first = kC;
#pragma unroll
      for (int i = kC - 1; i >= 0; --i) {
        if (elem + i < n && bits::AbsF(v[i]) > claim) first = i;
      }
      if (first < kC) atomicMin(claim_word, (1ULL << 63) | static_cast<unsigned long long>(elem + first));
    }
    uint32_t w[kC / 4];
    EncodeFp8<kC>(v, lane_amax, sr.x, sr.y, w);
    StoreFp8<kC, kVec>(q, elem, n, w);
  }
};

struct CtNvfp4Op {
  const float* amax_dev;
  float amax_host;
  uint8_t* packed;
  uint8_t* scales;
  float* global_scale;
  unsigned long long* first_bad;
  float claim;
  unsigned long long* claim_word;
  int64_t n_full;  // elements in whole 16-blocks; a partial last block is not encoded

  struct State {
    float g;      // the global scale
    float rg;     // RN(1 / g)
    bool g_fast;  // g in [2^-60, 2^60]: a block's E4M3 scale / g through DivByNormal
  };

  __device__ __forceinline__ State Prepare() const {
    float a = amax_dev != nullptr ? *amax_dev : amax_host;
    a = a < kBf16Tiny ? kBf16Tiny : a;
    float g = Bf16(__fmul_rn(Bf16(__frcp_rn(a)), 2688.0f));
    g = bits::IsFinite(g) ? g : 1.0f;
    return State{g, __frcp_rn(g), B(g) - 0x21800000u <= 0x3C000000u};
  }

  template <launch::Input kIn, bool kVec>
  __device__ __forceinline__ void Process(const State& st, int64_t chunk, int64_t elem, const uint4& raw, bool valid,
                                          int64_t n) const {
    const float g = st.g;
    constexpr int kC = Elems<kIn>::kCount;
    constexpr int kLanes = 16 / kC;
    float v[kC];
    const uint32_t lane_amax = Decode<kIn>(raw, v);
    const float bmax = F(GroupMax<kLanes>(lane_amax));
    if (chunk == 0) *global_scale = g;  // written even for an empty tensor
    if (!valid || elem >= n_full) return;
    if (first_bad != nullptr && lane_amax >= kInfBits) RecordNonfinite<kIn>(raw, elem, first_bad);
    const bool block_first = chunk % kLanes == 0;
    if (claim_word != nullptr && block_first && bmax > claim) {
      atomicMin(claim_word, (1ULL << 63) | static_cast<unsigned long long>(elem));
    }
    uint32_t sc = E4m3Byte(__fmul_rn(g, Bf16(DivByNormal(bmax, 6.0f, 0x1.555556p-3f /* RN(1 / 6) */))));
    // E4m3Value is bits::E4m3ToF32 up to the NaN payload, which no code depends on (NaN -> 0).
    if (E4m3Value(sc) == 0.0f) sc = kE4m3Eighth;
    // The E4M3 value is positive and normal (2^-9 to 448).
    const float d = st.g_fast ? DivByNormal(E4m3Value(sc), g, st.rg) : __fdiv_rn(E4m3Value(sc), g);
    float y[kC];
    uint32_t codes = 0;
    if (DivChunk<kC>(v, lane_amax, d, __frcp_rn(d), y)) {
#pragma unroll
      for (int i = 0; i < kC; ++i) codes |= E2m1Code(y[i]) << (4 * i);
    } else {
      // Finite quotients with x's sign that are zero only for x = +-0 (giving +0): the sign bit
      // is the sign rule y < 0.
      codes = PackE2m1SignBit(y);
    }
    StorePackedNibbles<kC, kVec>(packed, elem, codes);
    if (block_first) scales[elem / 16] = static_cast<uint8_t>(sc);
  }
};

// q + 8 of y = Bf16(x / s) + 0: clamped to [-8, 7], rounded half to even; NaN -> q = 0.
__device__ __forceinline__ uint32_t W4Nibble(float y) {
  y = y < -8.0f ? -8.0f : (y > 7.0f ? 7.0f : y);
  const int qv = bits::IsNan(y) ? 0 : static_cast<int>(rintf(y));
  return static_cast<uint32_t>(qv + 8);
}

struct CtW4a16Op {
  int rank;
  uint32_t* words;
  uint16_t* scales;
  int64_t* shape;
  unsigned long long* first_bad;
  int64_t dims[3];
  int64_t n_full;  // elements in whole 128-groups; a partial last group is not encoded

  __device__ __forceinline__ NoState Prepare() const { return {}; }

  template <launch::Input kIn, bool kVec>
  __device__ __forceinline__ void Process(NoState, int64_t chunk, int64_t elem, const uint4& raw, bool valid,
                                          int64_t n) const {
    constexpr int kC = Elems<kIn>::kCount;
    constexpr int kLanes = 128 / kC;
    float v[kC];
    const uint32_t lane_amax = Decode<kIn>(raw, v);
    const float s = W4Scale(F(GroupMax<kLanes>(lane_amax)));
    // Word w of a group holds elements 8w..8w+7, element 8w+j in nibble j as q + 8.
    float quot[kC];
    DivChunk<kC>(v, lane_amax, s, __frcp_rn(s), quot);
    uint32_t nibbles = 0;
#pragma unroll
    for (int i = 0; i < kC; i += 2) {
      const float2 b = Bf16x2Plus0(quot[i], quot[i + 1]);
      nibbles |= (W4Nibble(b.x) << (4 * i)) | (W4Nibble(b.y) << (4 * i + 4));
    }
    if constexpr (kC == 4) {
      // FP32: a chunk is half a word; the even chunk (lane) stores it with its odd neighbour's half.
      nibbles |= __shfl_xor_sync(0xFFFFFFFFu, nibbles, 1) << 16;
    }
    if (chunk == 0) {  // written even for an empty tensor
      for (int d = 0; d < rank; ++d) shape[d] = dims[3 - rank + d];
    }
    if (!valid || elem >= n_full) return;
    if (first_bad != nullptr && lane_amax >= kInfBits) RecordNonfinite<kIn>(raw, elem, first_bad);
    if (elem % 8 == 0) words[elem / 8] = nibbles;
    if (chunk % kLanes == 0) scales[elem / 128] = bits::F32ToBf16(s);
  }
};

// ---- Per-channel FP8: a team of kTeam threads (a warp or the CTA) per row. ----

constexpr int kRowThreads = 256;
constexpr int kRowRegs = 16;  // chunks per thread held in registers between the amax and the encode

// Chunk c (kC elements from element c * kC) of a row of k elements starting at `row`; elements
// past the row's end read as 0.
template <launch::Input kIn, bool kVec>
__device__ __forceinline__ uint4 LoadRowChunk(const char* row, int64_t c, int64_t k) {
  constexpr int kC = Elems<kIn>::kCount;
  return LoadChunk<kIn, kVec>(row, c * kC, k);
}

// Persistent CTAs of kRowThreads / kTeam teams walk the rows.
template <launch::Input kIn, bool kVec, int kTeam>
__global__ void __launch_bounds__(kRowThreads)
    Fp8ChannelKernel(launch::Src src, uint8_t* q, uint16_t* scales, unsigned long long* first_bad) {
  constexpr int kC = Elems<kIn>::kCount;
  constexpr int kTeams = kRowThreads / kTeam;
  constexpr int kWarps = kTeam / 32;
  // Warp maxima of a CTA team's row, double-buffered by row parity so that one barrier per row
  // suffices (as in Fp8TileKernel).
  __shared__ uint32_t warp_max[2][kWarps];
  int parity = 0;
  const int64_t rows = src.batch * src.rows, k = src.cols;
  const int64_t n_chunks = (k + kC - 1) / kC;
  const int t = static_cast<int>(threadIdx.x) % kTeam;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kTeams + threadIdx.x / kTeam; r < rows;
       r += static_cast<int64_t>(gridDim.x) * kTeams) {
    const char* row = static_cast<const char*>(src.data) + r * k * Elems<kIn>::kBytes;
    uint4 raw[kRowRegs];
#pragma unroll
    for (int j = 0; j < kRowRegs; ++j) {
      const int64_t c = t + j * kTeam;
      raw[j] = c < n_chunks ? LoadRowChunk<kIn, kVec>(row, c, k) : make_uint4(0, 0, 0, 0);
    }
    uint32_t m = 0;
#pragma unroll
    for (int j = 0; j < kRowRegs; ++j) {
      float v[kC];
      const uint32_t a = Decode<kIn>(raw[j], v);
      if (first_bad != nullptr && a >= kInfBits) RecordNonfinite<kIn>(raw[j], r * k + (t + j * kTeam) * kC, first_bad);
      m = max(m, a);
    }
    for (int64_t c = t + kRowRegs * kTeam; c < n_chunks; c += kTeam) {
      const uint4 x = LoadRowChunk<kIn, kVec>(row, c, k);
      float v[kC];
      const uint32_t a = Decode<kIn>(x, v);
      if (first_bad != nullptr && a >= kInfBits) RecordNonfinite<kIn>(x, r * k + c * kC, first_bad);
      m = max(m, a);
    }
    m = __reduce_max_sync(0xFFFFFFFFu, m);
    if constexpr (kWarps > 1) {
      if ((threadIdx.x & 31) == 0) warp_max[parity][threadIdx.x / 32] = m;
      __syncthreads();
      const int lane = threadIdx.x & 31;
      m = __reduce_max_sync(0xFFFFFFFFu, lane < kWarps ? warp_max[parity][lane] : 0u);
      parity ^= 1;
    }
    const float s = SymmetricScale(F(m), 448.0f), rs = __frcp_rn(s);
    if (t == 0) scales[r] = bits::F32ToBf16(s);
    uint8_t* qrow = q + r * k;
#pragma unroll
    for (int j = 0; j < kRowRegs; ++j) {
      const int64_t c = t + j * kTeam;
      if (c >= n_chunks) break;
      float v[kC];
      const uint32_t a = Decode<kIn>(raw[j], v);
      uint32_t w[kC / 4];
      EncodeFp8<kC>(v, a, s, rs, w);
      StoreFp8<kC, kVec>(qrow, c * kC, k, w);
    }
    for (int64_t c = t + kRowRegs * kTeam; c < n_chunks; c += kTeam) {
      float v[kC];
      const uint32_t a = Decode<kIn>(LoadRowChunk<kIn, kVec>(row, c, k), v);
      uint32_t w[kC / 4];
      EncodeFp8<kC>(v, a, s, rs, w);
      StoreFp8<kC, kVec>(qrow, c * kC, k, w);
    }
  }
}

template <launch::Input kIn, bool kVec>
void LaunchRows(const launch::Src& src, uint8_t* q, uint16_t* scales, unsigned long long* first_bad, cudaStream_t s) {
  const int64_t rows = src.batch * src.rows;
  const int64_t n_chunks = (src.cols + Elems<kIn>::kCount - 1) / Elems<kIn>::kCount;
  // A warp per row while a warp's registers hold the row; a CTA per row for longer rows.
  if (n_chunks <= 32 * kRowRegs) {
    const auto kernel = Fp8ChannelKernel<kIn, kVec, 32>;
    constexpr int kTeams = kRowThreads / 32;
    const int64_t grid = PersistentGrid(kernel, kRowThreads, (rows + kTeams - 1) / kTeams);
    kernel<<<static_cast<unsigned>(grid), kRowThreads, 0, s>>>(src, q, scales, first_bad);
  } else {
    const auto kernel = Fp8ChannelKernel<kIn, kVec, kRowThreads>;
    const int64_t grid = PersistentGrid(kernel, kRowThreads, rows);
    kernel<<<static_cast<unsigned>(grid), kRowThreads, 0, s>>>(src, q, scales, first_bad);
  }
}

template <launch::Input kIn>
void LaunchRows(const launch::Src& src, bool vec, uint8_t* q, uint16_t* scales, unsigned long long* first_bad,
                cudaStream_t s) {
  if (vec) {
    LaunchRows<kIn, true>(src, q, scales, first_bad, s);
  } else {
    LaunchRows<kIn, false>(src, q, scales, first_bad, s);
  }
}

}  // namespace
}  // namespace dev

namespace launch {

int CtFp8Channel(const Src& src, uint8_t* q, uint16_t* scales, unsigned long long* first_bad, void* stream) {
  if (src.batch * src.rows == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  // Vector loads and stores need every row to start 16-byte aligned in the input and 8-byte
  // aligned in the output.
  const bool vec = dev::Aligned(src.data, 16) && dev::Aligned(q, 8) && src.cols % 8 == 0;
  switch (src.input) {
    case Input::kBf16: dev::LaunchRows<Input::kBf16>(src, vec, q, scales, first_bad, s); break;
    case Input::kF32: dev::LaunchRows<Input::kF32>(src, vec, q, scales, first_bad, s); break;
    case Input::kF32RoundBf16: dev::LaunchRows<Input::kF32RoundBf16>(src, vec, q, scales, first_bad, s); break;
  }
  return static_cast<int>(cudaGetLastError());
}

int CtFp8Tensor(const Src& src, const float* amax_dev, float amax_host, uint8_t* q, uint16_t* scale,
                unsigned long long* first_bad, float claim, unsigned long long* claim_word, void* stream) {
  // The vector path loads whole chunks: the tensor must not end inside one.
  const bool vec = dev::Aligned(src.data, 16) && dev::Aligned(q, 8) && src.cols % 8 == 0;
  return dev::LaunchFlat(src, vec, dev::CtFp8TensorOp{amax_dev, amax_host, q, scale, first_bad, claim, claim_word},
                         stream, /*launch_empty=*/true);
}

int CtNvfp4(const Src& src, const float* amax_dev, float amax_host, uint8_t* packed, uint8_t* scales,
            float* global_scale, unsigned long long* first_bad, float claim, unsigned long long* claim_word,
            void* stream) {
  const int64_t n = src.batch * src.rows * src.cols;
  const bool vec = dev::Aligned(src.data, 16) && dev::Aligned(packed, 4) && src.cols % 16 == 0;
  return dev::LaunchFlat(
      src, vec,
      dev::CtNvfp4Op{amax_dev, amax_host, packed, scales, global_scale, first_bad, claim, claim_word, n / 16 * 16},
      stream, /*launch_empty=*/true);
}

int CtW4a16(const Src& src, int rank, uint32_t* words, uint16_t* scales, int64_t* shape, unsigned long long* first_bad,
            void* stream) {
  // Rank 4 and above: the [batch, rows, cols] view no longer holds the leading dimensions.
  if (rank < 2 || rank > 3) return static_cast<int>(cudaErrorInvalidValue);
  const int64_t n = src.batch * src.rows * src.cols;
  const bool vec = dev::Aligned(src.data, 16) && src.cols % 8 == 0;
  return dev::LaunchFlat(
      src, vec, dev::CtW4a16Op{rank, words, scales, shape, first_bad, {src.batch, src.rows, src.cols}, n / 128 * 128},
      stream,
      /*launch_empty=*/true);
}

}  // namespace launch
}  // namespace refit::kernels
