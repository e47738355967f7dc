// GpuConverter's other DeviceOps, each on the main lane: amax passes, copies, layout steps and
// derived parameters; and Synchronize, which reads the pack_ue8m0 checks back.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/derive.h"
#include "kernels/layout.h"
#include "kernels/quantize.h"
#include "refit/gpu/gpu_converter_internal.h"

namespace refit::gpu_internal {

absl::Status GpuConverter::ResetAmax(float* amax) {
  cudaSetDevice(device_);
  const OnMainLane ordered(*this);
  return kernels::ResetAmax(amax, stream_.get());
}

absl::Status GpuConverter::AccumulateAmax(const TensorDesc& desc, const uint8_t* src, storage::MemoryKind src_kind,
                                          const formats::QuantizeOptions& options, float* amax) {
  cudaSetDevice(device_);
  const OnMainLane ordered(*this);
  absl::StatusOr<const uint8_t*> input = DeviceInput(desc, src, src_kind);
  if (!input.ok()) return input.status();
  return kernels::AccumulateAmax(formats::ConstTensor{desc.dtype, desc.shape, *input}, options, amax, stream_.get());
}

absl::Status GpuConverter::Copy(uint8_t* dst, const uint8_t* src, uint64_t bytes, storage::MemoryKind src_kind) {
  cudaSetDevice(device_);
  const OnMainLane ordered(*this);
  if (bytes == 0) return absl::OkStatus();
  cudaError_t e = cudaMemcpyAsync(
      dst, src, bytes, src_kind == storage::MemoryKind::kHost ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice,
      stream_.get());
  return e == cudaSuccess ? absl::OkStatus() : CudaStatus(e, "device copy");
}

absl::Status GpuConverter::CopyMany(std::span<const CopyRegion> regions) {
  cudaSetDevice(device_);
  const OnMainLane ordered(*this);
  std::vector<kernels::CopyRegion> list;
  list.reserve(regions.size());
  for (const CopyRegion& r : regions) list.push_back({r.dst, r.src, r.bytes});
  return kernels::CopyRegions(list.data(), list.size(), stream_.get());
}

absl::Status GpuConverter::Copy2D(uint8_t* dst, uint64_t dst_pitch, const uint8_t* src, uint64_t src_pitch,
                                  uint64_t width, uint64_t height) {
  cudaSetDevice(device_);
  const OnMainLane ordered(*this);
  if (width == 0 || height == 0) return absl::OkStatus();
  cudaError_t e =
      cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, cudaMemcpyDeviceToDevice, stream_.get());
  return e == cudaSuccess ? absl::OkStatus() : CudaStatus(e, "strided device copy");
}

absl::Status GpuConverter::Zero(uint8_t* dst, uint64_t bytes) {
  cudaSetDevice(device_);
  const OnMainLane ordered(*this);
  if (bytes == 0) return absl::OkStatus();
  cudaError_t e = cudaMemsetAsync(dst, 0, bytes, stream_.get());
  return e == cudaSuccess ? absl::OkStatus() : CudaStatus(e, "clearing device memory");
}

absl::Status GpuConverter::Swizzle128x4(const uint8_t* s, int64_t batch, int64_t rows, int64_t cols, uint8_t* out,
                                        uint64_t out_bytes) {
  cudaSetDevice(device_);
  const OnMainLane ordered(*this);
  return kernels::Swizzle128x4(s, batch, rows, cols, out, out_bytes, stream_.get());
}

absl::Status GpuConverter::PackUe8m0(const float* sf, int64_t groups, int64_t mn, int64_t kb, int32_t* out,
                                     uint64_t out_words, const std::string& name) {
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

absl::Status GpuConverter::AddOne(const uint8_t* w, DType dtype, int64_t n, uint8_t* out) {
  cudaSetDevice(device_);
  const OnMainLane ordered(*this);
  return kernels::GemmaPlusOne(w, dtype, n, out, stream_.get());
}

absl::Status GpuConverter::Synchronize() {
  cudaSetDevice(device_);
  JoinSide();
  absl::Status st = stream_.Synchronize();
  if (st.ok() && !pack_checks_.empty()) {
    constexpr size_t kWordsPerChunk = 4096;
    std::vector<unsigned long long> words(pack_checks_.size());
    for (size_t c = 0; c * kWordsPerChunk < words.size() && st.ok(); ++c) {
      const size_t n = std::min(kWordsPerChunk, words.size() - c * kWordsPerChunk);
      cudaError_t e =
          cudaMemcpy(words.data() + c * kWordsPerChunk, pack_chunks_[c].get(), n * 8, cudaMemcpyDeviceToHost);
      if (e != cudaSuccess) st = CudaStatus(e, "reading pack_ue8m0 checks");
    }
    for (size_t i = 0; i < words.size() && st.ok(); ++i) {
      if (words[i] != ~0ULL) {
        st = absl::InvalidArgumentError(
            absl::StrCat(pack_checks_[i], " pack_ue8m0: scale at flat index ", words[i], " is not a power of two"));
      }
    }
  }
  pack_checks_.clear();
  return st;
}

}  // namespace refit::gpu_internal
