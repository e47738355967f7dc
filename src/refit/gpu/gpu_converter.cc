#include "refit/gpu/gpu_converter.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_handles.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "common/trace.h"
#include "kernels/batch_copy.h"
#include "kernels/batch_quantize.h"
#include "kernels/derive.h"
#include "kernels/layout.h"
#include "kernels/quantize.h"
#include "refit/gpu/device_arena.h"
#include "refit/resolve.h"
#include "storage/memory.h"

namespace refit {
namespace {


using Failures = std::vector<std::pair<std::string, absl::Status>>;

class GpuConverter final : public Converter, public DeviceOps {
 public:
  static absl::StatusOr<std::unique_ptr<Converter>> Create(int device, const GpuConverterOptions& options) {
    auto c = std::unique_ptr<GpuConverter>(new GpuConverter(device, options));
    absl::StatusOr<CudaStream> stream = CudaStream::Create(device);
    if (!stream.ok()) {
      return absl::Status(stream.status().code(), absl::StrCat("GPU converter on device ", device, ": ", stream.status().message()));
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

  // The streams are drained before the arena's buffers go; they are destroyed last.
  ~GpuConverter() override {
    (void)ends_.Synchronize();
    (void)side_.Synchronize();
    (void)stream_.Synchronize();
  }

  storage::MemoryKind staging_kind() const override { return storage::MemoryKind::kDevice; }

  void Warm() override {
    cudaSetDevice(device_);
    // A memset is a kernel: the GPU runs work, not only a stream event. Failures show at the
    // next real launch.
    if (cudaMemsetAsync(warm_.get(), 0, kWarmBytes, stream_.get()) != cudaSuccess ||
        cudaMemsetAsync(warm_.get(), 0, kWarmBytes, side_.get()) != cudaSuccess) {
      (void)cudaGetLastError();
    }
  }

  absl::Status Convert(const TensorPlan& plan, const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                       std::span<const formats::MutableBytes> outs, const formats::QuantizeOptions& options) override {
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
    absl::Status st = kernels::QuantizeRecording(plan.format, in, options, amax, outs, desc.name,
                                                 reject ? slot->probe : nullptr, lane);
    if (!st.ok()) return st;
    Count(&GpuConverterStats::tensors);
    if (reject) pending_.push_back({desc.name, slot->index});
    return absl::OkStatus();
  }


  DeviceOps* device_ops() override { return options_.device_ops ? this : nullptr; }

  absl::Status ConvertPlanned(const TensorPlan& plan, const TensorDesc& desc, const uint8_t* src,
                              storage::MemoryKind src_kind, std::span<const formats::MutableBytes> outs,
                              const formats::QuantizeOptions& options, const PlannedAmax& planned) override {
    cudaSetDevice(device_);
    MarkBucketStart();
    if (outs.size() != plan.targets.size()) {
      return absl::InternalError(absl::StrCat("tensor '", desc.name, "': ", outs.size(), " outputs for ",
                                              plan.targets.size(), " targets"));
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

  absl::Status ResetAmax(float* amax) override {
    cudaSetDevice(device_);
    const OnMainLane ordered(*this);
    return kernels::ResetAmax(amax, stream_.get());
  }

  absl::Status AccumulateAmax(const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                              const formats::QuantizeOptions& options, float* amax) override {
    cudaSetDevice(device_);
    const OnMainLane ordered(*this);
    absl::StatusOr<const uint8_t*> input = DeviceInput(desc, src, src_kind);
    if (!input.ok()) return input.status();
    return kernels::AccumulateAmax(formats::ConstTensor{desc.dtype, desc.shape, *input}, options, amax, stream_.get());
  }

  absl::Status Copy(uint8_t* dst, const uint8_t* src, uint64_t bytes, storage::MemoryKind src_kind) override {
    cudaSetDevice(device_);
    const OnMainLane ordered(*this);
    if (bytes == 0) return absl::OkStatus();
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes,
                                    src_kind == storage::MemoryKind::kHost ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice,
                                    stream_.get());
    return e == cudaSuccess ? absl::OkStatus() : CudaStatus(e, "device copy");
  }

  absl::Status CopyMany(std::span<const CopyRegion> regions) override {
    cudaSetDevice(device_);
    const OnMainLane ordered(*this);
    std::vector<kernels::CopyRegion> list;
    list.reserve(regions.size());
    for (const CopyRegion& r : regions) list.push_back({r.dst, r.src, r.bytes});
    return kernels::CopyRegions(list.data(), list.size(), stream_.get());
  }

  absl::StatusOr<bool> ConvertAmaxGroup(formats::Format format, std::span<const GroupMember> members,
                                        const formats::QuantizeOptions& options) override {
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

  absl::Status Copy2D(uint8_t* dst, uint64_t dst_pitch, const uint8_t* src, uint64_t src_pitch, uint64_t width,
                      uint64_t height) override {
    cudaSetDevice(device_);
    const OnMainLane ordered(*this);
    if (width == 0 || height == 0) return absl::OkStatus();
    cudaError_t e = cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, cudaMemcpyDeviceToDevice, stream_.get());
    return e == cudaSuccess ? absl::OkStatus() : CudaStatus(e, "strided device copy");
  }

  absl::Status Zero(uint8_t* dst, uint64_t bytes) override {
    cudaSetDevice(device_);
    const OnMainLane ordered(*this);
    if (bytes == 0) return absl::OkStatus();
    cudaError_t e = cudaMemsetAsync(dst, 0, bytes, stream_.get());
    return e == cudaSuccess ? absl::OkStatus() : CudaStatus(e, "clearing device memory");
  }

  absl::Status Swizzle128x4(const uint8_t* s, int64_t batch, int64_t rows, int64_t cols, uint8_t* out,
                            uint64_t out_bytes) override {
    cudaSetDevice(device_);
    const OnMainLane ordered(*this);
    return kernels::Swizzle128x4(s, batch, rows, cols, out, out_bytes, stream_.get());
  }

  absl::Status PackUe8m0(const float* sf, int64_t groups, int64_t mn, int64_t kb, int32_t* out, uint64_t out_words,
                         const std::string& name) override {
    cudaSetDevice(device_);
    const OnMainLane ordered(*this);
    constexpr size_t kWordsPerChunk = 4096;
    if (pack_checks_.size() == pack_chunks_.size() * kWordsPerChunk) {
      absl::StatusOr<std::shared_ptr<uint8_t>> chunk = memory_->Allocate(kWordsPerChunk * 8);
      if (!chunk.ok()) return chunk.status();
      pack_chunks_.push_back(std::move(*chunk));
    }
    const size_t k = pack_checks_.size();
    auto* word = reinterpret_cast<unsigned long long*>(pack_chunks_[k / kWordsPerChunk].get()) + k % kWordsPerChunk;
    cudaError_t e = cudaMemsetAsync(word, 0xFF, 8, stream_.get());
    if (e != cudaSuccess) return CudaStatus(e, "pack_ue8m0");
    absl::Status st = kernels::PackUe8m0Scales(sf, groups, mn, kb, 128, out, out_words, word, stream_.get());
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat(name, ": ", st.message()));
    pack_checks_.push_back(name);
    return absl::OkStatus();
  }

  absl::Status AddOne(const uint8_t* w, DType dtype, int64_t n, uint8_t* out) override {
    cudaSetDevice(device_);
    const OnMainLane ordered(*this);
    return kernels::GemmaPlusOne(w, dtype, n, out, stream_.get());
  }

  absl::Status Synchronize() override {
    cudaSetDevice(device_);
    JoinSide();
    absl::Status st = stream_.Synchronize();
    if (st.ok() && !pack_checks_.empty()) {
      constexpr size_t kWordsPerChunk = 4096;
      std::vector<unsigned long long> words(pack_checks_.size());
      for (size_t c = 0; c * kWordsPerChunk < words.size() && st.ok(); ++c) {
        const size_t n = std::min(kWordsPerChunk, words.size() - c * kWordsPerChunk);
        cudaError_t e = cudaMemcpy(words.data() + c * kWordsPerChunk, pack_chunks_[c].get(), n * 8, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) st = CudaStatus(e, "reading pack_ue8m0 checks");
      }
      for (size_t i = 0; i < words.size() && st.ok(); ++i) {
        if (words[i] != ~0ULL) {
          st = absl::InvalidArgumentError(absl::StrCat(pack_checks_[i], " pack_ue8m0: scale at flat index ", words[i],
                                                       " is not a power of two"));
        }
      }
    }
    pack_checks_.clear();
    return st;
  }

  Failures Sync() override {
    cudaSetDevice(device_);
    Failures failed = WaitBucket(UINT64_MAX);
    Failures current = Drain();
    failed.insert(failed.end(), std::make_move_iterator(current.begin()), std::make_move_iterator(current.end()));
    retired_.clear();
    scratch_used_ = scratch_bucket_ = 0;  // both lanes are idle
    return failed;
  }

  // The bucket's runs are launched; a third stream (ends_) waits for the bucket's work on both
  // lanes, copies its probe words back, resets them and marks the bucket's end with an event. The
  // lanes themselves go on with the next bucket at once (on another arena, already reset), so
  // that neither lane idles at a bucket's end while the other drains its last kernel.
  uint64_t EndBucket() override {
    cudaSetDevice(device_);
    FlushNvfp4(failed_);
    FlushCopies(failed_);
    Submitted b;
    b.ticket = ++tickets_;
    absl::StatusOr<CudaEvent> done = TakeEvent();
    absl::StatusOr<std::unique_ptr<DeviceArena>> next = done.ok() ? TakeArena() : done.status();
    absl::Status st = next.status();
    if (st.ok()) st = EndOnThirdStream(done->get());
    if (!st.ok()) {
      // Completed here instead (the next bucket then waits for it), after whatever reached ends_.
      (void)cudaGetLastError();
      (void)ends_.Synchronize();
      if (next.ok()) spare_arenas_.push_back(std::move(*next));
      b.failed = Drain();
      if (done.ok()) spare_events_.push_back(std::move(*done));
    } else {
      b.done = std::move(*done);
      b.arena = std::move(arena_);
      arena_ = std::move(*next);
      b.pending = std::move(pending_);
      pending_.clear();
      b.failed = std::move(failed_);
      failed_.clear();
      lane_bytes_[0] = lane_bytes_[1] = 0;
    }
    b.retired = std::move(retired_);
    retired_.clear();
    b.start = std::move(bucket_start_);
    bucket_started_ = false;
    scratch_bucket_ = scratch_used_;
    submitted_.push_back(std::move(b));
    return submitted_.back().ticket;
  }

  Failures WaitBucket(uint64_t ticket) override {
    cudaSetDevice(device_);
    Failures failed;
    while (!submitted_.empty() && submitted_.front().ticket <= ticket) {
      Submitted b = std::move(submitted_.front());
      submitted_.pop_front();
      failed.insert(failed.end(), std::make_move_iterator(b.failed.begin()), std::make_move_iterator(b.failed.end()));
      if (!b.done) continue;  // completed at EndBucket
      cudaError_t e = cudaEventSynchronize(b.done.get());
      if (e != cudaSuccess) {
        failed.push_back({"(bucket)", CudaStatus(e, "GPU conversion")});
      } else {
        for (const Pending& p : b.pending) {
          absl::Status recorded = kernels::RecordedStatus(b.arena->probe(p.slot), p.name, p.claim);
          if (!recorded.ok()) failed.push_back({p.name, std::move(recorded)});
        }
      }
      if (e == cudaSuccess) TraceGpuTimes(b);
      b.arena->Reset();
      spare_arenas_.push_back(std::move(b.arena));
      if (b.done) spare_events_.push_back(std::move(b.done));
      if (b.start) spare_starts_.push_back(std::move(b.start));
    }
    // Nothing in flight reads the scratch any more: the next bucket starts it again.
    if (submitted_.empty() && scratch_used_ == scratch_bucket_) scratch_used_ = scratch_bucket_ = 0;
    return failed;
  }

  bool BucketDone(uint64_t ticket) override {
    for (const Submitted& b : submitted_) {
      if (b.ticket > ticket) break;
      if (b.done && cudaEventQuery(b.done.get()) == cudaErrorNotReady) return false;
    }
    (void)cudaGetLastError();  // an error shows at WaitBucket
    return true;
  }

 private:
  struct Pending {
    std::string name;
    size_t slot;
    std::optional<float> claim = std::nullopt;  // a supplied amax the encode checked
  };
  // Tensors gathered for one batched launch, with their names for errors.
  struct Nvfp4Run {
    kernels::Nvfp4BatchKind kind{};
    std::vector<kernels::Nvfp4BatchItem> items;
    std::vector<std::string> names;
    uint64_t bytes = 0;
  };
  struct CopyRun {
    std::vector<kernels::CopyBatchItem> items;
    std::vector<std::string> names;
    uint64_t bytes = 0;
  };
  // A bucket ended (EndBucket) and not yet waited for.
  struct Submitted {
    uint64_t ticket = 0;
    CudaEvent done;                       // after its work on both lanes and its probe copy; empty: completed
    std::unique_ptr<DeviceArena> arena;   // its slots, probe words copied back
    std::vector<Pending> pending;
    Failures failed;                      // found before it ended (failed launches)
    std::vector<std::shared_ptr<uint8_t>> retired;  // scratch buffers its work may still read
    CudaEvent start;                      // traced runs: recorded before its first work (MarkBucketStart)
  };

  // Traced runs (REFIT_TRACE_FILE) only: a timing event on the main lane before a bucket's first
  // work, so that WaitBucket can trace how long the GPU worked on the bucket and how long the
  // main lane waited for it after the bucket before ended ("daemon.gpu_bucket_us",
  // "daemon.gpu_wait_us"): the host's issue against the kernels' own time.
  void MarkBucketStart() {
    if (!timing_ || bucket_started_) return;
    bucket_started_ = true;
    TracePoint("daemon.bucket_first_launch");
    if (!bucket_start_) {
      if (!spare_starts_.empty()) {
        bucket_start_ = std::move(spare_starts_.back());
        spare_starts_.pop_back();
      } else if (absl::StatusOr<CudaEvent> e = CudaEvent::Create(device_, /*timing=*/true); e.ok()) {
        bucket_start_ = std::move(*e);
      }
    }
    if (bucket_start_ && cudaEventRecord(bucket_start_.get(), stream_.get()) != cudaSuccess) {
      (void)cudaGetLastError();
      spare_starts_.push_back(std::move(bucket_start_));
    }
  }
  void TraceGpuTimes(Submitted& b) {
    if (!timing_ || !b.start) return;
    float busy = 0, wait = 0;
    if (cudaEventElapsedTime(&busy, b.start.get(), b.done.get()) == cudaSuccess) {
      TracePoint("daemon.gpu_bucket_us", static_cast<uint64_t>(std::max(0.0f, busy) * 1000));
    }
    if (last_done_ && cudaEventElapsedTime(&wait, last_done_.get(), b.start.get()) == cudaSuccess) {
      TracePoint("daemon.gpu_wait_us", static_cast<uint64_t>(std::max(0.0f, wait) * 1000));
    }
    (void)cudaGetLastError();
    // The bucket's end, kept to measure the next bucket's wait from (its event is not reused meanwhile).
    std::swap(last_done_, b.done);
  }

  // A spare arena (reset behind its last bucket's probe copy), or a new one, reset on the main
  // lane (the side lane waits for that: only until the converter has one arena per bucket in flight).
  absl::StatusOr<std::unique_ptr<DeviceArena>> TakeArena() {
    if (!spare_arenas_.empty()) {
      std::unique_ptr<DeviceArena> a = std::move(spare_arenas_.back());
      spare_arenas_.pop_back();
      return a;
    }
    auto a = std::make_unique<DeviceArena>(*memory_, *pinned_, PerSlotTable());
    if (absl::Status st = a->Grow(arena_->capacity(), stream_.get()); !st.ok()) return st;
    MarkFork();
    return a;
  }

  // EndBucket's work on ends_: after the bucket's work on both lanes, the probe words' copy and
  // reset, then `done`. The lanes are not joined: the main lane still waits for the side lane's
  // work before its next device op (side_pending_ stays as it is).
  absl::Status EndOnThirdStream(cudaEvent_t done) {
    REFIT_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(main_end_.get(), stream_.get()), "marking the end of a bucket"));
    REFIT_RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(ends_.get(), main_end_.get(), 0), "marking the end of a bucket"));
    REFIT_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(join_.get(), side_.get()), "marking the end of a bucket"));
    REFIT_RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(ends_.get(), join_.get(), 0), "marking the end of a bucket"));
    REFIT_RETURN_IF_ERROR(arena_->CopyProbesAndReset(ends_.get()));
    return CudaStatus(cudaEventRecord(done, ends_.get()), "marking the end of a bucket");
  }
  absl::StatusOr<CudaEvent> TakeEvent() {
    if (spare_events_.empty()) return CudaEvent::Create(device_, timing_);
    CudaEvent e = std::move(spare_events_.back());
    spare_events_.pop_back();
    return e;
  }
  static uint64_t PerSlotTable() { return std::max(kernels::Nvfp4BatchTableBytes(1), kernels::CopyBatchTableBytes(1)); }

  GpuConverter(int device, const GpuConverterOptions& options) : device_(device), options_(options) {}

  // Two lanes (streams): whole tensors on the device go to the less loaded one, so that one
  // tensor's kernel runs while another's drains its last tiles. Everything else (the arena, batched
  // runs, host inputs, every DeviceOps call) is on the main lane, ordered against the side lane:
  // a device op waits for the side lane's work so far (it may read a tensor converted there),
  // and side-lane work enqueued after it waits for it (it may read what the op wrote).
  cudaStream_t Lane(uint64_t bytes) {
    const int k = lane_bytes_[1] < lane_bytes_[0] ? 1 : 0;
    if (k == 0) {
      lane_bytes_[0] += bytes;
      return stream_.get();
    }
    if (fork_pending_) {
      if (cudaStreamWaitEvent(side_.get(), fork_.get(), 0) != cudaSuccess) {
        (void)cudaGetLastError();
        lane_bytes_[0] += bytes;
        return stream_.get();
      }
      fork_pending_ = false;
    }
    lane_bytes_[1] += bytes;
    side_pending_ = true;
    Count(&GpuConverterStats::side_lane);
    return side_.get();
  }
  // Side-lane work enqueued from now on waits for the main lane's work so far.
  void MarkFork() {
    if (cudaEventRecord(fork_.get(), stream_.get()) != cudaSuccess) {
      (void)cudaGetLastError();
      lane_bytes_[1] = UINT64_MAX;  // the side lane stays unused until the next bucket
      return;
    }
    fork_pending_ = true;
  }
  // The main lane's work from now on waits for the side lane's work so far.
  void JoinSide() {
    if (!side_pending_) return;
    if (cudaEventRecord(join_.get(), side_.get()) != cudaSuccess ||
        cudaStreamWaitEvent(stream_.get(), join_.get(), 0) != cudaSuccess) {
      (void)cudaGetLastError();
      (void)side_.Synchronize();  // ordered the slow way
    }
    side_pending_ = false;
  }
  // Scope of one DeviceOps call on the main lane.
  struct OnMainLane {
    explicit OnMainLane(GpuConverter& c) : c(c) { c.JoinSide(); }
    ~OnMainLane() { c.MarkFork(); }
    GpuConverter& c;
  };

  void Count(uint64_t GpuConverterStats::*field, uint64_t n = 1) {
    if (options_.stats != nullptr) options_.stats->*field += n;
  }

  // `src` on the device: as it is, or (host memory) copied into this bucket's scratch.
  absl::StatusOr<const uint8_t*> DeviceInput(const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind) {
    if (src_kind != storage::MemoryKind::kHost) return src;
    absl::StatusOr<uint8_t*> scratch = Scratch(desc.nbytes);
    if (!scratch.ok()) return scratch.status();
    cudaError_t e = cudaMemcpyAsync(*scratch, src, desc.nbytes, cudaMemcpyHostToDevice, stream_.get());
    if (e != cudaSuccess) return CudaStatus(e, absl::StrCat("copying '", desc.name, "' to the GPU"));
    return static_cast<const uint8_t*>(*scratch);
  }

  absl::Status Copy(const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
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
    cudaError_t e = cudaMemcpyAsync(outs[0].data, src, desc.nbytes, host ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice,
                                    host ? stream_.get() : Lane(desc.nbytes));
    if (e != cudaSuccess) return CudaStatus(e, absl::StrCat("staging '", desc.name, "'"));
    Count(&GpuConverterStats::tensors);
    return absl::OkStatus();
  }

  absl::Status AddNvfp4(const kernels::Nvfp4BatchKind& kind, const kernels::Nvfp4BatchItem& item,
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

  // Launches the open runs; a run whose launch fails fails each of its tensors.
  void FlushNvfp4(Failures& failed) {
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

  void FlushCopies(Failures& failed) {
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

  // A slot for the next tensor; when the arena is full, drains the stream first and grows it.
  absl::StatusOr<DeviceArena::Slot> TakeSlot() {
    if (arena_->full()) {
      Failures drained = Drain();
      failed_.insert(failed_.end(), std::make_move_iterator(drained.begin()), std::make_move_iterator(drained.end()));
      Count(&GpuConverterStats::drains);
      if (absl::Status st = arena_->Grow(arena_->used() + 1, stream_.get()); !st.ok()) return st;
      MarkFork();  // the side lane's next work waits for the new arena's reset
    }
    return arena_->Take();
  }

  // Launches the open runs, waits for the stream, reads every probe word back with one copy
  // (resetting them), and frees the slots. Returns every failure recorded since the last Drain.
  Failures Drain() {
    FlushNvfp4(failed_);
    FlushCopies(failed_);
    Failures failed = std::move(failed_);
    failed_.clear();
    JoinSide();
    absl::Status st = arena_->Collect(stream_.get());
    lane_bytes_[0] = lane_bytes_[1] = 0;
    fork_pending_ = false;  // both lanes are idle
    if (!st.ok()) failed.push_back({"(bucket)", st});
    for (const Pending& p : pending_) {
      absl::Status recorded = kernels::RecordedStatus(arena_->probe(p.slot), p.name, p.claim);
      if (st.ok() && !recorded.ok()) failed.push_back({p.name, std::move(recorded)});
    }
    pending_.clear();
    arena_->Reset();
    return failed;
  }

  // Device scratch for host inputs and transposes, bump-allocated: buckets in flight use
  // successive regions; it starts again at 0 once nothing in flight reads it (WaitBucket, Sync)
  // or after a synchronization when it is full. Grows (only after that synchronization) when one
  // bucket's own regions do not fit.
  absl::StatusOr<uint8_t*> Scratch(uint64_t bytes) {
    uint64_t offset = (scratch_used_ + 255) & ~uint64_t{255};
    if (offset + bytes > scratch_bytes_) {
      if (offset > 0) {
        JoinSide();
        cudaError_t e = cudaStreamSynchronize(stream_.get());  // earlier tensors still read the buffer
        if (e != cudaSuccess) return CudaStatus(e, "GPU conversion");
        if (offset - std::min(offset, scratch_bucket_) + bytes <= scratch_bytes_) {
          // Earlier buckets' regions are free now: this bucket continues from the start.
          scratch_used_ = bytes;
          scratch_bucket_ = 0;
          return scratch_.get();
        }
      }
      uint64_t want = std::max<uint64_t>(offset + bytes, scratch_bytes_ * 2);
      absl::StatusOr<std::shared_ptr<uint8_t>> a = memory_->Allocate(want);
      if (!a.ok()) return a.status();
      retired_.push_back(std::move(scratch_));  // freed after the bucket's Sync
      scratch_ = std::move(*a);
      scratch_bytes_ = want;
      offset = 0;
    }
    scratch_used_ = offset + bytes;
    return scratch_.get() + offset;
  }

  static constexpr uint64_t kWarmBytes = 256;
  const int device_;
  const GpuConverterOptions options_;
  std::shared_ptr<uint8_t> warm_;  // Warm's target
  CudaStream stream_;  // the main lane
  CudaStream side_;    // the side lane
  CudaStream ends_;    // each bucket's end: probe copy and reset after both lanes (EndBucket)
  CudaEvent fork_, join_, main_end_;
  uint64_t lane_bytes_[2] = {0, 0};  // input bytes given to each lane since the last drain
  bool fork_pending_ = false;        // fork_ holds main-lane work the side lane has not waited for
  bool side_pending_ = false;        // the side lane has work the main lane has not waited for
  std::unique_ptr<storage::Memory> memory_;
  std::unique_ptr<storage::Memory> pinned_;
  std::unique_ptr<DeviceArena> arena_;
  std::shared_ptr<uint8_t> scratch_;
  std::vector<std::shared_ptr<uint8_t>> retired_;
  uint64_t scratch_bytes_ = 0;
  uint64_t scratch_used_ = 0;
  uint64_t scratch_bucket_ = 0;  // where the open bucket's scratch regions begin
  std::vector<Pending> pending_;  // tensors whose probe word is read at the next Drain
  Nvfp4Run nvfp4_;
  CopyRun copies_;
  std::vector<std::shared_ptr<uint8_t>> pack_chunks_;  // pack_ue8m0 check words, 4096 per chunk
  std::vector<std::string> pack_checks_;                // the parameter of each word in use
  Failures failed_;  // failures found before the next Sync (failed launches, mid-bucket drains)
  uint64_t tickets_ = 0;
  std::deque<Submitted> submitted_;  // ended buckets not yet waited for, oldest first
  std::vector<std::unique_ptr<DeviceArena>> spare_arenas_;
  std::vector<CudaEvent> spare_events_;
  const bool timing_ = TraceOn();
  bool bucket_started_ = false;
  CudaEvent bucket_start_;
  CudaEvent last_done_;
  std::vector<CudaEvent> spare_starts_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Converter>> NewGpuConverter(int device, const GpuConverterOptions& options) {
  return GpuConverter::Create(device, options);
}

}  // namespace refit
