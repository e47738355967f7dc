#include "formats/input.h"

#include <cstring>

#include "formats/message.h"
#include "formats/bits.h"

namespace refit::formats {

absl::Status CheckQuantizableInput(const ConstTensor& in, std::string_view tensor_name) {
  if (in.dtype != DType::kBF16 && in.dtype != DType::kF32) {
    return absl::InvalidArgumentError(Msg("tensor '", tensor_name, "': dtype ",
                                                   DTypeName(in.dtype), " is not BF16 or F32"));
  }
  absl::StatusOr<int64_t> n = NumElements(in.shape);
  if (!n.ok()) return absl::InvalidArgumentError(Msg("tensor '", tensor_name, "': ", n.status().message()));
  if (*n > 0 && in.data == nullptr) {
    return absl::InvalidArgumentError(Msg("tensor '", tensor_name, "': null data"));
  }
  return absl::OkStatus();
}

absl::Status CheckFinite(const ConstTensor& in, const QuantizeOptions& options,
                         std::string_view tensor_name) {
  if (options.nonfinite == NonfinitePolicy::kPropagate) return absl::OkStatus();
  absl::StatusOr<int64_t> n = NumElements(in.shape);
  if (!n.ok()) return n.status();
  int64_t bad = -1;
  float value = 0;
  if (in.dtype == DType::kBF16 || in.dtype == DType::kF16) {
    const uint16_t mask = in.dtype == DType::kBF16 ? 0x7F80 : 0x7C00;
    const auto* p = static_cast<const uint16_t*>(in.data);
    for (int64_t i = 0; i < *n; ++i) {
      if ((p[i] & mask) == mask) {
        bad = i;
        value = in.dtype == DType::kBF16 ? bits::Bf16ToF32(p[i]) : bits::F16ToF32(p[i]);
        break;
      }
    }
  } else if (in.dtype == DType::kF32) {
    const auto* p = static_cast<const float*>(in.data);
    const bool round = options.fp32_input == Fp32InputPolicy::kRoundToBf16;
    for (int64_t i = 0; i < *n; ++i) {
      const float v = round ? bits::RoundToBf16(p[i]) : p[i];
      if (!bits::IsFinite(v)) {
        bad = i;
        value = p[i];
        break;
      }
    }
  }
  if (bad < 0) return absl::OkStatus();
  return absl::InvalidArgumentError(Msg(
      "tensor '", tensor_name, "': non-finite value ", value, " at flat index ", bad,
      bits::IsFinite(value) ? " (overflows BF16 under fp32_input: round_to_bf16)" : "",
      "; nonfinite: reject"));
}

void LoadF32(const ConstTensor& in, Fp32InputPolicy policy, int64_t begin, int64_t count,
             float* dst) {
  switch (in.dtype) {
    case DType::kBF16: {
      const auto* p = static_cast<const uint16_t*>(in.data) + begin;
      for (int64_t i = 0; i < count; ++i) dst[i] = bits::Bf16ToF32(p[i]);
      return;
    }
    case DType::kF16: {
      const auto* p = static_cast<const uint16_t*>(in.data) + begin;
      for (int64_t i = 0; i < count; ++i) dst[i] = bits::F16ToF32(p[i]);
      return;
    }
    default: {
      const auto* p = static_cast<const float*>(in.data) + begin;
      if (policy == Fp32InputPolicy::kRoundToBf16) {
        for (int64_t i = 0; i < count; ++i) dst[i] = bits::RoundToBf16(p[i]);
      } else {
        std::memcpy(dst, p, static_cast<size_t>(count) * sizeof(float));
      }
      return;
    }
  }
}

int64_t BatchCount(const Shape& shape) {
  int64_t b = 1;
  for (size_t i = 0; i + 2 < shape.size(); ++i) b *= shape[i];
  return b;
}

absl::StatusOr<OutputSpec> MakeSpec(std::string suffix, DType dtype, Shape shape) {
  absl::StatusOr<uint64_t> bytes = DenseBytes(dtype, shape);
  if (!bytes.ok()) return bytes.status();
  return OutputSpec{std::move(suffix), dtype, std::move(shape), *bytes};
}

absl::Status CheckMatrixShape(const Shape& shape, const BlockGeometry& block, std::string_view format) {
  if (shape.size() < 2) {
    return absl::InvalidArgumentError(Msg(format, " needs a tensor of rank >= 2, got ",
                                                   ShapeString(shape)));
  }
  for (int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError(Msg("negative dimension in ", ShapeString(shape)));
  }
  const int64_t n = shape[shape.size() - 2];
  const int64_t k = shape.back();
  if (!block.partial && block.cols > 1 && k % block.cols != 0) {
    return absl::InvalidArgumentError(Msg(format, ": K=", k, " is not a multiple of ", block.cols,
                                          " (shape ", ShapeString(shape), ")"));
  }
  if (!block.partial && block.rows > 1 && n % block.rows != 0) {
    return absl::InvalidArgumentError(Msg(format, ": N=", n, " is not a multiple of ", block.rows,
                                          " (shape ", ShapeString(shape), ")"));
  }
  return NumElements(shape).status();
}

absl::Status CheckParts(const std::vector<OutputSpec>& plan, std::span<const ConstTensor> parts) {
  if (parts.size() != plan.size()) {
    return absl::InvalidArgumentError(Msg("expected ", plan.size(), " parts, got ", parts.size()));
  }
  for (size_t i = 0; i < plan.size(); ++i) {
    const OutputSpec& s = plan[i];
    if (parts[i].dtype != s.dtype || parts[i].shape != s.shape) {
      return absl::InvalidArgumentError(Msg(
          "part '", s.suffix, "' must be ", DTypeName(s.dtype), ShapeString(s.shape), ", got ",
          DTypeName(parts[i].dtype), ShapeString(parts[i].shape)));
    }
    if (s.bytes > 0 && parts[i].data == nullptr) {
      return absl::InvalidArgumentError(Msg("part '", s.suffix, "' has null data"));
    }
  }
  return absl::OkStatus();
}

}  // namespace refit::formats
