#include "formats/cast.h"

#include <cstring>

#include "formats/bits.h"
#include "formats/input.h"

namespace refit::formats::cast {

void Quantize(DType target, const ConstTensor& in, Fp32InputPolicy policy,
              std::span<const MutableBytes> outs) {
  const int64_t n = *NumElements(in.shape);
  const bool rounds = in.dtype == DType::kF32 && policy == Fp32InputPolicy::kRoundToBf16;
  if (in.dtype == target && !rounds) {
    if (outs[0].bytes > 0) std::memcpy(outs[0].data, in.data, outs[0].bytes);
    return;
  }
  constexpr int64_t kChunk = 4096;
  float buf[kChunk];
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t m = n - i0 < kChunk ? n - i0 : kChunk;
    LoadF32(in, policy, i0, m, buf);
    switch (target) {
      case DType::kBF16: {
        auto* o = static_cast<uint16_t*>(outs[0].data) + i0;
        for (int64_t i = 0; i < m; ++i) o[i] = bits::F32ToBf16(buf[i]);
        break;
      }
      case DType::kF16: {
        auto* o = static_cast<uint16_t*>(outs[0].data) + i0;
        for (int64_t i = 0; i < m; ++i) o[i] = bits::F32ToF16(buf[i]);
        break;
      }
      default:
        std::memcpy(static_cast<float*>(outs[0].data) + i0, buf, static_cast<size_t>(m) * 4);
        break;
    }
  }
}

void Dequantize(const Shape& /*shape*/, std::span<const ConstTensor> parts, std::span<float> out) {
  const ConstTensor& p = parts[0];
  LoadF32(p, Fp32InputPolicy::kExact, 0, static_cast<int64_t>(out.size()), out.data());
}

}  // namespace refit::formats::cast
