// Trainer-side conversion (wire format checkpoint): the tensors refitd's wire plan lists are
// converted by the trainer before packing, with refitd's own code (formats::Quantize, the CPU
// reference quantizers, for host tensors; the kernels/ quantizers for CUDA device tensors in
// builds with CUDA), so the wire carries their FP8/FP4 bytes plus scales and refitd stages them
// as they are. Byte-identical to refitd converting them: the same functions on the same input.
// Thread-safe after Create: const methods only.
#ifndef REFIT_CLIENT_TRAINER_CONVERT_H_
#define REFIT_CLIENT_TRAINER_CONVERT_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "formats/format.h"
#include "refit/types.h"

namespace refit::client {

class TrainerConverter {
 public:
  struct Entry {
    std::string name;
    formats::Format format = formats::Format::kFp8Block128;
    bool transpose = false;
    std::vector<formats::OutputSpec> outputs;  // the names sent are name + suffix
  };

  // From begin's (or join's) wire plan. Refuses an entry this build cannot convert (an unknown
  // format, outputs unlike what this build's PlanOutputs would emit for any input), naming it.
  static absl::StatusOr<TrainerConverter> Create(const WirePlan& plan);

  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }
  const formats::QuantizeOptions& options() const { return options_; }
  // The plan's entry for `name`, or nullptr (the tensor travels as pushed).
  const Entry* Find(const std::string& name) const;

  // Checks a push of `dtype`/`shape` against the entry (BF16 or F32, the outputs the plan lists);
  // errors name the tensor.
  absl::Status CheckInput(const Entry& e, DType dtype, const Shape& shape) const;
  // A block-aligned slice of a listed tensor converts on its own (its blocks lie inside it): the
  // outputs of the slice, each a slice of the whole output (dtype, shape, TensorSlice), in output
  // order. Refused naming the tensor: NVFP4 formats (the global amax spans the whole tensor:
  // push it whole, or use wire format bf16), transposed tensors, a slice that cuts a block.
  struct SliceOutput {
    DType dtype;
    Shape shape;
    TensorSlice slice;
  };
  absl::StatusOr<std::vector<SliceOutput>> SliceOutputs(const Entry& e, DType dtype, const Shape& shape,
                                                       const TensorSlice& slice) const;
  // Converts a dense host tensor into `outs` (host buffers, one per output, exact sizes).
  // `shape` is the tensor's (or, for a slice, the slice's: it is converted on its own).
  absl::Status ConvertHost(const Entry& e, DType dtype, const Shape& shape, const void* data,
                           std::span<const formats::MutableBytes> outs) const;
  // Converts a dense CUDA device tensor (or slice, of `shape`) with the GPU kernels into device
  // buffers it allocates on the tensor's device (one per output, exact sizes), and waits for them. Unimplemented in
  // builds without CUDA kernels.
  absl::StatusOr<std::vector<std::shared_ptr<uint8_t>>> ConvertDevice(const Entry& e, DType dtype, const Shape& shape,
                                                                      const void* data) const;
  // Whether this build converts device tensors on the GPU.
  static bool HasKernels();

 private:
  formats::QuantizeOptions options_;
  std::vector<Entry> entries_;
  absl::flat_hash_map<std::string, size_t> by_name_;
};

}  // namespace refit::client

#endif  // REFIT_CLIENT_TRAINER_CONVERT_H_
