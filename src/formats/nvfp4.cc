#include "formats/nvfp4.h"

#include "common/status_macros.h"
#include "formats/bits.h"
#include "formats/input.h"

namespace refit::formats::nvfp4 {

absl::StatusOr<std::vector<OutputSpec>> Plan(const Shape& shape) {
  REFIT_RETURN_IF_ERROR(CheckMatrixShape(shape, kBlock, "nvfp4"));
  Shape packed = shape;
  packed.back() = shape.back() / 2;
  Shape scale = shape;
  scale.back() = shape.back() / kBlock;
  std::vector<OutputSpec> specs;
  REFIT_ASSIGN_OR_RETURN(OutputSpec d, MakeSpec("", DType::kU8, packed));
  REFIT_ASSIGN_OR_RETURN(OutputSpec s, MakeSpec("_scale", DType::kF8E4M3, scale));
  REFIT_ASSIGN_OR_RETURN(OutputSpec s2, MakeSpec("_scale_2", DType::kF32, Shape{}));
  specs.push_back(std::move(d));
  specs.push_back(std::move(s));
  specs.push_back(std::move(s2));
  return specs;
}

void QuantizeModelOpt(const ConstTensor& in, Fp32InputPolicy policy, float global_amax,
                      std::span<const MutableBytes> outs) {
  const int64_t k = in.shape.back();
  const int64_t rows = k == 0 ? 0 : *NumElements(in.shape) / k;
  auto* packed = static_cast<uint8_t*>(outs[0].data);
  auto* scales = static_cast<uint8_t*>(outs[1].data);
  const float s2 = global_amax / 2688.0f;
  const float t = 6.0f * s2;
  *static_cast<float*>(outs[2].data) = s2;
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t r = 0; r < rows; ++r) {
    LoadF32(in, policy, r * k, k, row.data());
    for (int64_t j = 0; j < k / kBlock; ++j) {
      const float* x = row.data() + j * kBlock;
      float bmax = 0.0f;
      for (int64_t i = 0; i < kBlock; ++i) bmax = bits::AbsMaxNan(bmax, x[i]);
      float s = bmax / t;
      if (s == 0.0f) s = 1.0f;
      const uint8_t sc = bits::F32ToE4m3(s);
      const float d = bits::E4m3ToF32(sc) * s2;
      uint8_t* out = packed + (r * k + j * kBlock) / 2;
      for (int64_t i = 0; i < kBlock; i += 2) {
        const uint8_t lo = bits::F32ToE2m1SignLess(x[i] / d);
        const uint8_t hi = bits::F32ToE2m1SignLess(x[i + 1] / d);
        out[i / 2] = static_cast<uint8_t>(lo | (hi << 4));
      }
      scales[r * (k / kBlock) + j] = sc;
    }
  }
}

void QuantizeTe(const ConstTensor& in, Fp32InputPolicy policy, float global_amax,
                std::span<const MutableBytes> outs) {
  const int64_t k = in.shape.back();
  const int64_t rows = k == 0 ? 0 : *NumElements(in.shape) / k;
  auto* packed = static_cast<uint8_t*>(outs[0].data);
  auto* scales = static_cast<uint8_t*>(outs[1].data);
  float s_enc = 2688.0f / global_amax;
  if (s_enc > bits::kFltMax) s_enc = bits::kFltMax;
  if (global_amax == 0.0f || s_enc == 0.0f) s_enc = 1.0f;
  const float s_dec = 1.0f / s_enc;
  *static_cast<float*>(outs[2].data) = s_dec;
  const float enc_over_6 = s_enc * (1.0f / 6.0f);
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t r = 0; r < rows; ++r) {
    LoadF32(in, policy, r * k, k, row.data());
    for (int64_t j = 0; j < k / kBlock; ++j) {
      const float* x = row.data() + j * kBlock;
      float bmax = 0.0f;
      for (int64_t i = 0; i < kBlock; ++i) bmax = bits::AbsMaxNan(bmax, x[i]);
      float sf = bmax * enc_over_6;
      if (sf > bits::kFltMax) sf = bits::kFltMax;
      const uint8_t sc = bits::F32ToE4m3(sf);
      float enc = 1.0f / (bits::E4m3ToF32(sc) * s_dec);
      if (enc > bits::kFltMax) enc = bits::kFltMax;
      uint8_t* out = packed + (r * k + j * kBlock) / 2;
      for (int64_t i = 0; i < kBlock; i += 2) {
        const uint8_t lo = bits::F32ToE2m1SignBit(x[i] * enc);
        const uint8_t hi = bits::F32ToE2m1SignBit(x[i + 1] * enc);
        out[i / 2] = static_cast<uint8_t>(lo | (hi << 4));
      }
      scales[r * (k / kBlock) + j] = sc;
    }
  }
}

void Dequantize(const Shape& shape, std::span<const ConstTensor> parts, std::span<float> out) {
  const int64_t k = shape.back();
  const int64_t total = static_cast<int64_t>(out.size());
  const auto* packed = static_cast<const uint8_t*>(parts[0].data);
  const auto* scales = static_cast<const uint8_t*>(parts[1].data);
  const float s2 = *static_cast<const float*>(parts[2].data);
  for (int64_t i = 0; i < total; ++i) {
    const int64_t r = i / k;
    const int64_t c = i % k;
    const uint8_t byte = packed[i / 2];
    const uint8_t code = (i % 2 == 0) ? (byte & 0xF) : (byte >> 4);
    const float d = bits::E4m3ToF32(scales[r * (k / kBlock) + c / kBlock]) * s2;
    out[i] = bits::E2m1ToF32(code) * d;
  }
}

}  // namespace refit::formats::nvfp4
