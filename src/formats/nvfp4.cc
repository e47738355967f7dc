#include "formats/nvfp4.h"

#include "formats/bits.h"
#include "formats/input.h"

namespace refit::formats::nvfp4 {

void QuantizeModelOpt(const ConstTensor& in, Fp32InputPolicy policy, float global_amax,
                      std::span<const MutableBytes> outs) {
  auto* packed = static_cast<uint8_t*>(outs[0].data);
  auto* scales = static_cast<uint8_t*>(outs[1].data);
  const float s2 = global_amax / 2688.0f;
  const float t = 6.0f * s2;
  *static_cast<float*>(outs[2].data) = s2;
  ForEachRowBlock(in, policy, kBlock, [&](int64_t b, const float* x, float bmax) {
    float s = bmax / t;
    if (s == 0.0f) s = 1.0f;
    const uint8_t sc = bits::F32ToE4m3(s);
    const float d = bits::E4m3ToF32(sc) * s2;
    PackNibbles(x, kBlock, packed + b * kBlock / 2, [d](float v) { return bits::F32ToE2m1SignLess(v / d); });
    scales[b] = sc;
  });
}

void QuantizeTe(const ConstTensor& in, Fp32InputPolicy policy, float global_amax,
                std::span<const MutableBytes> outs) {
  auto* packed = static_cast<uint8_t*>(outs[0].data);
  auto* scales = static_cast<uint8_t*>(outs[1].data);
  float s_enc = 2688.0f / global_amax;
  if (s_enc > bits::kFltMax) s_enc = bits::kFltMax;
  if (global_amax == 0.0f || s_enc == 0.0f) s_enc = 1.0f;
  const float s_dec = 1.0f / s_enc;
  *static_cast<float*>(outs[2].data) = s_dec;
  const float enc_over_6 = s_enc * (1.0f / 6.0f);
  ForEachRowBlock(in, policy, kBlock, [&](int64_t b, const float* x, float bmax) {
    float sf = bmax * enc_over_6;
    if (sf > bits::kFltMax) sf = bits::kFltMax;
    const uint8_t sc = bits::F32ToE4m3(sf);
    float enc = 1.0f / (bits::E4m3ToF32(sc) * s_dec);
    if (enc > bits::kFltMax) enc = bits::kFltMax;
    PackNibbles(x, kBlock, packed + b * kBlock / 2, [enc](float v) { return bits::F32ToE2m1SignBit(v * enc); });
    scales[b] = sc;
  });
}

void Dequantize(const Shape& /*shape*/, std::span<const ConstTensor> parts, std::span<float> out) {
  const int64_t total = static_cast<int64_t>(out.size());
  const auto* packed = static_cast<const uint8_t*>(parts[0].data);
  const auto* scales = static_cast<const uint8_t*>(parts[1].data);
  const float s2 = *static_cast<const float*>(parts[2].data);
  for (int64_t i = 0; i < total; ++i) {
    const float d = bits::E4m3ToF32(scales[i / kBlock]) * s2;
    out[i] = bits::E2m1ToF32(Nibble(packed, i)) * d;
  }
}

}  // namespace refit::formats::nvfp4
