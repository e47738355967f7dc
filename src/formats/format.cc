// Format names, validation shared by every format, and dispatch to the per-format files.
#include "formats/format.h"

#include <array>
#include <cmath>

#include "formats/message.h"
#include "common/status_macros.h"
#include "formats/bits.h"
#include "formats/cast.h"
#include "formats/fp8_block128.h"
#include "formats/input.h"
#include "formats/mxfp4.h"
#include "formats/mxfp8.h"
#include "formats/nvfp4.h"

namespace refit::formats {
namespace {

struct NameEntry {
  Format format;
  std::string_view name;
};

constexpr std::array<NameEntry, 9> kNames = {{
    {Format::kBf16, "bf16"},
    {Format::kFp16, "fp16"},
    {Format::kFp32, "fp32"},
    {Format::kFp8Block128, "fp8_block128"},
    {Format::kFp8Block128Ue8m0, "fp8_block128_ue8m0"},
    {Format::kMxfp8, "mxfp8"},
    {Format::kNvfp4, "nvfp4"},
    {Format::kNvfp4Te, "nvfp4_te"},
    {Format::kMxfp4, "mxfp4"},
}};

bool IsCast(Format f) { return f == Format::kBf16 || f == Format::kFp16 || f == Format::kFp32; }

DType CastTarget(Format f) {
  switch (f) {
    case Format::kBf16: return DType::kBF16;
    case Format::kFp16: return DType::kF16;
    default: return DType::kF32;
  }
}

absl::Status Named(std::string_view tensor_name, const absl::Status& s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), Msg("tensor '", tensor_name, "': ", s.message()));
}

// max|x| after the input policy, NaN-propagating. REQUIRES: dtype BF16, F16 or F32.
float RawAmax(const ConstTensor& in, Fp32InputPolicy policy) {
  const int64_t n = *NumElements(in.shape);
  constexpr int64_t kChunk = 4096;
  float buf[kChunk];
  float amax = 0.0f;
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t m = n - i0 < kChunk ? n - i0 : kChunk;
    LoadF32(in, policy, i0, m, buf);
    for (int64_t i = 0; i < m; ++i) amax = bits::AbsMaxNan(amax, buf[i]);
  }
  return amax;
}

}  // namespace

std::string_view FormatName(Format f) {
  for (const NameEntry& e : kNames) {
    if (e.format == f) return e.name;
  }
  return "unknown";
}

absl::StatusOr<Format> ParseFormat(std::string_view name) {
  for (const NameEntry& e : kNames) {
    if (e.name == name) return e.format;
  }
  std::string known;
  for (const NameEntry& e : kNames) known += Msg(known.empty() ? "" : ", ", e.name);
  return absl::InvalidArgumentError(Msg("unknown format '", name, "' (known: ", known, ")"));
}

bool NeedsGlobalAmax(Format f) { return f == Format::kNvfp4 || f == Format::kNvfp4Te; }

absl::StatusOr<std::vector<OutputSpec>> PlanOutputs(Format f, DType input, const Shape& shape) {
  if (IsCast(f)) return cast::Plan(CastTarget(f), input, shape);
  if (input != DType::kBF16 && input != DType::kF32) {
    return absl::InvalidArgumentError(
        Msg(FormatName(f), ": dtype ", DTypeName(input), " is not BF16 or F32"));
  }
  switch (f) {
    case Format::kFp8Block128:
    case Format::kFp8Block128Ue8m0: return fp8_block128::Plan(shape);
    case Format::kMxfp8: return mxfp8::Plan(shape);
    case Format::kNvfp4:
    case Format::kNvfp4Te: return nvfp4::Plan(shape);
    case Format::kMxfp4: return mxfp4::Plan(shape);
    default: return absl::InvalidArgumentError("unknown format");
  }
}

absl::StatusOr<float> Amax(const ConstTensor& in, const QuantizeOptions& options,
                           std::string_view tensor_name) {
  if (in.dtype == DType::kF16) {
    absl::StatusOr<int64_t> n = NumElements(in.shape);
    if (!n.ok()) return Named(tensor_name, n.status());
    if (*n > 0 && in.data == nullptr) return Named(tensor_name, absl::InvalidArgumentError("null data"));
  } else {
    REFIT_RETURN_IF_ERROR(CheckQuantizableInput(in, tensor_name));
  }
  REFIT_RETURN_IF_ERROR(CheckFinite(in, options, tensor_name));
  return RawAmax(in, options.fp32_input);
}

absl::Status Quantize(Format f, const ConstTensor& in, const QuantizeOptions& options,
                      std::optional<float> global_amax, std::span<const MutableBytes> outs,
                      std::string_view tensor_name) {
  absl::StatusOr<std::vector<OutputSpec>> plan = PlanOutputs(f, in.dtype, in.shape);
  if (!plan.ok()) return Named(tensor_name, plan.status());
  if (outs.size() != plan->size()) {
    return Named(tensor_name, absl::InvalidArgumentError(Msg(
                                  FormatName(f), " emits ", plan->size(), " tensors, got ",
                                  outs.size(), " output buffers")));
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    const OutputSpec& s = (*plan)[i];
    if (outs[i].bytes != s.bytes || (s.bytes > 0 && outs[i].data == nullptr)) {
      return Named(tensor_name, absl::InvalidArgumentError(Msg(
                                    "output '", s.suffix, "' needs ", s.bytes, " bytes (",
                                    DTypeName(s.dtype), ShapeString(s.shape), "), got ",
                                    outs[i].bytes)));
    }
  }
  const int64_t n = *NumElements(in.shape);
  if (n > 0 && in.data == nullptr) return Named(tensor_name, absl::InvalidArgumentError("null data"));
  REFIT_RETURN_IF_ERROR(CheckFinite(in, options, tensor_name));
  const Fp32InputPolicy policy = options.fp32_input;

  if (IsCast(f)) {
    cast::Quantize(CastTarget(f), in, policy, outs);
    return absl::OkStatus();
  }
  switch (f) {
    case Format::kFp8Block128:
    case Format::kFp8Block128Ue8m0:
      fp8_block128::Quantize(in, policy, f == Format::kFp8Block128Ue8m0, outs);
      return absl::OkStatus();
    case Format::kMxfp8:
      mxfp8::Quantize(in, policy, outs);
      return absl::OkStatus();
    case Format::kMxfp4:
      mxfp4::Quantize(in, policy, outs);
      return absl::OkStatus();
    default:
      break;
  }
  // NVFP4: one global amax A for the tensor (or its fused group).
  const float own = RawAmax(in, policy);
  const float a = global_amax.value_or(own);
  const bool reject = options.nonfinite == NonfinitePolicy::kReject;
  if (reject && !bits::IsFinite(a)) {
    return Named(tensor_name, absl::InvalidArgumentError(
                                  Msg("global amax ", a, " is not finite")));
  }
  if (!std::isnan(a) && !std::isnan(own) && a < own) {
    return Named(tensor_name, absl::InvalidArgumentError(Msg(
                                  "global amax ", a, " is below the tensor's own max|x| ", own)));
  }
  if (f == Format::kNvfp4) {
    if (a == 0.0f) {
      return Named(tensor_name, absl::InvalidArgumentError(
                                    "nvfp4: amax is 0, so the ModelOpt block scales would be "
                                    "0/0 (NaN); keep the tensor unquantized"));
    }
    nvfp4::QuantizeModelOpt(in, policy, a, outs);
  } else {
    nvfp4::QuantizeTe(in, policy, a, outs);
  }
  return absl::OkStatus();
}

absl::Status Dequantize(Format f, const Shape& shape, std::span<const ConstTensor> parts,
                        std::span<float> out) {
  const DType nominal = IsCast(f) ? CastTarget(f) : DType::kF32;
  REFIT_ASSIGN_OR_RETURN(std::vector<OutputSpec> plan, PlanOutputs(f, nominal, shape));
  REFIT_RETURN_IF_ERROR(CheckParts(plan, parts));
  REFIT_ASSIGN_OR_RETURN(int64_t n, NumElements(shape));
  if (static_cast<int64_t>(out.size()) != n) {
    return absl::InvalidArgumentError(
        Msg("output has ", out.size(), " floats, shape ", ShapeString(shape), " needs ", n));
  }
  switch (f) {
    case Format::kFp8Block128:
    case Format::kFp8Block128Ue8m0: fp8_block128::Dequantize(shape, parts, out); break;
    case Format::kMxfp8: mxfp8::Dequantize(shape, parts, out); break;
    case Format::kNvfp4:
    case Format::kNvfp4Te: nvfp4::Dequantize(shape, parts, out); break;
    case Format::kMxfp4: mxfp4::Dequantize(shape, parts, out); break;
    default: cast::Dequantize(parts, out); break;
  }
  return absl::OkStatus();
}

}  // namespace refit::formats
