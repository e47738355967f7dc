// AmaxMeter: the trainer side of single-pass NVFP4 (TensorDesc::amax, docs/formats.md
// "Trainer-supplied amax"). Measures max|x| of each pushed BF16 tensor with the computation refitd's
// converters run: the CPU reference (formats::Amax) for host tensors, the same GPU kernel
// (kernels::AccumulateAmax) on the trainer's own device for device tensors, queued on a stream of
// the meter's and read back once per bucket.
//
// Only BF16 tensors are measured: their max|x| does not depend on the spec's fp32 input policy,
// which the trainer does not know (a trainer that sends F32 may set TensorRef::amax itself).
// Threading: one session's thread.
#ifndef REFIT_CLIENT_AMAX_METER_H_
#define REFIT_CLIENT_AMAX_METER_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "refit/types.h"

namespace refit::formats {
struct QuantizeOptions;  // formats/format.h
}  // namespace refit::formats

namespace refit::client {

class AmaxMeter {
 public:
  AmaxMeter();
  ~AmaxMeter();
  AmaxMeter(const AmaxMeter&) = delete;
  AmaxMeter& operator=(const AmaxMeter&) = delete;

  // Measures `desc` (bytes at `data`, host or device memory), the `index`-th tensor of the bucket
  // being packed: a host tensor's amax is set now; a device tensor's is queued and set by Collect.
  // Non-finite input is left to refitd (no amax). Tensors other than BF16 are skipped.
  absl::Status Measure(TensorDesc& desc, const void* data, size_t index);
  // Waits for the queued device measurements and sets their tensors' amax in `tensors` (the
  // bucket's descs, indexed as Measure was told).
  absl::Status Collect(std::vector<TensorDesc>& tensors);

 private:
  // The options every measurement runs with (amax_meter.cc).
  static formats::QuantizeOptions MeasureOptions();
  // Measure of a device tensor: the device half (amax_meter_device.cc with CUDA; without it,
  // amax_meter_no_cuda.cc: Unimplemented).
  absl::Status MeasureOnDevice(TensorDesc& desc, const void* data, size_t index);

  struct Device;
  std::unique_ptr<Device> device_;  // created at the first device tensor
};

}  // namespace refit::client

#endif  // REFIT_CLIENT_AMAX_METER_H_
