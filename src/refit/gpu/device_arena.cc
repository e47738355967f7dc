#include "refit/gpu/device_arena.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"

namespace refit {
namespace {

constexpr uint64_t kAlign = 256;

uint64_t AlignUp(uint64_t x) { return (x + kAlign - 1) & ~(kAlign - 1); }

}  // namespace

absl::Status DeviceArena::Grow(size_t slots, cudaStream_t stream) {
  if (used_ != 0) return absl::InternalError("device arena grown while slots are taken");
  const size_t capacity = std::max({slots, capacity_ * 2, size_t{1}});
  const uint64_t words = AlignUp(capacity * sizeof(unsigned long long));
  const uint64_t amax = AlignUp(capacity * sizeof(float));
  // Each run's table starts on a kAlign boundary: one run per slot at most.
  const uint64_t tables = capacity * (per_slot_table_ + kAlign);
  absl::StatusOr<std::shared_ptr<uint8_t>> device = device_.Allocate(words + amax + tables);
  if (!device.ok()) return device.status();
  absl::StatusOr<std::shared_ptr<uint8_t>> host = pinned_.Allocate(words + tables);
  if (!host.ok()) return host.status();
  device_buf_ = std::move(*device);
  host_buf_ = std::move(*host);
  host_words_ = reinterpret_cast<unsigned long long*>(host_buf_.get());
  capacity_ = capacity;
  amax_offset_ = words;
  host_table_offset_ = words;
  table_offset_ = words + amax;
  table_bytes_ = tables;
  return ResetWords(capacity_, stream);
}

absl::Status DeviceArena::ResetWords(size_t slots, cudaStream_t stream) {
  if (slots == 0) return absl::OkStatus();
  // Probe words to ~0 (no bad index yet), amax floats to +0.
  uint8_t* base = device_buf_.get();
  cudaError_t e = cudaMemsetAsync(base, 0xFF, slots * sizeof(unsigned long long), stream);
  if (e == cudaSuccess) e = cudaMemsetAsync(base + amax_offset_, 0, slots * sizeof(float), stream);
  return e == cudaSuccess ? absl::OkStatus() : CudaStatus(e, "resetting the converter's probe words");
}

absl::StatusOr<DeviceArena::Slot> DeviceArena::Take() {
  if (used_ >= capacity_) return absl::InternalError("device arena full");
  uint8_t* base = device_buf_.get();
  const size_t i = used_++;
  return Slot{i, reinterpret_cast<unsigned long long*>(base) + i, reinterpret_cast<float*>(base + amax_offset_) + i};
}

absl::StatusOr<DeviceArena::Table> DeviceArena::TakeTable(uint64_t bytes) {
  const uint64_t offset = table_used_;
  if (bytes > table_bytes_ || offset > table_bytes_ - bytes) {
    return absl::InternalError(absl::StrCat("converter table space exhausted (", bytes, " bytes wanted, ",
                                            table_bytes_ - offset, " left)"));
  }
  table_used_ = AlignUp(offset + bytes);
  return Table{host_buf_.get() + host_table_offset_ + offset, device_buf_.get() + table_offset_ + offset};
}

absl::Status DeviceArena::CopyProbesAndReset(cudaStream_t stream) {
  if (used_ == 0) return absl::OkStatus();
  cudaError_t e = cudaMemcpyAsync(host_words_, device_buf_.get(), used_ * sizeof(unsigned long long),
                                  cudaMemcpyDeviceToHost, stream);
  if (e != cudaSuccess) return CudaStatus(e, "GPU conversion");
  return ResetWords(used_, stream);
}

absl::Status DeviceArena::Collect(cudaStream_t stream) {
  REFIT_RETURN_IF_ERROR(CopyProbesAndReset(stream));
  cudaError_t e = cudaStreamSynchronize(stream);
  return e == cudaSuccess ? absl::OkStatus() : CudaStatus(e, "GPU conversion");
}

void DeviceArena::Reset() {
  used_ = 0;
  table_used_ = 0;
}

}  // namespace refit
