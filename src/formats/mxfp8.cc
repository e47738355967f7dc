#include "formats/mxfp8.h"

#include "common/status_macros.h"
#include "formats/bits.h"
#include "formats/input.h"

namespace refit::formats::mxfp8 {

absl::StatusOr<std::vector<OutputSpec>> Plan(const Shape& shape) {
  REFIT_RETURN_IF_ERROR(CheckMatrixShape(shape, kBlock, "mxfp8"));
  Shape scale_shape = shape;
  scale_shape.back() = shape.back() / kBlock;
  std::vector<OutputSpec> specs;
  REFIT_ASSIGN_OR_RETURN(OutputSpec data, MakeSpec("", DType::kF8E4M3, shape));
  REFIT_ASSIGN_OR_RETURN(OutputSpec scale, MakeSpec("_scale_inv", DType::kU8, scale_shape));
  specs.push_back(std::move(data));
  specs.push_back(std::move(scale));
  return specs;
}

void Quantize(const ConstTensor& in, Fp32InputPolicy policy, std::span<const MutableBytes> outs) {
  const int64_t k = in.shape.back();
  const int64_t rows = k == 0 ? 0 : *NumElements(in.shape) / k;
  auto* q = static_cast<uint8_t*>(outs[0].data);
  auto* e8 = static_cast<uint8_t*>(outs[1].data);
  const float rcp448 = 1.0f / 448.0f;
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t r = 0; r < rows; ++r) {
    LoadF32(in, policy, r * k, k, row.data());
    for (int64_t j = 0; j < k / kBlock; ++j) {
      const float* x = row.data() + j * kBlock;
      float amax = 0.0f;
      for (int64_t i = 0; i < kBlock; ++i) amax = bits::AbsMaxNan(amax, x[i]);
      const uint8_t e = bits::E8m0CeilTe(amax * rcp448);
      const float mult = bits::Exp2Rcp(e);
      uint8_t* qb = q + r * k + j * kBlock;
      for (int64_t i = 0; i < kBlock; ++i) qb[i] = bits::F32ToE4m3(x[i] * mult);
      e8[r * (k / kBlock) + j] = e;
    }
  }
}

void Dequantize(const Shape& shape, std::span<const ConstTensor> parts, std::span<float> out) {
  const int64_t k = shape.back();
  const int64_t total = static_cast<int64_t>(out.size());
  const auto* q = static_cast<const uint8_t*>(parts[0].data);
  const auto* e8 = static_cast<const uint8_t*>(parts[1].data);
  for (int64_t i = 0; i < total; ++i) {
    const int64_t r = i / k;
    const int64_t c = i % k;
    out[i] = bits::E4m3ToF32(q[i]) * bits::E8m0ToF32(e8[r * (k / kBlock) + c / kBlock]);
  }
}

}  // namespace refit::formats::mxfp8
