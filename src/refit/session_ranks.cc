// Session's staging of one tensor (Stage): its outputs allocated in staging and converted into
// them, straight by the converter, whole on the host with this rank's part cut out, or over the
// engine's ranks (an engine of several rank processes, docs/architecture.md "Engine ranks"): each
// rank's rows converted alone into its parts, the parts staged as one run and converted whole in
// place, or the tensor converted whole once and each distinct part staged. Converter thread only.
#include <algorithm>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "formats/format.h"
#include "formats/format_info.h"
#include "refit/convert.h"
#include "refit/session.h"

namespace refit {
namespace {

// Where output `o`'s parts among `distinct` lie when the output is split by rows over the engine
// ranks: every part present (one per shard index), and nothing before the shard dim, so that
// part k is bytes [k * part, (k + 1) * part) of the whole output. Their indices into `distinct`
// in shard order; empty otherwise.
absl::InlinedVector<size_t, 8> RowParts(const TensorPlan& plan, std::span<const Target* const> distinct, size_t o) {
  absl::InlinedVector<size_t, 8> order;
  if (!plan.shard_dim.has_value() || plan.shard_parts <= 1) return {};
  const size_t d = static_cast<size_t>(*plan.shard_dim);
  order.assign(static_cast<size_t>(plan.shard_parts), distinct.size());
  size_t found = 0;
  for (size_t i = 0; i < distinct.size(); ++i) {
    const Target& t = *distinct[i];
    if (t.output != o) continue;
    if (t.full_shape.size() <= d || !SplitsOutput(t.full_shape, plan.shard_dim, plan.shard_parts) ||
        t.shard_index < 0 || t.shard_index >= plan.shard_parts) {
      return {};
    }
    for (size_t k = 0; k < d; ++k) {
      if (t.full_shape[k] != 1) return {};
    }
    size_t& slot = order[static_cast<size_t>(t.shard_index)];
    if (slot != distinct.size()) return {};
    slot = i;
    ++found;
  }
  if (found != order.size()) return {};
  return order;
}

// Whether the parts `order` (RowParts) lie back to back in `outs`, `whole` bytes in all.
bool InOneRun(const absl::InlinedVector<size_t, 8>& order, std::span<const formats::MutableBytes> outs,
              uint64_t whole) {
  if (order.empty()) return false;
  const uint8_t* next = static_cast<const uint8_t*>(outs[order.front()].data);
  if (next == nullptr) return false;
  const uint8_t* const start = next;
  for (size_t i : order) {
    if (outs[i].data != next) return false;
    next += outs[i].bytes;
  }
  return next == start + whole;
}

// Rows of the input each rank's parts take when every output of `plan` is split by rows over the
// ranks, each rank's part of each output its own target (nothing shared), and converting a
// rank's input rows alone gives exactly that rank's parts (a row-local conversion without a
// tensor-wide amax, the parts on whole blocks): then each rank's rows convert as a tensor of
// their own. nullopt where any of that does not hold.
std::optional<int64_t> RowsPerRank(const TensorPlan& plan, const TensorDesc& desc,
                                   std::span<const Target* const> distinct) {
  if (plan.shard_dim != 0 || plan.shard_parts <= 1 || plan.transpose || desc.shape.empty()) return std::nullopt;
  if (distinct.size() != plan.targets.size() || desc.shape[0] % plan.shard_parts != 0) return std::nullopt;
  const bool quantize = plan.kind == ConvertKind::kQuantize;
  if (quantize && formats::NeedsGlobalAmax(plan.format)) return std::nullopt;
  const int64_t rows = desc.shape[0] / plan.shard_parts;
  Shape part = desc.shape;
  part[0] = rows;
  std::vector<formats::OutputSpec> planned;
  if (quantize) {
    if (rows % formats::BlockAlong(plan.format, 0, desc.shape.size()) != 0) return std::nullopt;
    absl::StatusOr<std::vector<formats::OutputSpec>> o = formats::PlanOutputs(plan.format, desc.dtype, part);
    if (!o.ok()) return std::nullopt;
    planned = *std::move(o);
  }
  for (const Target& t : plan.targets) {
    if (t.shard_index < 0 || t.shard_index >= plan.shard_parts || t.spec.shape.empty() ||
        t.full_shape.size() != t.spec.shape.size() || t.spec.shape[0] * plan.shard_parts != t.full_shape[0]) {
      return std::nullopt;  // an output whose rows do not split with the input's (a whole-tensor scale)
    }
    if (quantize ? (t.output >= planned.size() || planned[t.output].shape != t.spec.shape ||
                    planned[t.output].bytes != t.spec.bytes)
                 : (t.output != 0 || t.spec.shape != part)) {
      return std::nullopt;
    }
  }
  return rows;
}

// `outs` (one per distinct target) in output order when every output of `plan` has exactly one
// distinct target holding the whole output (not a shard part): what Converter::Convert takes.
// nullopt otherwise.
std::optional<std::vector<formats::MutableBytes>> WholeOutputs(const TensorPlan& plan,
                                                               std::span<const Target* const> distinct,
                                                               std::span<const formats::MutableBytes> outs) {
  if (plan.shard_dim.has_value() && plan.shard_parts > 1) return std::nullopt;
  std::vector<formats::MutableBytes> whole(distinct.size(), formats::MutableBytes{nullptr, 0});
  for (size_t i = 0; i < distinct.size(); ++i) {
    const Target& t = *distinct[i];
    if (t.output >= whole.size() || whole[t.output].data != nullptr || outs[i].data == nullptr ||
        t.spec.shape != t.full_shape) {
      return std::nullopt;
    }
    whole[t.output] = outs[i];
  }
  return whole;
}

}  // namespace

absl::Status Session::ConvertRowsPerRank(const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                                         const TensorPlan& plan, int64_t rows, std::span<const Target* const> distinct,
                                         std::span<const formats::MutableBytes> outs) {
  const uint64_t part_bytes = desc.nbytes / static_cast<uint64_t>(plan.shard_parts);
  TensorDesc part = desc;
  part.shape[0] = rows;
  part.nbytes = part_bytes;
  absl::InlinedVector<formats::MutableBytes, 4> rank_outs;
  for (int64_t r = 0; r < plan.shard_parts; ++r) {
    rank_outs.assign(formats::kMaxOutputs, formats::MutableBytes{nullptr, 0});
    size_t n = 0;
    for (size_t i = 0; i < distinct.size(); ++i) {
      if (distinct[i]->shard_index != r) continue;
      rank_outs[distinct[i]->output] = outs[i];
      n = std::max(n, distinct[i]->output + 1);
    }
    rank_outs.resize(n);
    REFIT_RETURN_IF_ERROR(converter_.Convert(plan, part, src + static_cast<uint64_t>(r) * part_bytes, src_kind,
                                             rank_outs, planner_.spec().options));
  }
  return absl::OkStatus();
}

absl::Status Session::AllocateRuns(const TensorPlan& plan, std::span<const Target* const> distinct,
                                   std::span<formats::MutableBytes> outs) {
  size_t n_outputs = 0;
  for (const Target* t : distinct) n_outputs = std::max(n_outputs, t->output + 1);
  for (size_t o = 0; o < n_outputs; ++o) {
    const absl::InlinedVector<size_t, 8> order = RowParts(plan, distinct, o);
    if (order.empty()) continue;
    absl::InlinedVector<Staging::RunPart, 8> parts;
    for (size_t i : order) {
      const Target& t = *distinct[i];
      parts.push_back({&t.key, t.spec.dtype, &t.spec.shape, t.spec.bytes});
    }
    absl::StatusOr<std::vector<uint8_t*>> run = staging_->AllocateRun(parts);
    if (run.status().code() == absl::StatusCode::kFailedPrecondition) continue;  // placed: one by one
    if (!run.ok()) return run.status();
    for (size_t k = 0; k < order.size(); ++k) outs[order[k]] = {(*run)[k], parts[k].nbytes};
  }
  return absl::OkStatus();
}

void Session::CountFormatBytes(const TensorPlan& plan, uint64_t bytes) {
  const bool copy = plan.kind == ConvertKind::kCopy;
  auto same = [&](const FormatBytes& f) { return f.copy == copy && (copy || f.format == plan.format); };
  auto it = std::find_if(bucket_out_by_format_.begin(), bucket_out_by_format_.end(), same);
  if (it == bucket_out_by_format_.end()) {
    bucket_out_by_format_.push_back({copy, plan.format, bytes});
  } else {
    it->bytes += bytes;
  }
}

absl::Status Session::StageOnRanks(const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                                   const TensorPlan& plan, std::optional<float> global_amax, const float* device_amax,
                                   std::optional<float> claim, std::span<const Target* const> distinct,
                                   std::span<const formats::MutableBytes> outs) {
  const bool sharded = plan.shard_dim.has_value() && plan.shard_parts > 1;
  // Rows split over the ranks whose parts lie apart (`direct`: each in its rank's memory; staged
  // parts lie in one run, converted whole below): each rank's rows convert as a tensor of their
  // own straight into its parts, with no whole output in scratch sliced out afterwards.
  if (!global_amax && device_amax == nullptr && !claim) {
    if (std::optional<int64_t> rows = RowsPerRank(plan, desc, distinct); rows.has_value()) {
      bool apart = false;
      for (size_t o = 0; o < formats::kMaxOutputs && !apart; ++o) {
        const absl::InlinedVector<size_t, 8> order = RowParts(plan, distinct, o);
        apart = !order.empty() && !InOneRun(order, outs, outs[order.front()].bytes * order.size());
      }
      if (apart) return ConvertRowsPerRank(desc, src, src_kind, plan, *rows, distinct, outs);
    }
  }
  // A tensor whose every output lands whole in one place (an expert of one EP rank's range, a
  // tensor every rank shares, staged once): the converter writes straight into staging, as for an
  // engine of one rank, in its batched runs.
  if (!global_amax && device_amax == nullptr && !claim && !plan.transpose) {
    if (std::optional<std::vector<formats::MutableBytes>> whole = WholeOutputs(plan, distinct, outs)) {
      return converter_.Convert(plan, desc, src, src_kind, *whole, planner_.spec().options);
    }
  }
  // Several engine ranks: the tensor is converted whole once, then each rank's part (or the
  // one part they share) is staged: on the GPU by the device ops, else on the host.
  if (DeviceOps* ops = device_ops(); ops != nullptr) {
    absl::InlinedVector<formats::MutableBytes, 8> per_target(plan.targets.size(), formats::MutableBytes{nullptr, 0});
    for (size_t i = 0, d = 0; i < plan.targets.size() && d < distinct.size(); ++i) {
      if (&plan.targets[i] == distinct[d]) per_target[i] = outs[d++];
    }
    return ops->ConvertPlanned(plan, desc, src, src_kind, per_target, planner_.spec().options,
                               PlannedAmax{device_amax, device_amax == nullptr ? global_amax : std::nullopt, claim});
  }
  if (src_kind != storage::MemoryKind::kHost || staging_->kind() != storage::MemoryKind::kHost) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor '", desc.name, "': an engine of several ranks staged on the GPU needs a converter with device ops"));
  }
  // Whole outputs: straight into staging when the output's parts were staged as one run in row
  // order (AllocateRuns), else into host buffers sliced from below.
  std::vector<std::vector<uint8_t>> full;
  std::vector<formats::MutableBytes> full_outs;
  std::vector<bool> in_run(distinct.size(), false);
  for (const Target& t : plan.targets) {
    if (t.output < full.size()) continue;
    REFIT_ASSIGN_OR_RETURN(uint64_t n, DenseBytes(t.spec.dtype, t.full_shape));
    full.emplace_back();
    const absl::InlinedVector<size_t, 8> order = RowParts(plan, distinct, t.output);
    if (InOneRun(order, outs, n)) {
      full_outs.push_back({outs[order.front()].data, n});
      for (size_t i : order) in_run[i] = true;
      continue;
    }
    full.back().resize(n);
    full_outs.push_back({full.back().data(), n});
  }
  const ConvertStep step{plan.kind, plan.format, plan.transpose};
  REFIT_RETURN_IF_ERROR(ConvertFull(step, formats::ConstTensor{desc.dtype, desc.shape, src}, planner_.spec().options,
                                    global_amax, full_outs, desc.name, claim));
  for (size_t i = 0; i < distinct.size(); ++i) {
    if (in_run[i]) continue;
    const Target& t = *distinct[i];
    ShardPart(full[t.output].data(), t.spec.dtype, t.full_shape, sharded ? plan.shard_dim : std::nullopt,
              sharded ? plan.shard_parts : 1, sharded ? t.shard_index : 0, static_cast<uint8_t*>(outs[i].data));
  }
  return absl::OkStatus();
}

absl::Status Session::Stage(const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                            const TensorPlan& plan, std::optional<float> global_amax, uint64_t& out_bytes,
                            const float* device_amax, std::optional<float> claim) {
  const bool sharded = plan.shard_dim.has_value() && plan.shard_parts > 1;
  absl::InlinedVector<formats::MutableBytes, 4> outs;
  if (planner_.ranks() > 1) {
    absl::InlinedVector<const Target*, 4> distinct;
    REFIT_RETURN_IF_ERROR(AllocateOnRanks(plan, distinct, outs, out_bytes));
    return StageOnRanks(desc, src, src_kind, plan, global_amax, device_amax, claim, distinct, outs);
  }
  REFIT_RETURN_IF_ERROR(AllocateTargets(plan, outs, out_bytes));
  if (!sharded && !plan.transpose && !global_amax && device_amax == nullptr) {
    // The common case: the converter (CPU, or GPU kernels) writes straight into staging.
    return converter_.Convert(plan, desc, src, src_kind, outs, planner_.spec().options);
  }
  if (DeviceOps* ops = device_ops(); ops != nullptr) {
    // Staging on the GPU: transpose, whole outputs and this rank's slice of each on the device,
    // from device or host payloads alike.
    return ops->ConvertPlanned(plan, desc, src, src_kind, outs, planner_.spec().options,
                               PlannedAmax{device_amax, device_amax == nullptr ? global_amax : std::nullopt, claim});
  }
  return StageWholeOnHost(desc, src, src_kind, plan, global_amax, claim, outs);
}

absl::Status Session::AllocateOnRanks(const TensorPlan& plan, absl::InlinedVector<const Target*, 4>& distinct,
                                      absl::InlinedVector<formats::MutableBytes, 4>& outs, uint64_t& out_bytes) {
  distinct.clear();
  for (const Target& t : plan.targets) {
    if (std::any_of(distinct.begin(), distinct.end(), [&](const Target* d) { return d->key == t.key; })) {
      continue;  // a part every rank shares: staged once
    }
    distinct.push_back(&t);
  }
  outs.assign(distinct.size(), formats::MutableBytes{nullptr, 0});
  REFIT_RETURN_IF_ERROR(AllocateRuns(plan, distinct, outs));
  uint64_t tensor_bytes = 0;
  for (size_t i = 0; i < distinct.size(); ++i) {
    const Target& t = *distinct[i];
    if (outs[i].data == nullptr) {
      REFIT_ASSIGN_OR_RETURN(uint8_t * buf, staging_->Allocate(t.key, t.spec.dtype, t.spec.shape, t.spec.bytes));
      outs[i] = {buf, t.spec.bytes};
    }
    out_bytes += t.spec.bytes;
    tensor_bytes += t.spec.bytes;
  }
  CountFormatBytes(plan, tensor_bytes);
  return absl::OkStatus();
}

std::optional<std::vector<formats::MutableBytes>> Session::WholeMemberOutputs(const TensorPlan& plan,
                                                                              const StagedMember& staged) const {
  if (planner_.ranks() > 1) return WholeOutputs(plan, staged.distinct, staged.outs);
  if (plan.shard_dim.has_value() && plan.shard_parts > 1) return std::nullopt;
  return std::vector<formats::MutableBytes>(staged.outs.begin(), staged.outs.end());
}

absl::Status Session::AllocateTargets(const TensorPlan& plan, absl::InlinedVector<formats::MutableBytes, 4>& outs,
                                      uint64_t& out_bytes) {
  uint64_t tensor_bytes = 0;
  for (const Target& t : plan.targets) {
    REFIT_ASSIGN_OR_RETURN(uint8_t * buf, staging_->Allocate(t.key, t.spec.dtype, t.spec.shape, t.spec.bytes));
    outs.push_back({buf, t.spec.bytes});
    out_bytes += t.spec.bytes;
    tensor_bytes += t.spec.bytes;
  }
  CountFormatBytes(plan, tensor_bytes);
  return absl::OkStatus();
}

absl::Status Session::StageWholeOnHost(const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                                       const TensorPlan& plan, std::optional<float> global_amax,
                                       std::optional<float> claim, std::span<const formats::MutableBytes> outs) {
  const bool sharded = plan.shard_dim.has_value() && plan.shard_parts > 1;
  // Transposed, sharded or group-scaled tensors are converted whole on the host, then this
  // rank's part is staged.
  if (src_kind != storage::MemoryKind::kHost) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor '", desc.name, "' is transposed, sharded or group-scaled; such tensors need a host data plane"));
  }
  const ConvertStep step{plan.kind, plan.format, plan.transpose};
  const bool host_staging = staging_->kind() == storage::MemoryKind::kHost;
  std::vector<std::vector<uint8_t>> full;  // whole outputs, when this rank keeps a part or staging is on the GPU
  std::vector<formats::MutableBytes> host_outs;
  for (size_t i = 0; i < plan.targets.size(); ++i) {
    const Target& t = plan.targets[i];
    if (!sharded && host_staging) {
      host_outs.push_back(outs[i]);
      continue;
    }
    REFIT_ASSIGN_OR_RETURN(uint64_t n, DenseBytes(t.spec.dtype, sharded ? t.full_shape : t.spec.shape));
    full.emplace_back(n);
    host_outs.push_back({full.back().data(), n});
  }
  REFIT_RETURN_IF_ERROR(ConvertFull(step, formats::ConstTensor{desc.dtype, desc.shape, src}, planner_.spec().options,
                                    global_amax, host_outs, desc.name, claim));
  if (full.empty()) return absl::OkStatus();
  std::vector<uint8_t> part;
  for (size_t i = 0; i < plan.targets.size(); ++i) {
    const Target& t = plan.targets[i];
    const uint8_t* bytes = full[i].data();
    if (sharded) {
      part.resize(t.spec.bytes);
      ShardPart(full[i].data(), t.spec.dtype, t.full_shape, plan.shard_dim, plan.shard_parts, plan.shard_index,
                host_staging ? static_cast<uint8_t*>(outs[i].data) : part.data());
      if (host_staging) continue;
      bytes = part.data();
    }
    REFIT_RETURN_IF_ERROR(
        staging_->pool().memory().CopyFromHost(static_cast<uint8_t*>(outs[i].data), bytes, t.spec.bytes));
  }
  return absl::OkStatus();
}

}  // namespace refit
