#include "formats/mxfp4.h"

#include "formats/bits.h"
#include "formats/input.h"

namespace refit::formats::mxfp4 {

void Quantize(const ConstTensor& in, Fp32InputPolicy policy, float /*global_amax*/,
              std::span<const MutableBytes> outs) {
  auto* packed = static_cast<uint8_t*>(outs[0].data);
  auto* scales = static_cast<uint8_t*>(outs[1].data);
  ForEachRowBlock(in, policy, kBlock, [&](int64_t b, const float* x, float amax) {
    const uint32_t scale_bits = bits::E8m0CeilTritonBits(amax / 6.0f);
    const float scale = bits::F32FromBits(scale_bits);
    const float mult = scale == 0.0f ? 0.0f : 1.0f / scale;
    PackNibbles(x, kBlock, packed + b * kBlock / 2, [mult](float v) { return bits::F32ToE2m1SignBit(v * mult); });
    scales[b] = static_cast<uint8_t>(scale_bits >> 23);
  });
}

void Dequantize(const Shape& /*shape*/, std::span<const ConstTensor> parts, std::span<float> out) {
  const int64_t total = static_cast<int64_t>(out.size());
  const auto* packed = static_cast<const uint8_t*>(parts[0].data);
  const auto* scales = static_cast<const uint8_t*>(parts[1].data);
  for (int64_t i = 0; i < total; ++i) {
    const float scale = bits::F32FromBits(static_cast<uint32_t>(scales[i / kBlock]) << 23);
    out[i] = bits::E2m1ToF32(Nibble(packed, i)) * scale;
  }
}

}  // namespace refit::formats::mxfp4
