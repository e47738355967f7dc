#include "formats/mxfp4.h"

#include "common/status_macros.h"
#include "formats/bits.h"
#include "formats/input.h"

namespace refit::formats::mxfp4 {

absl::StatusOr<std::vector<OutputSpec>> Plan(const Shape& shape) {
  REFIT_RETURN_IF_ERROR(CheckMatrixShape(shape, kBlock, "mxfp4"));
  Shape blocks = shape;
  blocks.back() = shape.back() / kBlock;
  Shape scales = blocks;
  blocks.push_back(kBlock / 2);
  std::vector<OutputSpec> specs;
  REFIT_ASSIGN_OR_RETURN(OutputSpec b, MakeSpec("_blocks", DType::kU8, blocks));
  REFIT_ASSIGN_OR_RETURN(OutputSpec s, MakeSpec("_scales", DType::kU8, scales));
  specs.push_back(std::move(b));
  specs.push_back(std::move(s));
  return specs;
}

void Quantize(const ConstTensor& in, Fp32InputPolicy policy, std::span<const MutableBytes> outs) {
  const int64_t k = in.shape.back();
  const int64_t rows = k == 0 ? 0 : *NumElements(in.shape) / k;
  auto* packed = static_cast<uint8_t*>(outs[0].data);
  auto* scales = static_cast<uint8_t*>(outs[1].data);
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t r = 0; r < rows; ++r) {
    LoadF32(in, policy, r * k, k, row.data());
    for (int64_t j = 0; j < k / kBlock; ++j) {
      const float* x = row.data() + j * kBlock;
      float amax = 0.0f;
      for (int64_t i = 0; i < kBlock; ++i) amax = bits::AbsMaxNan(amax, x[i]);
      const uint32_t scale_bits = bits::E8m0CeilTritonBits(amax / 6.0f);
      const float scale = bits::F32FromBits(scale_bits);
      const float mult = scale == 0.0f ? 0.0f : 1.0f / scale;
      uint8_t* out = packed + (r * k + j * kBlock) / 2;
      for (int64_t i = 0; i < kBlock; i += 2) {
        const uint8_t lo = bits::F32ToE2m1SignBit(x[i] * mult);
        const uint8_t hi = bits::F32ToE2m1SignBit(x[i + 1] * mult);
        out[i / 2] = static_cast<uint8_t>(lo | (hi << 4));
      }
      scales[r * (k / kBlock) + j] = static_cast<uint8_t>(scale_bits >> 23);
    }
  }
}

void Dequantize(const Shape& shape, std::span<const ConstTensor> parts, std::span<float> out) {
  const int64_t k = shape.back();
  const int64_t total = static_cast<int64_t>(out.size());
  const auto* packed = static_cast<const uint8_t*>(parts[0].data);
  const auto* scales = static_cast<const uint8_t*>(parts[1].data);
  for (int64_t i = 0; i < total; ++i) {
    const int64_t r = i / k;
    const int64_t c = i % k;
    const uint8_t byte = packed[i / 2];
    const uint8_t code = (i % 2 == 0) ? (byte & 0xF) : (byte >> 4);
    const float scale =
        bits::F32FromBits(static_cast<uint32_t>(scales[r * (k / kBlock) + c / kBlock]) << 23);
    out[i] = bits::E2m1ToF32(code) * scale;
  }
}

}  // namespace refit::formats::mxfp4
