// BF16 / FP16 / FP32 output casts (IEEE RNE) from BF16 or FP32 input, and the derived
// Gemma-norm parameter out = RN(w + 1) in the parameter's own dtype (FORMATS.md B §10).
#include "kernels/flat_kernels.cuh"
#include "kernels/launch.h"

namespace refit::kernels {
namespace dev {
namespace {

template <launch::Output kOut>
__device__ __forceinline__ uint32_t Encode16(float x) {
  return kOut == launch::Output::kBf16 ? Bf16Bits(x) : Fp16Bits(x);
}

template <launch::Output kOut, int kC, bool kVec>
__device__ __forceinline__ void StoreElems(void* out, int64_t elem, const float (&v)[kC], int64_t n) {
  if constexpr (kOut == launch::Output::kF32) {
    float* dst = static_cast<float*>(out) + elem;
    if constexpr (kVec) {
#pragma unroll
      for (int i = 0; i < kC; i += 4) {
        *reinterpret_cast<float4*>(dst + i) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kC; ++i) {
        if (elem + i < n) dst[i] = v[i];
      }
    }
  } else {
    uint16_t* dst = static_cast<uint16_t*>(out) + elem;
    if constexpr (kVec) {
      uint32_t w[kC / 2];
#pragma unroll
      for (int i = 0; i < kC / 2; ++i) w[i] = Encode16<kOut>(v[2 * i]) | (Encode16<kOut>(v[2 * i + 1]) << 16);
      if constexpr (kC == 8) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
      } else {
        *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kC; ++i) {
        if (elem + i < n) dst[i] = static_cast<uint16_t>(Encode16<kOut>(v[i]));
      }
    }
  }
}

template <launch::Output kOut>
struct CastOp {
  void* out;
  unsigned long long* first_bad;

  __device__ __forceinline__ NoState Prepare() const { return {}; }

  template <launch::Input kIn, bool kVec>
  __device__ __forceinline__ void Process(NoState, int64_t, int64_t elem, const uint4& raw,
                                          bool valid, int64_t n) const {
    constexpr int kC = Elems<kIn>::kCount;
    float v[kC];
    const uint32_t lane_amax = Decode<kIn>(raw, v);
    if (!valid) return;
    if (first_bad != nullptr && lane_amax >= kInfBits) RecordNonfinite<kIn>(raw, elem, first_bad);
    StoreElems<kOut, kC, kVec>(out, elem, v, n);
  }
};

// out = RN(w + 1), w and out of the same dtype.
template <launch::Output kType, bool kVec>
__global__ void __launch_bounds__(kFlatThreads) GemmaKernel(const void* w, int64_t n, void* out) {
  constexpr int kC = kType == launch::Output::kF32 ? 4 : 8;
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * kFlatThreads + threadIdx.x;
  const int64_t elem = chunk * kC;
  if (elem >= n) return;
  float v[kC];
  if constexpr (kType == launch::Output::kF32) {
    const float* src = static_cast<const float*>(w) + elem;
    if constexpr (kVec) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(src));
      v[0] = f.x + 1.0f;
      v[1] = f.y + 1.0f;
      v[2] = f.z + 1.0f;
      v[3] = f.w + 1.0f;
    } else {
#pragma unroll
      for (int i = 0; i < kC; ++i) v[i] = elem + i < n ? src[i] + 1.0f : 0.0f;
    }
  } else {
    const uint16_t* src = static_cast<const uint16_t*>(w) + elem;
    uint16_t h[kC];
    if constexpr (kVec) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(src));
      const uint32_t ws[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        h[2 * i] = static_cast<uint16_t>(ws[i]);
        h[2 * i + 1] = static_cast<uint16_t>(ws[i] >> 16);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kC; ++i) h[i] = elem + i < n ? src[i] : 0;
    }
#pragma unroll
    for (int i = 0; i < kC; ++i) {
      const float x = kType == launch::Output::kBf16 ? F(static_cast<uint32_t>(h[i]) << 16)
                                                      : __half2float(__ushort_as_half(h[i]));
      v[i] = x + 1.0f;
    }
  }
  StoreElems<kType, kC, kVec>(out, elem, v, n);
}

}  // namespace
}  // namespace dev

namespace launch {

int Cast(const Src& src, Output out_type, void* out, unsigned long long* first_bad, void* stream) {
  const int64_t n = src.batch * src.rows * src.cols;
  const int kC = src.input == Input::kBf16 ? 8 : 4;
  const bool vec = dev::Aligned(src.data, 16) && dev::Aligned(out, 16) && n % kC == 0;
  switch (out_type) {
    case Output::kBf16:
      return dev::LaunchFlat(src, vec, dev::CastOp<Output::kBf16>{out, first_bad}, stream);
    case Output::kF16:
      return dev::LaunchFlat(src, vec, dev::CastOp<Output::kF16>{out, first_bad}, stream);
    case Output::kF32:
      return dev::LaunchFlat(src, vec, dev::CastOp<Output::kF32>{out, first_bad}, stream);
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

int GemmaPlusOne(const void* w, Output type, int64_t n, void* out, void* stream) {
  if (n == 0) return 0;
  auto s = static_cast<cudaStream_t>(stream);
  const int kC = type == Output::kF32 ? 4 : 8;
  const bool vec = dev::Aligned(w, 16) && dev::Aligned(out, 16) && n % kC == 0;
  const unsigned grid = static_cast<unsigned>((n + kC * dev::kFlatThreads - 1) / (kC * dev::kFlatThreads));
  auto go = [&](auto type_tag) {
    constexpr Output kT = decltype(type_tag)::value;
    if (vec) {
      dev::GemmaKernel<kT, true><<<grid, dev::kFlatThreads, 0, s>>>(w, n, out);
    } else {
      dev::GemmaKernel<kT, false><<<grid, dev::kFlatThreads, 0, s>>>(w, n, out);
    }
  };
  switch (type) {
    case Output::kBf16: go(std::integral_constant<Output, Output::kBf16>{}); break;
    case Output::kF16: go(std::integral_constant<Output, Output::kF16>{}); break;
    case Output::kF32: go(std::integral_constant<Output, Output::kF32>{}); break;
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace launch
}  // namespace refit::kernels
