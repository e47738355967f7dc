#include "client/trainer_convert.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "formats/format_info.h"
#include "refit/convert.h"
#if REFIT_CLIENT_KERNELS
#include <cuda_runtime_api.h>

#include "common/device_allocation.h"
#include "kernels/layout.h"
#include "kernels/quantize.h"
#include "storage/memory.h"
#endif

namespace refit::client {
namespace {

std::string Describe(DType t, const Shape& s) { return absl::StrCat(DTypeName(t), ShapeString(s)); }

Shape Quantized(const TrainerConverter::Entry& e, const Shape& shape) {
  Shape s = shape;
  if (e.transpose && s.size() >= 2) std::swap(s[s.size() - 1], s[s.size() - 2]);
  return s;
}

}  // namespace

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

bool TrainerConverter::HasKernels() {
#if REFIT_CLIENT_KERNELS
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::vector<std::shared_ptr<uint8_t>>> TrainerConverter::ConvertDevice(const Entry& e, DType dtype,
                                                                                       const Shape& shape,
                                                                                       const void* data,
                                                                                       std::optional<float> global_amax) const {
#if REFIT_CLIENT_KERNELS
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, data) != cudaSuccess || attr.type != cudaMemoryTypeDevice) {
    (void)cudaGetLastError();
    return absl::InvalidArgumentError(absl::StrCat("tensor '", e.name, "': not CUDA device memory"));
  }
  int previous = 0;
  (void)cudaGetDevice(&previous);
  if (cudaSetDevice(attr.device) != cudaSuccess) {
    return absl::InternalError(absl::StrCat("tensor '", e.name, "': cannot use CUDA device ", attr.device));
  }
  std::vector<std::shared_ptr<uint8_t>> buffers;
  std::vector<formats::MutableBytes> outs;
  absl::Status st = [&]() -> absl::Status {
    absl::StatusOr<std::vector<formats::OutputSpec>> planned = formats::PlanOutputs(e.format, dtype, Quantized(e, shape));
    if (!planned.ok()) return planned.status();
    for (const formats::OutputSpec& o : *planned) {
      absl::StatusOr<DeviceAllocation> a = DeviceAllocation::Allocate(attr.device, std::max<uint64_t>(o.bytes, 1));
      if (!a.ok()) return a.status();
      auto holder = std::make_shared<DeviceAllocation>(std::move(*a));
      buffers.push_back(std::shared_ptr<uint8_t>(holder, holder->as<uint8_t>()));
      outs.push_back({buffers.back().get(), o.bytes});
    }
    absl::StatusOr<uint64_t> nbytes = DenseBytes(dtype, shape);
    if (!nbytes.ok()) return nbytes.status();
    formats::ConstTensor in{dtype, shape, data};
    DeviceAllocation transposed;
    if (e.transpose) {
      if (shape.size() < 2) return absl::InvalidArgumentError(absl::StrCat("tensor '", e.name, "': transpose needs rank >= 2"));
      absl::StatusOr<DeviceAllocation> t = DeviceAllocation::Allocate(attr.device, std::max<uint64_t>(*nbytes, 1));
      if (!t.ok()) return t.status();
      transposed = std::move(*t);
      int64_t batch = 1;
      for (size_t i = 0; i + 2 < shape.size(); ++i) batch *= shape[i];
      const int64_t rows = shape[shape.size() - 2], cols = shape[shape.size() - 1];
      if (absl::Status t2 = kernels::TransposeLast2(data, batch, rows, cols, static_cast<int>(DTypeSize(dtype)),
                                                    transposed.get(), nullptr);
          !t2.ok()) {
        return t2;
      }
      in.shape = Quantized(e, shape);
      in.data = transposed.get();
    }
    std::optional<kernels::NonfiniteProbe> probe;
    if (options_.nonfinite == formats::NonfinitePolicy::kReject) {
      absl::StatusOr<kernels::NonfiniteProbe> p = kernels::NonfiniteProbe::Create();
      if (!p.ok()) return p.status();
      probe.emplace(std::move(*p));
      if (absl::Status r = probe->Reset(nullptr); !r.ok()) return r;
    }
    kernels::GlobalAmax amax;
    DeviceAllocation amax_word;
    if (formats::NeedsGlobalAmax(e.format) && global_amax) {
      // The caller's reduced amax (fused group, or every rank's slices), refused when below the
      // bytes' own max|x| (one amax pass and a 4-byte read back), as the host path refuses it.
      absl::StatusOr<DeviceAllocation> a = DeviceAllocation::Allocate(attr.device, sizeof(float));
      if (!a.ok()) return a.status();
      amax_word = std::move(*a);
      if (absl::Status r = kernels::ResetAmax(amax_word.as<float>(), nullptr); !r.ok()) return r;
      if (absl::Status r = kernels::AccumulateAmax(in, options_, amax_word.as<float>(), nullptr); !r.ok()) return r;
      float own = 0.0f;
      if (cudaError_t err = cudaMemcpy(&own, amax_word.get(), sizeof(float), cudaMemcpyDeviceToHost); err != cudaSuccess) {
        return absl::InternalError(absl::StrCat("tensor '", e.name, "': reading its amax back: ", cudaGetErrorString(err)));
      }
      if (!std::isnan(own) && !(*global_amax >= own)) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", e.name, "': global amax ", *global_amax,
                                                       " is below the tensor's own max|x| ", own));
      }
      amax.host = *global_amax;
    } else if (formats::NeedsGlobalAmax(e.format)) {
      // The tensor's own amax, as refitd's GPU converter computes it (device float, no round trip).
      absl::StatusOr<DeviceAllocation> a = DeviceAllocation::Allocate(attr.device, sizeof(float));
      if (!a.ok()) return a.status();
      amax_word = std::move(*a);
      if (absl::Status r = kernels::ResetAmax(amax_word.as<float>(), nullptr); !r.ok()) return r;
      if (absl::Status r = kernels::AccumulateAmax(in, options_, amax_word.as<float>(), nullptr); !r.ok()) return r;
      amax.device = amax_word.as<float>();
    }
    if (absl::Status q = kernels::Quantize(e.format, in, options_, amax, outs, e.name, probe ? &*probe : nullptr, nullptr);
        !q.ok()) {
      return q;
    }
    if (probe) {
      if (absl::Status c = probe->Check(e.name, nullptr); !c.ok()) return c;
    }
    if (cudaError_t err = cudaStreamSynchronize(nullptr); err != cudaSuccess) {
      return absl::InternalError(absl::StrCat("tensor '", e.name, "': converting on the GPU: ", cudaGetErrorString(err)));
    }
    return absl::OkStatus();
  }();
  (void)cudaSetDevice(previous);
  if (!st.ok()) return st;
  return buffers;
#else
  (void)dtype;
  (void)shape;
  (void)data;
  (void)global_amax;
  return absl::UnimplementedError(absl::StrCat("tensor '", e.name, "': this client was built without CUDA kernels; "
                                               "push it from host memory or use wire format bf16"));
#endif
}

}  // namespace refit::client
