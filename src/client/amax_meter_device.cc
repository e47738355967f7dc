// AmaxMeter's device half with CUDA (amax_meter.h): device tensors measured by the GPU kernel on
// the meter's stream. amax_meter_no_cuda.cc is the build without CUDA.
#include <cuda_runtime.h>

#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/amax_meter.h"
#include "common/cuda_handles.h"
#include "common/cuda_status.h"
#include "formats/format.h"
#include "kernels/quantize.h"
#include "storage/memory.h"

namespace refit::client {

// Device floats, one per device tensor of the bucket, on the device of the first one.
struct AmaxMeter::Device {
  int device = -1;
  CudaStream stream;
  float* floats = nullptr;
  size_t capacity = 0;
  std::vector<size_t> pending;  // index in the bucket's tensors of each float in use

  ~Device() {
    if (floats != nullptr) {
      (void)cudaStreamSynchronize(stream.get());
      (void)cudaFree(floats);
    }
  }
  absl::Status Reserve(size_t n) {
    if (n <= capacity) return absl::OkStatus();
    size_t want = capacity == 0 ? 256 : capacity;
    while (want < n) want *= 2;
    float* grown = nullptr;
    if (cudaError_t e = cudaMalloc(&grown, want * sizeof(float)); e != cudaSuccess) {
      return CudaStatus(e, "allocating amax floats");
    }
    if (floats != nullptr) {
      // Floats in use move along (stream-ordered, before any later kernel writes them).
      cudaMemcpyAsync(grown, floats, pending.size() * sizeof(float), cudaMemcpyDeviceToDevice, stream.get());
      (void)cudaStreamSynchronize(stream.get());
      (void)cudaFree(floats);
    }
    floats = grown;
    capacity = want;
    return absl::OkStatus();
  }
};
AmaxMeter::AmaxMeter() = default;
AmaxMeter::~AmaxMeter() = default;

absl::Status AmaxMeter::MeasureOnDevice(TensorDesc& desc, const void* data, size_t index) {
  const formats::ConstTensor in{desc.dtype, desc.shape, data};
  const formats::QuantizeOptions options = MeasureOptions();
  absl::StatusOr<int> current = storage::CurrentDevice();
  if (!current.ok()) return current.status();
  if (device_ == nullptr) {
    absl::StatusOr<CudaStream> stream = CudaStream::Create(*current);
    if (!stream.ok()) return stream.status();
    device_ = std::make_unique<Device>();
    device_->device = *current;
    device_->stream = std::move(*stream);
  }
  if (device_->device != *current) return absl::OkStatus();  // another device: refitd measures it
  const size_t used = device_->pending.size();
  if (absl::Status st = device_->Reserve(used + 1); !st.ok()) return st;
  float* slot = device_->floats + used;
  if (absl::Status st = kernels::ResetAmax(slot, device_->stream.get()); !st.ok()) return st;
  if (absl::Status st = kernels::AccumulateAmax(in, options, slot, device_->stream.get()); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("tensor '", desc.name, "': measuring its amax: ", st.message()));
  }
  device_->pending.push_back(index);
  return absl::OkStatus();
}

absl::Status AmaxMeter::Collect(std::vector<TensorDesc>& tensors) {
  if (device_ == nullptr || device_->pending.empty()) return absl::OkStatus();
  std::vector<float> values(device_->pending.size());
  cudaError_t e = cudaMemcpyAsync(values.data(), device_->floats, values.size() * sizeof(float), cudaMemcpyDeviceToHost,
                                  device_->stream.get());
  if (e == cudaSuccess) e = cudaStreamSynchronize(device_->stream.get());
  std::vector<size_t> pending = std::move(device_->pending);
  device_->pending.clear();
  if (e != cudaSuccess) return CudaStatus(e, "reading amax values");
  for (size_t i = 0; i < values.size(); ++i) {
    const size_t at = pending[i];
    if (at < tensors.size() && std::isfinite(values[i])) tensors[at].amax = values[i];
  }
  return absl::OkStatus();
}

}  // namespace refit::client
