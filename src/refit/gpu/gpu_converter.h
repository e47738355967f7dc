// The GPU converter: quantizes into device staging with the kernels of kernels/, which equal
// the CPU reference byte for byte. Host-resident inputs (UCX buckets in pinned slots) are first
// copied to a device scratch buffer; device-resident inputs (NCCL slots) are read in place.
// Built only with CUDA; this folder is the core's only CUDA adapter.
#ifndef REFIT_REFIT_GPU_GPU_CONVERTER_H_
#define REFIT_REFIT_GPU_GPU_CONVERTER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "refit/converter.h"

namespace refit {

// A converter on CUDA device `device` with its own stream.
absl::StatusOr<std::unique_ptr<Converter>> NewGpuConverter(int device);

}  // namespace refit

#endif  // REFIT_REFIT_GPU_GPU_CONVERTER_H_
