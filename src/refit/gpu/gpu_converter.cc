#include "refit/gpu/gpu_converter.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/batch_copy.h"
#include "kernels/batch_quantize.h"
#include "kernels/quantize.h"
#include "refit/gpu/gpu_converter_internal.h"

namespace refit::gpu_internal {

absl::StatusOr<std::unique_ptr<Converter>> GpuConverter::Create(int device, const GpuConverterOptions& options) {
  auto c = std::unique_ptr<GpuConverter>(new GpuConverter(device, options));
  absl::StatusOr<CudaStream> stream = CudaStream::Create(device);
  if (!stream.ok()) {
    return absl::Status(stream.status().code(),
                        absl::StrCat("GPU converter on device ", device, ": ", stream.status().message()));
  }
  c->stream_ = std::move(*stream);
  absl::StatusOr<CudaStream> side = CudaStream::Create(device);
  if (!side.ok()) return side.status();
  c->side_ = std::move(*side);
  absl::StatusOr<CudaStream> ends = CudaStream::Create(device);
  if (!ends.ok()) return ends.status();
  c->ends_ = std::move(*ends);
  absl::StatusOr<CudaEvent> fork = CudaEvent::Create(device);
  if (!fork.ok()) return fork.status();
  c->fork_ = std::move(*fork);
  absl::StatusOr<CudaEvent> join = CudaEvent::Create(device);
  if (!join.ok()) return join.status();
  c->join_ = std::move(*join);
  absl::StatusOr<CudaEvent> main_end = CudaEvent::Create(device);
  if (!main_end.ok()) return main_end.status();
  c->main_end_ = std::move(*main_end);
  absl::StatusOr<std::unique_ptr<storage::Memory>> memory = storage::NewDeviceMemory(device);
  if (!memory.ok()) return memory.status();
  c->memory_ = std::move(*memory);
  c->pinned_ = storage::NewPinnedHostMemory();
  c->arena_ = std::make_unique<DeviceArena>(*c->memory_, *c->pinned_, PerSlotTable());
  if (absl::Status st = c->arena_->Grow(std::max<size_t>(options.initial_slots, 1), c->stream_.get()); !st.ok()) {
    return st;
  }
  c->MarkFork();  // the side lane's first work waits for the arena's reset
  absl::StatusOr<std::shared_ptr<uint8_t>> warm = c->memory_->Allocate(kWarmBytes);
  if (!warm.ok()) return warm.status();
  c->warm_ = std::move(*warm);
  return std::unique_ptr<Converter>(std::move(c));
}

GpuConverter::~GpuConverter() {
  (void)ends_.Synchronize();
  (void)side_.Synchronize();
  (void)stream_.Synchronize();
}

void GpuConverter::Warm() {
  cudaSetDevice(device_);
  // A memset is a kernel: the GPU runs work, not only a stream event. Failures show at the
  // next real launch.
  if (cudaMemsetAsync(warm_.get(), 0, kWarmBytes, stream_.get()) != cudaSuccess ||
      cudaMemsetAsync(warm_.get(), 0, kWarmBytes, side_.get()) != cudaSuccess) {
    (void)cudaGetLastError();
  }
}

absl::Status GpuConverter::Convert(const TensorPlan& plan, const TensorDesc& desc, const uint8_t* src,
                                   storage::MemoryKind src_kind, std::span<const formats::MutableBytes> outs,
                                   const formats::QuantizeOptions& options) {
  cudaSetDevice(device_);
  MarkBucketStart();
  if (plan.kind == ConvertKind::kCopy) return Copy(desc, src, src_kind, outs);
  // The slot first: when the arena is full, taking it drains both lanes.
  absl::StatusOr<DeviceArena::Slot> slot = TakeSlot();
  if (!slot.ok()) return slot.status();
  const uint8_t* input = src;
  if (src_kind == storage::MemoryKind::kHost) {
    // Pinned slot → device scratch; the scratch region of each tensor in a bucket is distinct,
    // so the copies and kernels of consecutive tensors overlap on the stream.
    absl::StatusOr<uint8_t*> scratch = Scratch(desc.nbytes);
    if (!scratch.ok()) return scratch.status();
    cudaError_t e = cudaMemcpyAsync(*scratch, src, desc.nbytes, cudaMemcpyHostToDevice, stream_.get());
    if (e != cudaSuccess) return CudaStatus(e, absl::StrCat("copying '", desc.name, "' to the GPU"));
    input = *scratch;
  }
  const bool reject = options.nonfinite == formats::NonfinitePolicy::kReject;
  const formats::ConstTensor in{desc.dtype, desc.shape, input};
  kernels::GlobalAmax amax;
  if (formats::NeedsGlobalAmax(plan.format)) {
    if (options_.batch) {
      absl::StatusOr<std::optional<kernels::Nvfp4BatchItem>> item =
          kernels::Nvfp4BatchItemFor(plan.format, in, options, outs, desc.name, slot->amax, slot->probe);
      if (!item.ok()) return item.status();
      if (item->has_value()) {
        Count(&GpuConverterStats::tensors);
        if (reject) pending_.push_back({desc.name, slot->index});
        return AddNvfp4(kernels::Nvfp4KindOf(plan.format, desc.dtype, options), **item, desc.name);
      }
    }
  }
  // A whole tensor on the device: on the less loaded lane (host inputs stay on the main lane
  // with their scratch copy).
  const cudaStream_t lane = src_kind == storage::MemoryKind::kHost ? stream_.get() : Lane(desc.nbytes);
  if (formats::NeedsGlobalAmax(plan.format)) {
    // The single-tensor two-pass path: the tensor's amax into its slot, then the encode.
    absl::Status st = kernels::AccumulateAmax(in, options, slot->amax, lane);
    if (!st.ok()) return st;
    amax.device = slot->amax;
  }
  absl::Status st =
      kernels::QuantizeRecording(plan.format, in, options, amax, outs, desc.name, reject ? slot->probe : nullptr, lane);
  if (!st.ok()) return st;
  Count(&GpuConverterStats::tensors);
  if (reject) pending_.push_back({desc.name, slot->index});
  return absl::OkStatus();
}

absl::StatusOr<bool> GpuConverter::ConvertAmaxGroup(formats::Format format, std::span<const GroupMember> members,
                                                    const formats::QuantizeOptions& options) {
  if (!options_.batch || members.empty() || !formats::NeedsGlobalAmax(format)) return false;
  cudaSetDevice(device_);
  MarkBucketStart();
  // Every member's slot at once (a drain between two would reset the first), the group's amax
  // in the first: +0 until the run's amax pass raises it over every member.
  if (arena_->capacity() - arena_->used() < members.size()) {
    Failures drained = Drain();
    failed_.insert(failed_.end(), std::make_move_iterator(drained.begin()), std::make_move_iterator(drained.end()));
    Count(&GpuConverterStats::drains);
    if (absl::Status st = arena_->Grow(arena_->used() + members.size(), stream_.get()); !st.ok()) return st;
    MarkFork();
  }
  std::vector<DeviceArena::Slot> slots;
  for (size_t i = 0; i < members.size(); ++i) {
    absl::StatusOr<DeviceArena::Slot> slot = arena_->Take();
    if (!slot.ok()) return slot.status();
    slots.push_back(*slot);
  }
  const DType dtype = members[0].desc->dtype;
  std::vector<kernels::Nvfp4BatchItem> items;
  for (size_t i = 0; i < members.size(); ++i) {
    const TensorDesc& d = *members[i].desc;
    if (d.dtype != dtype) return false;
    absl::StatusOr<std::optional<kernels::Nvfp4BatchItem>> item =
        kernels::Nvfp4BatchItemFor(format, formats::ConstTensor{d.dtype, d.shape, members[i].src}, options,
                                   members[i].outs, d.name, slots[0].amax, slots[i].probe);
    if (!item.ok() || !item->has_value()) return false;  // the caller's path reports it, per member
    items.push_back(**item);
  }
  // One run holds the whole group: the amax pass must have seen every member before any encode.
  const kernels::Nvfp4BatchKind kind = kernels::Nvfp4KindOf(format, dtype, options);
  uint64_t bytes = 0;
  for (const kernels::Nvfp4BatchItem& it : items) bytes += static_cast<uint64_t>(it.elements) * DTypeSize(dtype);
  if (!nvfp4_.items.empty() && (!(nvfp4_.kind == kind) || nvfp4_.bytes + bytes > options_.max_nvfp4_run_bytes ||
                                nvfp4_.items.size() + items.size() > options_.max_run_tensors)) {
    FlushNvfp4(failed_);
  }
  const bool reject = options.nonfinite == formats::NonfinitePolicy::kReject;
  nvfp4_.kind = kind;
  for (size_t i = 0; i < items.size(); ++i) {
    nvfp4_.items.push_back(items[i]);
    nvfp4_.names.push_back(members[i].desc->name);
    if (reject) pending_.push_back({members[i].desc->name, slots[i].index});
    Count(&GpuConverterStats::tensors);
  }
  nvfp4_.bytes += bytes;
  Count(&GpuConverterStats::grouped, items.size());
  if (nvfp4_.items.size() >= options_.max_run_tensors || nvfp4_.bytes >= options_.max_nvfp4_run_bytes) {
    FlushNvfp4(failed_);
  }
  return true;
}

absl::Status GpuConverter::Copy(const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                                std::span<const formats::MutableBytes> outs) {
  if (outs.size() != 1 || outs[0].bytes != desc.nbytes) {
    return absl::InternalError(absl::StrCat("tensor '", desc.name, "': copy output does not fit"));
  }
  if (src_kind == storage::MemoryKind::kDevice && options_.batch && desc.nbytes > 0 &&
      desc.nbytes <= options_.max_batched_copy_bytes) {
    absl::StatusOr<DeviceArena::Slot> slot = TakeSlot();  // holds the run's table room
    if (!slot.ok()) return slot.status();
    if (copies_.bytes + desc.nbytes > options_.max_copy_run_bytes) FlushCopies(failed_);
    copies_.items.push_back({outs[0].data, src, desc.nbytes});
    copies_.names.push_back(desc.name);
    copies_.bytes += desc.nbytes;
    Count(&GpuConverterStats::tensors);
    if (copies_.items.size() >= options_.max_run_tensors) FlushCopies(failed_);
    return absl::OkStatus();
  }
  const bool host = src_kind == storage::MemoryKind::kHost;
  cudaError_t e =
      cudaMemcpyAsync(outs[0].data, src, desc.nbytes, host ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice,
                      host ? stream_.get() : Lane(desc.nbytes));
  if (e != cudaSuccess) return CudaStatus(e, absl::StrCat("staging '", desc.name, "'"));
  Count(&GpuConverterStats::tensors);
  return absl::OkStatus();
}

absl::Status GpuConverter::AddNvfp4(const kernels::Nvfp4BatchKind& kind, const kernels::Nvfp4BatchItem& item,
                                    const std::string& name) {
  const uint64_t bytes = static_cast<uint64_t>(item.elements) * DTypeSize(kind.dtype);
  if (!nvfp4_.items.empty() && (!(nvfp4_.kind == kind) || nvfp4_.bytes + bytes > options_.max_nvfp4_run_bytes)) {
    FlushNvfp4(failed_);
  }
  nvfp4_.kind = kind;
  nvfp4_.items.push_back(item);
  nvfp4_.names.push_back(name);
  nvfp4_.bytes += bytes;
  if (nvfp4_.items.size() >= options_.max_run_tensors) FlushNvfp4(failed_);
  return absl::OkStatus();
}

void GpuConverter::FlushNvfp4(Failures& failed) {
  if (nvfp4_.items.empty()) return;
  absl::StatusOr<DeviceArena::Table> table = arena_->TakeTable(kernels::Nvfp4BatchTableBytes(nvfp4_.items.size()));
  absl::Status st = table.status();
  if (st.ok()) st = kernels::QuantizeNvfp4Batch(nvfp4_.kind, nvfp4_.items, table->host, table->device, stream_.get());
  if (!st.ok()) {
    for (const std::string& name : nvfp4_.names) failed.push_back({name, st});
  }
  Count(&GpuConverterStats::batched_nvfp4, nvfp4_.items.size());
  Count(&GpuConverterStats::runs);
  nvfp4_.items.clear();
  nvfp4_.names.clear();
  nvfp4_.bytes = 0;
}

void GpuConverter::FlushCopies(Failures& failed) {
  if (copies_.items.empty()) return;
  absl::StatusOr<DeviceArena::Table> table = arena_->TakeTable(kernels::CopyBatchTableBytes(copies_.items.size()));
  absl::Status st = table.status();
  if (st.ok()) st = kernels::CopyBatch(copies_.items, table->host, table->device, stream_.get());
  if (!st.ok()) {
    for (const std::string& name : copies_.names) failed.push_back({name, st});
  }
  Count(&GpuConverterStats::batched_copies, copies_.items.size());
  Count(&GpuConverterStats::runs);
  copies_.items.clear();
  copies_.names.clear();
  copies_.bytes = 0;
}

}  // namespace refit::gpu_internal

namespace refit {

absl::StatusOr<std::unique_ptr<Converter>> NewGpuConverter(int device, const GpuConverterOptions& options) {
  return gpu_internal::GpuConverter::Create(device, options);
}

}  // namespace refit
