#include "client/trainer_convert.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "formats/format_info.h"
#include "refit/convert.h"

namespace refit::client {
namespace {

std::string Describe(DType t, const Shape& s) { return absl::StrCat(DTypeName(t), ShapeString(s)); }

}  // namespace

Shape TrainerConverter::Quantized(const Entry& e, const Shape& shape) {
  Shape s = shape;
  if (e.transpose && s.size() >= 2) std::swap(s[s.size() - 1], s[s.size() - 2]);
  return s;
}

absl::StatusOr<TrainerConverter> TrainerConverter::Create(const WirePlan& plan) {
  TrainerConverter c;
  if (plan.fp32_input == "round_to_bf16") {
    c.options_.fp32_input = formats::Fp32InputPolicy::kRoundToBf16;
  } else if (plan.fp32_input != "exact" && !plan.fp32_input.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("wire plan: fp32_input '", plan.fp32_input, "' is unknown"));
  }
  if (plan.nonfinite == "propagate") {
    c.options_.nonfinite = formats::NonfinitePolicy::kPropagate;
  } else if (plan.nonfinite != "reject" && !plan.nonfinite.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("wire plan: nonfinite '", plan.nonfinite, "' is unknown"));
  }
  c.entries_.reserve(plan.tensors.size());
  for (const WireTensor& w : plan.tensors) {
    absl::StatusOr<formats::Format> f = formats::ParseFormat(w.format);
    if (!f.ok() || !formats::Info(*f).quantized) {
      return absl::UnimplementedError(absl::StrCat("wire plan: tensor '", w.name, "': this client cannot convert to '",
                                                   w.format, "'"));
    }
    Entry e;
    e.name = w.name;
    e.format = *f;
    e.transpose = w.transpose;
    e.amax_group = w.amax_group;
    for (const WireOutput& o : w.outputs) {
      absl::StatusOr<uint64_t> bytes = DenseBytes(o.dtype, o.shape);
      if (!bytes.ok()) return absl::InvalidArgumentError(absl::StrCat("wire plan: tensor '", w.name, "': ", bytes.status().message()));
      e.outputs.push_back({o.suffix, o.dtype, o.shape, *bytes});
    }
    if (e.outputs.size() != formats::Info(*f).Outputs().size()) {
      return absl::InvalidArgumentError(absl::StrCat("wire plan: tensor '", w.name, "': ", e.outputs.size(),
                                                     " outputs for ", w.format));
    }
    if (!c.by_name_.emplace(e.name, c.entries_.size()).second) {
      return absl::InvalidArgumentError(absl::StrCat("wire plan: tensor '", w.name, "' listed twice"));
    }
    c.entries_.push_back(std::move(e));
  }
  return c;
}

const TrainerConverter::Entry* TrainerConverter::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

absl::Status TrainerConverter::CheckInput(const Entry& e, DType dtype, const Shape& shape) const {
  absl::StatusOr<std::vector<formats::OutputSpec>> outs = formats::PlanOutputs(e.format, dtype, Quantized(e, shape));
  bool same = outs.ok() && outs->size() == e.outputs.size();
  for (size_t i = 0; same && i < e.outputs.size(); ++i) {
    same = (*outs)[i].suffix == e.outputs[i].suffix && (*outs)[i].dtype == e.outputs[i].dtype &&
           (*outs)[i].shape == e.outputs[i].shape;
  }
  if (same) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "tensor '", e.name, "': pushed as ", Describe(dtype, shape), ", which does not give the ",
      formats::FormatName(e.format), " outputs refitd's wire plan lists for it (data ",
      Describe(e.outputs[0].dtype, e.outputs[0].shape), ")", outs.ok() ? "" : absl::StrCat(": ", outs.status().message())));
}

absl::StatusOr<std::vector<TrainerConverter::SliceOutput>> TrainerConverter::SliceOutputs(
    const Entry& e, DType dtype, const Shape& shape, const TensorSlice& slice) const {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", e.name, "': wire format checkpoint: a slice of a tensor the "
                                                   "plan converts to ", formats::FormatName(e.format), " ", why));
  };
  if (e.transpose) return bad("is not supported: the tensor is transposed before quantizing; push it whole");
  if (absl::Status st = CheckInput(e, dtype, slice.full_shape); !st.ok()) return st;
  const size_t rank = shape.size();
  const int d = slice.dim;
  const int64_t block = formats::BlockAlong(e.format, d, rank);
  const uint64_t start = slice.start, length = static_cast<uint64_t>(shape[static_cast<size_t>(d)]);
  const uint64_t full = static_cast<uint64_t>(slice.full_shape[static_cast<size_t>(d)]);
  if (start % static_cast<uint64_t>(block) != 0 || (length % static_cast<uint64_t>(block) != 0 && start + length != full)) {
    return bad(absl::StrCat("must not cut its ", block, "-element blocks along dimension ", d, ": rows [", start, ", ",
                            start + length, ") of ", full));
  }
  absl::StatusOr<std::vector<formats::OutputSpec>> outs = formats::PlanOutputs(e.format, dtype, shape);
  if (!outs.ok()) return bad(std::string(outs.status().message()));
  const auto roles = formats::Info(e.format).Outputs();
  const formats::BlockGeometry& g = formats::Info(e.format).block;
  std::vector<SliceOutput> result;
  for (size_t j = 0; j < outs->size(); ++j) {
    SliceOutput o{(*outs)[j].dtype, (*outs)[j].shape, {}};
    o.slice.full_shape = e.outputs[j].shape;
    o.slice.dim = d;
    o.slice.start = start;
    switch (roles[j].shape) {
      case formats::OutputShape::kInput:
        break;
      case formats::OutputShape::kPackedPairs:
        if (static_cast<size_t>(d) + 1 == rank) o.slice.start = start / 2;
        break;
      case formats::OutputShape::kPerBlock:
        if (static_cast<size_t>(d) + 2 == rank) o.slice.start = start / static_cast<uint64_t>(g.rows);
        if (static_cast<size_t>(d) + 1 == rank) o.slice.start = start / static_cast<uint64_t>(g.cols);
        break;
      case formats::OutputShape::kPerBlockPacked:
        if (static_cast<size_t>(d) + 2 == rank) o.slice.start = start / static_cast<uint64_t>(g.rows);
        if (static_cast<size_t>(d) + 1 == rank) o.slice.start = start / static_cast<uint64_t>(g.cols);
        break;
      case formats::OutputShape::kPackedInt4x8:
        if (static_cast<size_t>(d) + 1 == rank) o.slice.start = start / 8;
        break;
      case formats::OutputShape::kScalar:
      case formats::OutputShape::kSingle:
      case formats::OutputShape::kShapeVector:
        // NVFP4's global scale: whole, the same from every rank (the amax reduced over them);
        // compressed-tensors' weight_shape: the whole tensor's shape.
        o.slice = TensorSlice{};
        o.shape = e.outputs[j].shape;
        result.push_back(std::move(o));
        continue;
    }
    if (o.slice.full_shape.size() != o.shape.size()) return bad("gives outputs of another rank");
    result.push_back(std::move(o));
  }
  return result;
}

absl::Status TrainerConverter::ConvertHost(const Entry& e, DType dtype, const Shape& shape, const void* data,
                                           std::span<const formats::MutableBytes> outs,
                                           std::optional<float> global_amax) const {
  const ConvertStep step{ConvertKind::kQuantize, e.format, e.transpose};
  return ConvertFull(step, formats::ConstTensor{dtype, shape, data}, options_, global_amax, outs, e.name);
}

bool TrainerConverter::NeedsReducedAmax(const Entry& e, bool slice) {
  return formats::NeedsGlobalAmax(e.format) && (slice || !e.amax_group.empty());
}

}  // namespace refit::client
