// Format names, validation shared by every format, and dispatch to the per-format files
// through the descriptor table (format_info.h).
#include "formats/format.h"

#include <algorithm>
#include <cmath>

#include "common/status_macros.h"
#include "formats/bits.h"
#include "formats/format_info.h"
#include "formats/input.h"
#include "formats/message.h"

namespace refit::formats {
namespace {

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

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The shape of one emitted tensor. REQUIRES: `in` passed CheckMatrixShape for any role but kInput.
// A closed switch on purpose: OutputShape is the small vocabulary rows are written in; a new
// format picks from it, and only a new kind of tensor adds a case here.
Shape ShapeOf(OutputShape kind, const BlockGeometry& block, const Shape& in) {
  Shape s = in;
  switch (kind) {
    case OutputShape::kInput:
      return s;
    case OutputShape::kPackedPairs:
      s.back() /= 2;
      return s;
    case OutputShape::kPerBlock:
    case OutputShape::kPerBlockPacked:
      s[s.size() - 2] = CeilDiv(s[s.size() - 2], block.rows);
      s.back() = CeilDiv(s.back(), block.cols);
      if (kind == OutputShape::kPerBlockPacked) s.push_back(block.cols / 2);
      return s;
    case OutputShape::kScalar:
      return Shape{};
    case OutputShape::kSingle: return Shape{1};
    case OutputShape::kPackedInt4x8: s.back() /= 8; return s;
    case OutputShape::kShapeVector: return Shape{static_cast<int64_t>(in.size())};
  }
  return s;
}

}  // namespace

const char* FormatName(Format f) {
  if (static_cast<size_t>(f) >= kFormatCount) return "unknown";
  return Info(f).name.data();  // the table's names are string literals
}

absl::StatusOr<Format> ParseFormat(std::string_view name) {
  for (const FormatInfo& info : AllFormats()) {
    if (info.name == name) return info.format;
  }
  std::string known;
  for (const FormatInfo& info : AllFormats()) known += Msg(known.empty() ? "" : ", ", info.name);
  return absl::InvalidArgumentError(Msg("unknown format '", name, "' (known: ", known, ")"));
}

bool NeedsGlobalAmax(Format f) { return Info(f).global_amax != GlobalAmax::kNone; }

std::optional<Format> CastFormatFor(DType dtype) {
  for (const FormatInfo& info : AllFormats()) {
    if (!info.quantized && info.outputs[0].dtype == dtype) return info.format;
  }
  return std::nullopt;
}

std::vector<std::string_view> AllOutputSuffixes() {
  std::vector<std::string_view> out;
  for (const FormatInfo& info : AllFormats()) {
    for (const OutputRole& o : info.Outputs()) {
      if (std::find(out.begin(), out.end(), o.suffix) == out.end()) out.push_back(o.suffix);
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](std::string_view a, std::string_view b) { return a.size() > b.size(); });
  return out;
}

int64_t BlockAlong(Format f, int dim, size_t rank) {
  const BlockGeometry& b = Info(f).block;
  if (dim == static_cast<int>(rank) - 1) return b.cols;
  if (dim == static_cast<int>(rank) - 2) return b.rows;
  return 1;
}

absl::StatusOr<std::vector<OutputSpec>> PlanOutputs(Format f, DType input, const Shape& shape) {
  const FormatInfo& info = Info(f);
  if (!info.quantized) {
    if (input != DType::kBF16 && input != DType::kF16 && input != DType::kF32) {
      return absl::InvalidArgumentError(Msg("dtype ", DTypeName(input), " is not BF16, F16 or F32"));
    }
  } else {
    if (input != DType::kBF16 && input != DType::kF32) {
      return absl::InvalidArgumentError(
          Msg(info.name, ": dtype ", DTypeName(input), " is not BF16 or F32"));
    }
    REFIT_RETURN_IF_ERROR(CheckMatrixShape(shape, info.block, info.name));
  }
  std::vector<OutputSpec> specs;
  for (const OutputRole& o : info.Outputs()) {
    REFIT_ASSIGN_OR_RETURN(OutputSpec spec, MakeSpec(std::string(o.suffix), o.dtype, ShapeOf(o.shape, info.block, shape)));
    specs.push_back(std::move(spec));
  }
  return specs;
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
                      std::string_view tensor_name, std::optional<float> supplied_amax) {
  const FormatInfo& info = Info(f);
  absl::StatusOr<std::vector<OutputSpec>> plan = PlanOutputs(f, in.dtype, in.shape);
  if (!plan.ok()) return Named(tensor_name, plan.status());
  if (outs.size() != plan->size()) {
    return Named(tensor_name, absl::InvalidArgumentError(Msg(
                                  info.name, " emits ", plan->size(), " tensors, got ",
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

  // One global amax A for the tensor (or its fused group), for the formats that take one.
  float a = 0.0f;
  if (info.global_amax != GlobalAmax::kNone) {
    const float own = RawAmax(in, policy);
    a = global_amax.value_or(own);
    const bool reject = options.nonfinite == NonfinitePolicy::kReject;
    if (supplied_amax && !std::isnan(own) && !(*supplied_amax >= own)) {
      return Named(tensor_name, absl::InvalidArgumentError(Msg(
                                    "supplied amax ", *supplied_amax, " is below the tensor's max|x| ", own,
                                    " (the trainer's amax must cover the bytes it sent)")));
    }
    if (reject && !bits::IsFinite(a)) {
      return Named(tensor_name, absl::InvalidArgumentError(
                                    Msg("global amax ", a, " is not finite")));
    }
    if (!std::isnan(a) && !std::isnan(own) && a < own) {
      return Named(tensor_name, absl::InvalidArgumentError(Msg(
                                    "global amax ", a, " is below the tensor's own max|x| ", own)));
    }
    if (info.global_amax == GlobalAmax::kNonzero && a == 0.0f) {
      return Named(tensor_name, absl::InvalidArgumentError(Msg(
                                    info.name, ": amax is 0, so the producer's block scales would be "
                                    "0/0 (NaN); keep the tensor unquantized")));
    }
  }
  info.quantize(in, policy, a, outs);
  return absl::OkStatus();
}

absl::Status Dequantize(Format f, const Shape& shape, std::span<const ConstTensor> parts,
                        std::span<float> out) {
  const FormatInfo& info = Info(f);
  const DType nominal = info.quantized ? DType::kF32 : info.outputs[0].dtype;
  REFIT_ASSIGN_OR_RETURN(std::vector<OutputSpec> plan, PlanOutputs(f, nominal, shape));
  REFIT_RETURN_IF_ERROR(CheckParts(plan, parts));
  REFIT_ASSIGN_OR_RETURN(int64_t n, NumElements(shape));
  if (static_cast<int64_t>(out.size()) != n) {
    return absl::InvalidArgumentError(
        Msg("output has ", out.size(), " floats, shape ", ShapeString(shape), " needs ", n));
  }
  info.dequantize(shape, parts, out);
  return absl::OkStatus();
}

}  // namespace refit::formats
