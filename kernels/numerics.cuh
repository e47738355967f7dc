// Device-side element codecs and input loaders shared by the quantize kernels. Every function
// reproduces one rule of ../shared/FORMATS.md bit for bit; comments cite the section.
// Thread-safe: pure device functions.
#ifndef REFIT_KERNELS_NUMERICS_CUH_
#define REFIT_KERNELS_NUMERICS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "formats/bits.h"
#include "kernels/launch.h"

namespace refit::kernels::dev {

constexpr uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr uint32_t kInfBits = 0x7F800000u;

__device__ __forceinline__ float F(uint32_t b) { return __uint_as_float(b); }
__device__ __forceinline__ uint32_t B(float f) { return __float_as_uint(f); }

// FP32 -> BF16 bits, RNE; NaN -> 0x7FC0 (as torch's CPU cast).
__device__ __forceinline__ uint32_t Bf16Bits(float x) {
  uint32_t b = B(x);
  if ((b & kAbsMask) > kInfBits) return 0x7FC0u;
  return (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
}
// FP32 -> FP16 bits, RNE, overflow to Inf; NaN -> sign | 0x7E00 (as c10's CPU cast).
__device__ __forceinline__ uint32_t Fp16Bits(float x) {
  uint32_t b = B(x);
  if ((b & kAbsMask) > kInfBits) return ((b >> 16) & 0x8000u) | 0x7E00u;
  return __half_as_ushort(__float2half_rn(x));
}

// E4M3FN with RNE and saturation to +-448 (B §2.1, CUDA SATFINITE column), in hardware
// (cvt.rn.satfinite.e4m3x2.f32). Byte 0 of the result encodes `lo`. Scalar scale bytes use
// formats::bits::F32ToE4m3 instead, which also keeps the sign of NaN.
__device__ __forceinline__ uint32_t E4m3x2(float lo, float hi) {
  return static_cast<uint32_t>(
      __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3));
}
// E4M3 byte of a scalar, equal to formats::bits::F32ToE4m3 for every input: the hardware
// conversion (RNE, saturation to 448, NaN -> 0x7F) of |x|, with x's sign bit (so -0 -> 0x80 and
// a NaN keeps its sign). Branch-free, unlike the bit-by-bit reference.
__device__ __forceinline__ uint32_t E4m3Byte(float x) {
  return (E4m3x2(fabsf(x), 0.0f) & 0x7Fu) | ((B(x) >> 24) & 0x80u);
}
// Value of an E4M3 byte (through FP16, which holds every E4M3 value exactly). Equal to
// formats::bits::E4m3ToF32 except for the NaN payload (0x7F/0xFF decode to some NaN).
__device__ __forceinline__ float E4m3Value(uint32_t byte) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(byte), __NV_E4M3);
  return __half2float(__half(h));
}

// E2M1 magnitude code (0..7) of |y| with RNE ties and saturation; NaN -> 7 (B §2.4).
// Rounds with a magic addend whose ulp is the E2M1 spacing of |y|'s range, so the float adder
// performs the round-half-even: 2^22 (spacing 0.5, codes 0..4) below 2, 2^23 (spacing 1, codes
// 4..6) in [2, 4), 2^24 (spacing 2, codes 6..7) from 4 on. The magic is |y|'s exponent + 22
// clamped to [22, 24] (integer ops, no compares); the code is the integer difference of the sum
// and the magic plus 0, 2 or 4. NaN and Inf land far above 7.
__device__ __forceinline__ uint32_t E2m1Mag(float y) {
  constexpr uint32_t kM22 = 0x4A800000u, kM24 = 0x4B800000u;
  const uint32_t magic = min(max((B(y) & kInfBits) + (22u << 23), kM22), kM24);
  // (magic - kM22) >> 22 == (magic >> 22) - (kM22 >> 22): kM22's low 22 bits are zero.
  const uint32_t code = B(fabsf(y) + F(magic)) + (magic >> 22) - magic;
  return min(code - (kM22 >> 22), 7u);
}
// Sign from the fp32 sign bit (CUDA / triton / ml_dtypes rule: -0.0 -> 8); NaN magnitude 7.
__device__ __forceinline__ uint32_t E2m1SignBit(float y) {
  return E2m1Mag(y) | ((B(y) >> 28) & 8u);
}
// ModelOpt rule: sign = (y < 0), so -0.0 -> 0 and NaN -> 7 (B §6.2 step 5).
__device__ __forceinline__ uint32_t E2m1SignLt(float y) {
  return E2m1Mag(y) | (y < 0.0f ? 8u : 0u);
}
// Packs E2m1SignBit(y[i]) into nibble i (element 0 in the low nibble). Magnitudes and sign bits
// are gathered separately: a sign is one shift and one masked OR into its nibble's bit 3.
template <int kCount>
__device__ __forceinline__ uint32_t PackE2m1SignBit(const float (&y)[kCount]) {
  uint32_t mags = 0, signs = 0;
#pragma unroll
  for (int i = 0; i < kCount; ++i) {
    mags |= E2m1Mag(y[i]) << (4 * i);
    signs |= (B(y[i]) >> (28 - 4 * i)) & (8u << (4 * i));
  }
  return mags | signs;
}

// Stores one chunk's kCount packed 4-bit codes (kCount / 2 bytes) at dst + elem / 2: one vector
// store on the vector path (dst + elem / 2 is then aligned to it), bytes otherwise.
template <int kCount, bool kVec>
__device__ __forceinline__ void StorePackedNibbles(uint8_t* dst, int64_t elem, uint32_t packed) {
  if constexpr (kVec) {
    if constexpr (kCount == 8) {
      *reinterpret_cast<uint32_t*>(dst + elem / 2) = packed;
    } else {
      *reinterpret_cast<uint16_t*>(dst + elem / 2) = static_cast<uint16_t>(packed);
    }
  } else {
#pragma unroll
    for (int i = 0; i < kCount / 2; ++i) dst[elem / 2 + i] = static_cast<uint8_t>(packed >> (8 * i));
  }
}

// BF16x2 arithmetic, round to nearest even (PTX mul/add .rn.bf16x2, sm_90).
__device__ __forceinline__ uint32_t MulBf16x2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
__device__ __forceinline__ uint32_t AddBf16x2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("add.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// Per-halfword unsigned min (PTX min.u16x2).
__device__ __forceinline__ uint32_t MinU16x2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("min.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// Per-halfword unsigned max, one instruction on sm_90 (PTX max.u16x2).
__device__ __forceinline__ uint32_t MaxU16x2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("max.u16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// E2m1SignBit of the two BF16 values of `p` at once: the code of the low half in bits 0-3, of
// the high half in bits 16-19. The same magic-addend rounding as E2m1Mag, on packed halves: in
// BF16 the magics with ulp 0.5, 1 and 2 are 64, 128 and 256, chosen per half by clamping the
// exponent + 6 with u16x2 min/max; per half the sum minus the magic plus (magic >> 6) - 0x10A
// is the code (offsets 0, 2, 4), never negative, so 32-bit arithmetic does not carry across.
// Equal to E2m1SignBit(float(h)) for every non-NaN half h (checked for all 2^16 on the host).
__device__ __forceinline__ uint32_t E2m1x2Bf16(uint32_t p) {
  const uint32_t magic = MinU16x2(MaxU16x2((p & 0x7F807F80u) + 0x03000300u, 0x42804280u), 0x43804380u);
  const uint32_t f = AddBf16x2(p & 0x7FFF7FFFu, magic);
  const uint32_t code = MinU16x2(f + (magic >> 6) - magic - 0x010A010Au, 0x00070007u);
  return code | ((p >> 12) & 0x00080008u);
}

// ---- Input chunks: 16 bytes of input = kElems elements. ----
template <launch::Input kIn>
struct Elems {
  static constexpr int kCount = kIn == launch::Input::kBf16 ? 8 : 4;
  static constexpr int kBytes = kIn == launch::Input::kBf16 ? 2 : 4;
};

// Widens a raw 16-byte chunk to fp32 and returns the bits of max|x| (NaN-dominant: NaN bits
// compare above Inf bits once the sign is cleared).
template <launch::Input kIn>
__device__ __forceinline__ uint32_t Decode(const uint4& raw, float (&v)[Elems<kIn>::kCount]) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t amax = 0;
  if constexpr (kIn == launch::Input::kBf16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = F(w[i] << 16);
      v[2 * i + 1] = F(w[i] & 0xFFFF0000u);
      amax = MaxU16x2(amax, w[i] & 0x7FFF7FFFu);
    }
    amax = max(amax << 16, amax & 0xFFFF0000u);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      uint32_t b = w[i];
      if constexpr (kIn == launch::Input::kF32RoundBf16) b = Bf16Bits(F(b)) << 16;
      v[i] = F(b);
      amax = max(amax, b & kAbsMask);
    }
  }
  return amax;
}

__device__ __forceinline__ uint4 LoadVec(const void* base, int64_t byte_offset) {
  return __ldg(reinterpret_cast<const uint4*>(static_cast<const char*>(base) + byte_offset));
}

// Loads elements [elem, elem + kCount) of a flat input; elements at or past `n` read as +0.
template <launch::Input kIn, bool kVec>
__device__ __forceinline__ uint4 LoadChunk(const void* base, int64_t elem, int64_t n) {
  constexpr int kC = Elems<kIn>::kCount;
  if constexpr (kVec) {
    return LoadVec(base, elem * Elems<kIn>::kBytes);
  } else {
    uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < kC; ++i) {
      if (elem + i < n) {
        if constexpr (kIn == launch::Input::kBf16) {
          uint32_t h = static_cast<const uint16_t*>(base)[elem + i];
          w[i / 2] |= h << (16 * (i % 2));
        } else {
          w[i] = static_cast<const uint32_t*>(base)[elem + i];
        }
      }
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// Max over groups of kLanes consecutive lanes (kLanes a power of two dividing 32).
template <int kLanes>
__device__ __forceinline__ uint32_t GroupMax(uint32_t x) {
#pragma unroll
  for (int o = 1; o < kLanes; o <<= 1) x = max(x, __shfl_xor_sync(0xFFFFFFFFu, x, o));
  return x;
}

// Records the smallest flat index of a non-finite element of the chunk `raw` at flat index
// `elem`. Out of line, and given the raw chunk by value: taking the address of the caller's
// decoded values would force them through local memory on every chunk, not just on this rare path.
template <launch::Input kIn>
__device__ __noinline__ void RecordNonfinite(uint4 raw, int64_t elem, unsigned long long* first_bad) {
  float v[Elems<kIn>::kCount];
  Decode<kIn>(raw, v);
  int first = Elems<kIn>::kCount;
#pragma unroll
  for (int i = Elems<kIn>::kCount - 1; i >= 0; --i) {
    if ((B(v[i]) & kAbsMask) >= kInfBits) first = i;
  }
  if (first < Elems<kIn>::kCount) atomicMin(first_bad, static_cast<unsigned long long>(elem + first));
}

}  // namespace refit::kernels::dev

#endif  // REFIT_KERNELS_NUMERICS_CUH_
