// GpuConverter::ConvertPlanned: a tensor's whole plan (transpose, encode, shard slices, a copy to
// each target) on one lane of the device.
#include <cuda_runtime.h>

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/layout.h"
#include "kernels/quantize.h"
#include "refit/gpu/gpu_converter_internal.h"
#include "refit/resolve.h"

namespace refit::gpu_internal {

absl::Status GpuConverter::ConvertPlanned(const TensorPlan& plan, const TensorDesc& desc, const uint8_t* src,
                                          storage::MemoryKind src_kind, std::span<const formats::MutableBytes> outs,
                                          const formats::QuantizeOptions& options, const PlannedAmax& planned) {
  cudaSetDevice(device_);
  MarkBucketStart();
  if (outs.size() != plan.targets.size()) {
    return absl::InternalError(
        absl::StrCat("tensor '", desc.name, "': ", outs.size(), " outputs for ", plan.targets.size(), " targets"));
  }
  // The slot first (see Convert); then the whole plan of this tensor on one lane.
  std::optional<DeviceArena::Slot> slot;
  if (plan.kind != ConvertKind::kCopy) {
    absl::StatusOr<DeviceArena::Slot> taken = TakeSlot();
    if (!taken.ok()) return taken.status();
    slot = *taken;
  }
  const cudaStream_t lane = src_kind == storage::MemoryKind::kHost ? stream_.get() : Lane(desc.nbytes);
  absl::StatusOr<const uint8_t*> input = DeviceInput(desc, src, src_kind);
  if (!input.ok()) return input.status();
  formats::ConstTensor in{desc.dtype, desc.shape, *input};
  if (plan.transpose) {
    const size_t r = desc.shape.size();
    if (r < 2) return absl::InvalidArgumentError(absl::StrCat("tensor '", desc.name, "': transpose needs rank >= 2"));
    int64_t batch = 1;
    for (size_t i = 0; i + 2 < r; ++i) batch *= desc.shape[i];
    absl::StatusOr<uint8_t*> t = Scratch(desc.nbytes);
    if (!t.ok()) return t.status();
    absl::Status st = kernels::TransposeLast2(*input, batch, desc.shape[r - 2], desc.shape[r - 1],
                                              static_cast<int>(DTypeSize(desc.dtype)), *t, lane);
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat("tensor '", desc.name, "': ", st.message()));
    std::swap(in.shape[r - 1], in.shape[r - 2]);
    in.data = *t;
  }
  // Whole outputs: straight into a target's staging when that target is its output's only taker
  // and holds all of it; else into scratch, from which each target takes its part (this rank's
  // shard slice; over engine ranks, every rank's) or a copy. A target with no bytes to write
  // (`outs[i].data` null: over engine ranks, a part another target already stages) takes nothing.
  const bool sharded = plan.shard_dim.has_value() && plan.shard_parts > 1;
  size_t n_outputs = 0;
  for (const Target& t : plan.targets) n_outputs = std::max(n_outputs, t.output + 1);
  std::vector<int> takers(n_outputs, 0);
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i].data != nullptr) ++takers[plan.targets[i].output];
  }
  // 0-d outputs and scales spanning the split dimension are replicated (SplitsOutput).
  auto is_part = [&](const Target& t) {
    return sharded && SplitsOutput(t.full_shape, plan.shard_dim, plan.shard_parts);
  };
  std::vector<formats::MutableBytes> whole(n_outputs);
  std::vector<bool> in_place(outs.size(), false);
  for (size_t i = 0; i < outs.size(); ++i) {
    const Target& t = plan.targets[i];
    if (outs[i].data == nullptr || is_part(t) || takers[t.output] != 1) continue;
    whole[t.output] = outs[i];
    in_place[i] = true;
  }
  // Over engine ranks, an output split by rows whose parts were staged back to back in shard
  // order (Staging::AllocateRun) is written whole in place: no scratch, no slicing.
  if (sharded) {
    const size_t d = static_cast<size_t>(*plan.shard_dim);
    for (size_t o = 0; o < n_outputs; ++o) {
      if (whole[o].data != nullptr) continue;
      std::vector<size_t> order(static_cast<size_t>(plan.shard_parts), outs.size());
      size_t found = 0;
      bool rows = true;
      uint64_t full = 0;
      for (size_t i = 0; i < outs.size() && rows; ++i) {
        const Target& t = plan.targets[i];
        if (t.output != o || outs[i].data == nullptr) continue;
        rows = is_part(t) && t.full_shape.size() > d && t.shard_index >= 0 && t.shard_index < plan.shard_parts &&
               order[static_cast<size_t>(t.shard_index)] == outs.size();
        for (size_t k = 0; k < d && rows; ++k) rows = t.full_shape[k] == 1;
        if (!rows) break;
        order[static_cast<size_t>(t.shard_index)] = i;
        ++found;
        absl::StatusOr<uint64_t> n = DenseBytes(t.spec.dtype, t.full_shape);
        if (!n.ok()) return n.status();
        full = *n;
      }
      if (!rows || found != order.size()) continue;
      uint8_t* const start = static_cast<uint8_t*>(outs[order.front()].data);
      uint8_t* next = start;
      for (size_t i : order) {
        rows = rows && outs[i].data == next;
        next += outs[i].bytes;
      }
      if (!rows || next != start + full) continue;
      whole[o] = {start, full};
      for (size_t i : order) in_place[i] = true;
    }
  }
  for (size_t i = 0; i < plan.targets.size(); ++i) {
    const Target& t = plan.targets[i];
    if (whole[t.output].data != nullptr) continue;
    absl::StatusOr<uint64_t> n = DenseBytes(t.spec.dtype, t.full_shape);
    if (!n.ok()) return n.status();
    absl::StatusOr<uint8_t*> buf = Scratch(*n);
    if (!buf.ok()) return buf.status();
    whole[t.output] = {*buf, *n};
  }
  if (plan.kind == ConvertKind::kCopy) {
    if (whole.size() != 1 || whole[0].bytes != desc.nbytes) {
      return absl::InternalError(absl::StrCat("tensor '", desc.name, "': copy output does not fit"));
    }
    cudaError_t e = cudaMemcpyAsync(whole[0].data, in.data, desc.nbytes, cudaMemcpyDeviceToDevice, lane);
    if (e != cudaSuccess) return CudaStatus(e, absl::StrCat("staging '", desc.name, "'"));
  } else {
    const bool reject = options.nonfinite == formats::NonfinitePolicy::kReject;
    kernels::GlobalAmax amax;
    const bool check = formats::NeedsGlobalAmax(plan.format) && planned.claim.has_value();
    if (formats::NeedsGlobalAmax(plan.format)) {
      // A supplied amax is checked in the encode itself (every block's max|x| against it).
      amax.claim = planned.claim;
      if (planned.device != nullptr) {
        amax.device = planned.device;
      } else if (planned.host) {
        amax.host = planned.host;
      } else {
        absl::Status st = kernels::AccumulateAmax(in, options, slot->amax, lane);
        if (!st.ok()) return st;
        amax.device = slot->amax;
      }
    }
    absl::Status st = kernels::QuantizeRecording(plan.format, in, options, amax, whole, desc.name,
                                                 reject || check ? slot->probe : nullptr, lane);
    if (!st.ok()) return st;
    if (reject || check) pending_.push_back({desc.name, slot->index, amax.claim});
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i].data == nullptr || in_place[i]) continue;
    const Target& t = plan.targets[i];
    const formats::MutableBytes& from = whole[t.output];
    if (!is_part(t)) {
      if (from.bytes != outs[i].bytes) {
        return absl::InternalError(absl::StrCat("tensor '", desc.name, "': whole output of ", from.bytes,
                                                " bytes for a staged copy of ", outs[i].bytes));
      }
      cudaError_t e = cudaMemcpyAsync(outs[i].data, from.data, from.bytes, cudaMemcpyDeviceToDevice, lane);
      if (e != cudaSuccess) return CudaStatus(e, absl::StrCat("staging '", desc.name, "' for ", t.key));
      continue;
    }
    // Part `t.shard_index` of `parts` along the shard dim: `outer` rows of `chunk` bytes, `n * inner` apart.
    const Shape& f = t.full_shape;
    const size_t d = static_cast<size_t>(*plan.shard_dim);
    uint64_t outer = 1, inner = DTypeSize(t.spec.dtype);
    for (size_t k = 0; k < d; ++k) outer *= static_cast<uint64_t>(f[k]);
    for (size_t k = d + 1; k < f.size(); ++k) inner *= static_cast<uint64_t>(f[k]);
    const uint64_t n = static_cast<uint64_t>(f[d]), chunk = n / static_cast<uint64_t>(plan.shard_parts) * inner;
    if (chunk * outer != outs[i].bytes) {
      return absl::InternalError(absl::StrCat("tensor '", desc.name, "': shard of ", chunk * outer,
                                              " bytes for a staged part of ", outs[i].bytes));
    }
    if (chunk == 0 || outer == 0) continue;
    cudaError_t e = cudaMemcpy2DAsync(
        outs[i].data, chunk, static_cast<const uint8_t*>(from.data) + static_cast<uint64_t>(t.shard_index) * chunk,
        n * inner, chunk, outer, cudaMemcpyDeviceToDevice, lane);
    if (e != cudaSuccess) return CudaStatus(e, absl::StrCat("slicing '", desc.name, "' for ", t.key));
  }
  Count(&GpuConverterStats::tensors);
  Count(&GpuConverterStats::planned);
  return absl::OkStatus();
}

absl::StatusOr<const uint8_t*> GpuConverter::DeviceInput(const TensorDesc& desc, const uint8_t* src,
                                                         storage::MemoryKind src_kind) {
  if (src_kind != storage::MemoryKind::kHost) return src;
  absl::StatusOr<uint8_t*> scratch = Scratch(desc.nbytes);
  if (!scratch.ok()) return scratch.status();
  cudaError_t e = cudaMemcpyAsync(*scratch, src, desc.nbytes, cudaMemcpyHostToDevice, stream_.get());
  if (e != cudaSuccess) return CudaStatus(e, absl::StrCat("copying '", desc.name, "' to the GPU"));
  return static_cast<const uint8_t*>(*scratch);
}

}  // namespace refit::gpu_internal
