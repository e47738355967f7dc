#include "formats/compressed_tensors.h"

#include <cmath>
#include <cstring>

#include "formats/bits.h"
#include "formats/input.h"

namespace refit::formats::ct {
namespace {

// torch evaluates an op on BF16 tensors in fp32 and rounds the result to BF16.
float Bf16(float v) { return bits::RoundToBf16(v); }

// torch.finfo(torch.bfloat16).eps: calculate_qparams' replacement for a zero scale.
constexpr float kBf16Eps = 0.0078125f;
// torch.finfo(torch.bfloat16).tiny: generate_gparam's floor for the amax.
constexpr float kBf16Tiny = 1.17549435e-38f;
// calculate_qparams' replacement for a zero FP8 block scale (its eps for float8_e4m3fn).
constexpr uint8_t kE4m3Eighth = 0x20;

// A symmetric scale: amax over half the quantized range, in BF16; zero becomes eps.
float SymmetricScale(float amax, float half_range) {
  const float s = Bf16(amax / half_range);
  return s == 0.0f ? kBf16Eps : s;
}

// The zero point (0) the observer registers is added before rounding: -0.0 becomes +0.0.
uint8_t Fp8Code(float x, float s) { return bits::F32ToE4m3(Bf16(x / s) + 0.0f); }

// cast_to_fp4 on CPU: clamp to +-6, round the magnitude to nearest even, times torch.sign(y);
// pack_fp4_to_uint8 then takes the sign bit, so a negative y that rounds to 0 gives code 8,
// while -0.0 (torch.sign(-0.0) = 0) gives code 0. NaN (nonfinite: propagate) gives code 0:
// torch.sign(NaN) = 0 keeps the NaN positive and the packer's int8 cast of NaN gives 0.
uint8_t E2m1Code(float y) {
  if (bits::IsNan(y)) return 0;
  const uint8_t mag = bits::E2m1Magnitude(y);
  return static_cast<uint8_t>(mag | (y < 0.0f ? 8 : 0));
}

void StoreBf16(uint8_t* dst, int64_t i, float v) {
  const uint16_t h = bits::F32ToBf16(v);
  std::memcpy(dst + i * 2, &h, 2);
}

float LoadBf16(const void* src, int64_t i) {
  uint16_t h = 0;
  std::memcpy(&h, static_cast<const uint8_t*>(src) + i * 2, 2);
  return bits::Bf16ToF32(h);
}

}  // namespace

void QuantizeFp8Channel(const ConstTensor& in, Fp32InputPolicy policy, float /*global_amax*/,
                        std::span<const MutableBytes> outs) {
  auto* q = static_cast<uint8_t*>(outs[0].data);
  auto* scales = static_cast<uint8_t*>(outs[1].data);
  const int64_t k = in.shape.back();
  if (k == 0) {
    const int64_t rows = static_cast<int64_t>(outs[1].bytes / 2);
    for (int64_t r = 0; r < rows; ++r) StoreBf16(scales, r, kBf16Eps);
    return;
  }
  ForEachRowBlock(in, policy, k, [&](int64_t r, const float* x, float amax) {
    const float s = SymmetricScale(amax, 448.0f);
    StoreBf16(scales, r, s);
    for (int64_t i = 0; i < k; ++i) q[r * k + i] = Fp8Code(x[i], s);
  });
}

void QuantizeFp8Tensor(const ConstTensor& in, Fp32InputPolicy policy, float global_amax,
                       std::span<const MutableBytes> outs) {
  auto* q = static_cast<uint8_t*>(outs[0].data);
  const float s = SymmetricScale(global_amax, 448.0f);
  StoreBf16(static_cast<uint8_t*>(outs[1].data), 0, s);
  const int64_t k = in.shape.back();
  if (k == 0) return;
  ForEachRowBlock(in, policy, k, [&](int64_t r, const float* x, float) {
    for (int64_t i = 0; i < k; ++i) q[r * k + i] = Fp8Code(x[i], s);
  });
}

void DequantizeFp8Channel(const Shape& shape, std::span<const ConstTensor> parts, std::span<float> out) {
  const int64_t k = shape.back();
  const auto* q = static_cast<const uint8_t*>(parts[0].data);
  for (int64_t i = 0; i < static_cast<int64_t>(out.size()); ++i) {
    out[static_cast<size_t>(i)] = bits::E4m3ToF32(q[i]) * LoadBf16(parts[1].data, i / k);
  }
}

void DequantizeFp8Tensor(const Shape& /*shape*/, std::span<const ConstTensor> parts, std::span<float> out) {
  const auto* q = static_cast<const uint8_t*>(parts[0].data);
  const float s = LoadBf16(parts[1].data, 0);
  for (int64_t i = 0; i < static_cast<int64_t>(out.size()); ++i) {
    out[static_cast<size_t>(i)] = bits::E4m3ToF32(q[i]) * s;
  }
}

void QuantizeNvfp4(const ConstTensor& in, Fp32InputPolicy policy, float global_amax,
                   std::span<const MutableBytes> outs) {
  auto* packed = static_cast<uint8_t*>(outs[0].data);
  auto* scales = static_cast<uint8_t*>(outs[1].data);
  const float a = global_amax < kBf16Tiny ? kBf16Tiny : global_amax;  // NaN stays NaN
  // generate_gparam's `2688.0 / amax` on a BF16 tensor: torch evaluates a Python scalar over a
  // tensor as reciprocal(tensor) * scalar, each rounded to BF16.
  float g = Bf16(Bf16(1.0f / a) * 2688.0f);
  if (!bits::IsFinite(g)) g = 1.0f;
  std::memcpy(outs[2].data, &g, sizeof(float));
  ForEachRowBlock(in, policy, kNvfp4Block, [&](int64_t b, const float* x, float bmax) {
    uint8_t sc = bits::F32ToE4m3(g * Bf16(bmax / 6.0f));
    if (bits::E4m3ToF32(sc) == 0.0f) sc = kE4m3Eighth;
    const float d = bits::E4m3ToF32(sc) / g;
    PackNibbles(x, kNvfp4Block, packed + b * kNvfp4Block / 2, [d](float v) { return E2m1Code(v / d); });
    scales[b] = sc;
  });
}

void DequantizeNvfp4(const Shape& /*shape*/, std::span<const ConstTensor> parts, std::span<float> out) {
  const auto* packed = static_cast<const uint8_t*>(parts[0].data);
  const auto* scales = static_cast<const uint8_t*>(parts[1].data);
  float g = 0.0f;
  std::memcpy(&g, parts[2].data, sizeof(float));
  for (int64_t i = 0; i < static_cast<int64_t>(out.size()); ++i) {
    const float d = bits::E4m3ToF32(scales[i / kNvfp4Block]) / g;
    out[static_cast<size_t>(i)] = bits::E2m1ToF32(Nibble(packed, i)) * d;
  }
}

void QuantizeW4a16(const ConstTensor& in, Fp32InputPolicy policy, float /*global_amax*/,
                   std::span<const MutableBytes> outs) {
  auto* words = static_cast<uint8_t*>(outs[0].data);
  auto* scales = static_cast<uint8_t*>(outs[1].data);
  for (size_t d = 0; d < in.shape.size(); ++d) {
    const int64_t v = in.shape[d];
    std::memcpy(static_cast<uint8_t*>(outs[2].data) + d * sizeof(int64_t), &v, sizeof(int64_t));
  }
  ForEachRowBlock(in, policy, kW4a16Group, [&](int64_t b, const float* x, float bmax) {
    const float s = SymmetricScale(bmax, 7.5f);
    StoreBf16(scales, b, s);
    for (int64_t w = 0; w < kW4a16Group / 8; ++w) {
      uint32_t word = 0;
      for (int64_t j = 0; j < 8; ++j) {
        float y = Bf16(x[w * 8 + j] / s) + 0.0f;
        y = y < -8.0f ? -8.0f : (y > 7.0f ? 7.0f : y);
        // torch.round: half to even. NaN (only under nonfinite: propagate) encodes as 0.
        const int32_t qv = std::isnan(y) ? 0 : static_cast<int32_t>(std::nearbyint(y));
        word |= static_cast<uint32_t>(qv + 8) << (4 * j);
      }
      std::memcpy(words + (b * kW4a16Group / 8 + w) * 4, &word, 4);
    }
  });
}

void DequantizeW4a16(const Shape& /*shape*/, std::span<const ConstTensor> parts, std::span<float> out) {
  const auto* words = static_cast<const uint8_t*>(parts[0].data);
  for (int64_t i = 0; i < static_cast<int64_t>(out.size()); ++i) {
    uint32_t word = 0;
    std::memcpy(&word, words + (i / 8) * 4, 4);
    const int32_t qv = static_cast<int32_t>((word >> (4 * (i % 8))) & 0xF) - 8;
    out[static_cast<size_t>(i)] = static_cast<float>(qv) * LoadBf16(parts[1].data, i / kW4a16Group);
  }
}

}  // namespace refit::formats::ct
