// AmaxMeter's host half (amax_meter.h): host tensors measured by the CPU reference; device ones go
// to the device half (amax_meter_device.cc with CUDA, amax_meter_no_cuda.cc without).
#include "client/amax_meter.h"

#include <cmath>

#include "formats/format.h"
#include "storage/memory.h"

namespace refit::client {

formats::QuantizeOptions AmaxMeter::MeasureOptions() {
  // nonfinite: propagate, so a NaN is measured rather than refused here: refitd refuses it (or
  // propagates it) per its spec, as without a supplied amax.
  formats::QuantizeOptions options;
  options.nonfinite = formats::NonfinitePolicy::kPropagate;
  return options;
}

absl::Status AmaxMeter::Measure(TensorDesc& desc, const void* data, size_t index) {
  if (desc.dtype != DType::kBF16) return absl::OkStatus();
  if (!storage::CheckDeviceMemory(data).ok()) {
    const formats::ConstTensor in{desc.dtype, desc.shape, data};
    absl::StatusOr<float> a = formats::Amax(in, MeasureOptions(), desc.name);
    if (!a.ok()) return a.status();
    if (std::isfinite(*a)) desc.amax = *a;
    return absl::OkStatus();
  }
  return MeasureOnDevice(desc, data, index);
}

}  // namespace refit::client
