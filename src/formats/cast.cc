#include "formats/cast.h"

#include <cstring>

#include "formats/message.h"
#include "common/status_macros.h"
#include "formats/bits.h"
#include "formats/input.h"

namespace refit::formats::cast {

absl::StatusOr<std::vector<OutputSpec>> Plan(DType target, DType input, const Shape& shape) {
  if (input != DType::kBF16 && input != DType::kF16 && input != DType::kF32) {
    return absl::InvalidArgumentError(
        Msg("dtype ", DTypeName(input), " is not BF16, F16 or F32"));
  }
  std::vector<OutputSpec> specs;
  REFIT_ASSIGN_OR_RETURN(OutputSpec d, MakeSpec("", target, shape));
  specs.push_back(std::move(d));
  return specs;
}

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

void Dequantize(std::span<const ConstTensor> parts, std::span<float> out) {
  const ConstTensor& p = parts[0];
  LoadF32(p, Fp32InputPolicy::kExact, 0, static_cast<int64_t>(out.size()), out.data());
}

}  // namespace refit::formats::cast
