#include "refit/wire_plan.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "formats/format_info.h"
#include "refit/megatron_source.h"

namespace refit {
namespace {

const char* Fp32InputName(formats::Fp32InputPolicy p) {
  return p == formats::Fp32InputPolicy::kRoundToBf16 ? "round_to_bf16" : "exact";
}

const char* NonfiniteName(formats::NonfinitePolicy p) {
  return p == formats::NonfinitePolicy::kPropagate ? "propagate" : "reject";
}

std::string Describe(DType t, const Shape& s) { return absl::StrCat(DTypeName(t), ShapeString(s)); }

}  // namespace

absl::StatusOr<std::shared_ptr<const WireTable>> WireTable::Create(const Planner& planner, const Manifest& manifest) {
  auto table = std::make_shared<WireTable>();
  const formats::QuantizeOptions& options = planner.spec().options;
  table->plan_.fp32_input = Fp32InputName(options.fp32_input);
  table->plan_.nonfinite = NonfiniteName(options.nonfinite);
  if (manifest.wire_format != WireFormat::kCheckpoint) return table;
  const std::optional<spec::MegatronSource>& source = planner.spec().source;
  for (size_t i = 0; i < manifest.tensors.size(); ++i) {
    const TensorDesc& t = manifest.tensors[i];
    if (source) {
      // A Megatron-core name stands for pieces of several checkpoint tensors: refitd maps and
      // converts it. Checkpoint names are eligible.
      absl::StatusOr<std::vector<TensorDesc>> mapped = MapMegatronManifest(*source, t);
      if (!mapped.ok()) return mapped.status();
      if (mapped->size() != 1 || (*mapped)[0].name != t.name) continue;
    }
    absl::StatusOr<std::shared_ptr<const TensorPlan>> plan = planner.SharedPlan(t.name, t.dtype, t.shape);
    if (!plan.ok()) return plan.status();
    const TensorPlan& p = **plan;
    if (p.kind != ConvertKind::kQuantize || !formats::Info(p.format).quantized) continue;
    absl::StatusOr<std::vector<formats::OutputSpec>> outs = formats::PlanOutputs(p.format, t.dtype, p.input_shape);
    if (!outs.ok()) return outs.status();
    WireEntry e;
    e.input = t;
    e.plan = *plan;
    const auto roles = formats::Info(p.format).Outputs();
    WireTensor w;
    w.tensor = static_cast<uint32_t>(i);
    w.name = t.name;
    w.format = formats::FormatName(p.format);
    w.transpose = p.transpose;
    w.amax_group = p.amax_group;  // fused NVFP4 members: the trainer reduces their amax
    for (size_t j = 0; j < outs->size(); ++j) {
      const formats::OutputSpec& o = (*outs)[j];
      auto copy = std::make_shared<TensorPlan>();
      copy->rule = p.rule;
      copy->kind = ConvertKind::kCopy;
      copy->input_shape = o.shape;
      copy->shard_dim = p.shard_dim;
      copy->shard_parts = p.shard_parts;
      copy->shard_index = p.shard_index;
      // The output's targets: one, or over several engine ranks each rank's (its part, or the
      // one they share), in rank order. The copy has that one output.
      for (const Target& target : p.targets) {
        if (target.output != j) continue;
        if (target.spec.suffix != o.suffix || target.full_shape != o.shape || target.spec.dtype != o.dtype) {
          return absl::InternalError(
              absl::StrCat("tensor '", t.name, "': output '", o.suffix, "' and its target disagree"));
        }
        copy->targets.push_back(target);
        copy->targets.back().output = 0;
      }
      if (copy->targets.empty()) {
        return absl::InternalError(absl::StrCat("tensor '", t.name, "': output '", o.suffix, "' has no target"));
      }
      e.copies.push_back(std::move(copy));
      const formats::OutputShape shape = j < roles.size() ? roles[j].shape : formats::OutputShape::kInput;
      e.is_scale.push_back(shape == formats::OutputShape::kPerBlock || shape == formats::OutputShape::kScalar ||
                           shape == formats::OutputShape::kSingle);
      // The F32 global scale of a format with a global amax (0-d, or [1] for compressed-tensors).
      if (shape == formats::OutputShape::kScalar ||
          (shape == formats::OutputShape::kSingle && roles[j].dtype == DType::kF32 &&
           formats::NeedsGlobalAmax(p.format))) {
        e.global_scale = static_cast<int>(j);
      }
      w.outputs.push_back({o.suffix, o.dtype, o.shape});
      table->by_output_[t.name + o.suffix] = {table->entries_.size(), j};
    }
    e.outputs = std::move(*outs);
    table->by_tensor_[t.name] = table->entries_.size();
    table->entries_.push_back(std::move(e));
    table->plan_.tensors.push_back(std::move(w));
  }
  return std::shared_ptr<const WireTable>(std::move(table));
}

const WireEntry* WireTable::FindOutput(const std::string& name, size_t* output) const {
  auto it = by_output_.find(name);
  if (it == by_output_.end()) return nullptr;
  *output = it->second.second;
  return &entries_[it->second.first];
}

const WireEntry* WireTable::FindTensor(const std::string& name) const {
  auto it = by_tensor_.find(name);
  return it == by_tensor_.end() ? nullptr : &entries_[it->second];
}

absl::Status CheckWireOutput(const WireEntry& entry, size_t output, const TensorDesc& arrived) {
  const formats::OutputSpec& want = entry.outputs[output];
  const std::string format = formats::FormatName(entry.plan->format);
  const Shape& shape = arrived.slice.present() ? arrived.slice.full_shape : arrived.shape;
  if (arrived.dtype != want.dtype || shape != want.shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", entry.input.name, "': wire format checkpoint: '", arrived.name, "' arrived as ",
        Describe(arrived.dtype, shape), arrived.slice.present() ? " (a slice's full shape)" : "", "; the session's plan converts the tensor to ", format,
        ", whose output '", want.suffix.empty() ? "(data)" : want.suffix, "' is ", Describe(want.dtype, want.shape)));
  }
  return absl::OkStatus();
}

absl::Status CheckWireScales(const WireEntry& entry, size_t output, const uint8_t* host_bytes, uint64_t bytes) {
  if (!entry.is_scale[output]) return absl::OkStatus();
  const formats::OutputSpec& o = entry.outputs[output];
  auto bad = [&](uint64_t index) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", entry.input.name, "': wire format checkpoint: scale '",
                                                   entry.input.name, o.suffix, "' is not finite at flat index ", index));
  };
  switch (o.dtype) {
    case DType::kF32:
      for (uint64_t i = 0; i < bytes / 4; ++i) {
        float v;
        std::memcpy(&v, host_bytes + i * 4, 4);
        if (!std::isfinite(v)) return bad(i);
      }
      break;
    case DType::kF8E4M3:
      for (uint64_t i = 0; i < bytes; ++i) {
        if ((host_bytes[i] & 0x7F) == 0x7F) return bad(i);
      }
      break;
    case DType::kU8:  // biased E8M0: 0xFF is NaN
      for (uint64_t i = 0; i < bytes; ++i) {
        if (host_bytes[i] == 0xFF) return bad(i);
      }
      break;
    default:
      break;
  }
  return absl::OkStatus();
}

absl::Status CheckWireGlobalScale(const WireEntry& entry, float scale_2) {
  if (std::isfinite(scale_2) && scale_2 > 0.0f) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "tensor '", entry.input.name, "': wire format checkpoint: global scale '", entry.input.name,
      entry.outputs[static_cast<size_t>(entry.global_scale)].suffix, "' is ", scale_2,
      "; an NVFP4 global scale encodes a positive, finite amax"));
}

}  // namespace refit
