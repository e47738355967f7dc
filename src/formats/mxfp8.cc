#include "formats/mxfp8.h"

#include "formats/bits.h"
#include "formats/input.h"

namespace refit::formats::mxfp8 {

void Quantize(const ConstTensor& in, Fp32InputPolicy policy, float /*global_amax*/,
              std::span<const MutableBytes> outs) {
  auto* q = static_cast<uint8_t*>(outs[0].data);
  auto* e8 = static_cast<uint8_t*>(outs[1].data);
  const float rcp448 = 1.0f / 448.0f;
  ForEachRowBlock(in, policy, kBlock, [&](int64_t b, const float* x, float amax) {
    const uint8_t e = bits::E8m0CeilTe(amax * rcp448);
    const float mult = bits::Exp2Rcp(e);
    uint8_t* qb = q + b * kBlock;
    for (int64_t i = 0; i < kBlock; ++i) qb[i] = bits::F32ToE4m3(x[i] * mult);
    e8[b] = e;
  });
}

void Dequantize(const Shape& /*shape*/, std::span<const ConstTensor> parts, std::span<float> out) {
  const int64_t total = static_cast<int64_t>(out.size());
  const auto* q = static_cast<const uint8_t*>(parts[0].data);
  const auto* e8 = static_cast<const uint8_t*>(parts[1].data);
  for (int64_t i = 0; i < total; ++i) out[i] = bits::E4m3ToF32(q[i]) * bits::E8m0ToF32(e8[i / kBlock]);
}

}  // namespace refit::formats::mxfp8
