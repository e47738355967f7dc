// AmaxMeter's device half in a build without CUDA (amax_meter.h): there are no device tensors.
#include "client/amax_meter.h"

namespace refit::client {

struct AmaxMeter::Device {};

AmaxMeter::AmaxMeter() = default;
AmaxMeter::~AmaxMeter() = default;

absl::Status AmaxMeter::MeasureOnDevice(TensorDesc&, const void*, size_t) {
  return absl::UnimplementedError("device tensors need a build with CUDA");
}

absl::Status AmaxMeter::Collect(std::vector<TensorDesc>&) { return absl::OkStatus(); }

}  // namespace refit::client
