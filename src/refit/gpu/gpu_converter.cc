#include "refit/gpu/gpu_converter.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/quantize.h"
#include "storage/memory.h"

namespace refit {
namespace {

absl::Status CudaError(cudaError_t e, absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

class GpuConverter final : public Converter {
 public:
  static absl::StatusOr<std::unique_ptr<Converter>> Create(int device) {
    auto c = std::unique_ptr<GpuConverter>(new GpuConverter(device));
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->stream_, cudaStreamNonBlocking);
    if (e != cudaSuccess) return CudaError(e, absl::StrCat("GPU converter on device ", device));
    absl::StatusOr<std::unique_ptr<storage::Memory>> memory = storage::NewDeviceMemory(device);
    if (!memory.ok()) return memory.status();
    c->memory_ = std::move(*memory);
    return std::unique_ptr<Converter>(std::move(c));
  }

  ~GpuConverter() override {
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }

  storage::MemoryKind staging_kind() const override { return storage::MemoryKind::kDevice; }

  absl::Status Convert(const TensorPlan& plan, const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                       std::span<const formats::MutableBytes> outs, const formats::QuantizeOptions& options) override {
    cudaSetDevice(device_);
    if (plan.kind == ConvertKind::kCopy) {
      cudaError_t e = cudaMemcpyAsync(outs[0].data, src, desc.nbytes,
                                      src_kind == storage::MemoryKind::kHost ? cudaMemcpyHostToDevice
                                                                             : cudaMemcpyDeviceToDevice,
                                      stream_);
      return e == cudaSuccess ? absl::OkStatus() : CudaError(e, absl::StrCat("staging '", desc.name, "'"));
    }
    const uint8_t* input = src;
    if (src_kind == storage::MemoryKind::kHost) {
      // Pinned slot → device scratch; the scratch region of each tensor in a bucket is distinct,
      // so the copies and kernels of consecutive tensors overlap on the stream.
      absl::StatusOr<uint8_t*> scratch = Scratch(desc.nbytes);
      if (!scratch.ok()) return scratch.status();
      cudaError_t e = cudaMemcpyAsync(*scratch, src, desc.nbytes, cudaMemcpyHostToDevice, stream_);
      if (e != cudaSuccess) return CudaError(e, absl::StrCat("copying '", desc.name, "' to the GPU"));
      input = *scratch;
    }
    const kernels::NonfiniteProbe* probe = nullptr;
    if (options.nonfinite == formats::NonfinitePolicy::kReject) {
      absl::StatusOr<kernels::NonfiniteProbe*> p = NextProbe();
      if (!p.ok()) return p.status();
      probe = *p;
      pending_.push_back({desc.name, *p});
    }
    const formats::ConstTensor in{desc.dtype, desc.shape, input};
    kernels::GlobalAmax amax;
    if (formats::NeedsGlobalAmax(plan.format)) {
      // Two passes on the device: the tensor's amax, then the encode; no host round trip.
      absl::StatusOr<float*> slot = NextAmax();
      if (!slot.ok()) return slot.status();
      absl::Status st = kernels::ResetAmax(*slot, stream_);
      if (st.ok()) st = kernels::AccumulateAmax(in, options, *slot, stream_);
      if (!st.ok()) return st;
      amax.device = *slot;
    }
    return kernels::Quantize(plan.format, in, options, amax, outs, desc.name, probe, stream_);
  }

  std::vector<std::pair<std::string, absl::Status>> Sync() override {
    std::vector<std::pair<std::string, absl::Status>> failed;
    cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) failed.push_back({"(bucket)", CudaError(e, "GPU conversion")});
    for (const Pending& p : pending_) {
      absl::Status st = p.probe->Check(p.name, stream_);
      if (!st.ok()) failed.push_back({p.name, st});
    }
    pending_.clear();
    retired_.clear();
    probes_used_ = 0;
    scratch_used_ = 0;
    amax_used_ = 0;
    return failed;
  }

 private:
  explicit GpuConverter(int device) : device_(device) {}

  struct Pending {
    std::string name;
    kernels::NonfiniteProbe* probe;
  };

  // Device scratch for host inputs, bump-allocated per bucket (reset at Sync). Grows by
  // reallocating only between buckets, never while a kernel may read it.
  absl::StatusOr<uint8_t*> Scratch(uint64_t bytes) {
    uint64_t offset = (scratch_used_ + 255) & ~uint64_t{255};
    if (offset + bytes > scratch_bytes_) {
      if (offset > 0) {
        cudaError_t e = cudaStreamSynchronize(stream_);  // earlier tensors still read the old buffer
        if (e != cudaSuccess) return CudaError(e, "GPU conversion");
      }
      uint64_t want = std::max<uint64_t>(offset + bytes, scratch_bytes_ * 2);
      std::shared_ptr<uint8_t> fresh;
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

  absl::StatusOr<float*> NextAmax() {
    if (amax_used_ % kAmaxBlock == 0 && amax_used_ / kAmaxBlock == amax_blocks_.size()) {
      absl::StatusOr<std::shared_ptr<uint8_t>> a = memory_->Allocate(kAmaxBlock * sizeof(float));
      if (!a.ok()) return a.status();
      amax_blocks_.push_back(std::move(*a));
    }
    float* base = reinterpret_cast<float*>(amax_blocks_[amax_used_ / kAmaxBlock].get());
    return base + (amax_used_++ % kAmaxBlock);
  }

  absl::StatusOr<kernels::NonfiniteProbe*> NextProbe() {
    if (probes_used_ == probes_.size()) {
      absl::StatusOr<kernels::NonfiniteProbe> p = kernels::NonfiniteProbe::Create();
      if (!p.ok()) return p.status();
      probes_.push_back(std::make_unique<kernels::NonfiniteProbe>(std::move(*p)));
    }
    kernels::NonfiniteProbe* p = probes_[probes_used_++].get();
    absl::Status st = p->Reset(stream_);
    if (!st.ok()) return st;
    return p;
  }

  const int device_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<storage::Memory> memory_;
  std::shared_ptr<uint8_t> scratch_;
  std::vector<std::shared_ptr<uint8_t>> retired_;
  uint64_t scratch_bytes_ = 0;
  uint64_t scratch_used_ = 0;
  std::vector<std::unique_ptr<kernels::NonfiniteProbe>> probes_;
  size_t probes_used_ = 0;
  std::vector<Pending> pending_;
  static constexpr size_t kAmaxBlock = 1024;
  std::vector<std::shared_ptr<uint8_t>> amax_blocks_;  // device floats, one per NVFP4 tensor of a bucket
  size_t amax_used_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Converter>> NewGpuConverter(int device) { return GpuConverter::Create(device); }

}  // namespace refit
