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
#include <optional>
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
    // NVFP4 fused-group members: every member's name, this one included (one global amax).
    std::vector<std::string> amax_group;
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
  // order; an NVFP4 slice's global scale is whole (no slice: every rank sends the same one, from
  // the amax reduced over the ranks). Refused naming the tensor: transposed tensors, a slice that
  // cuts a block.
  struct SliceOutput {
    DType dtype;
    Shape shape;
    TensorSlice slice;
  };
  absl::StatusOr<std::vector<SliceOutput>> SliceOutputs(const Entry& e, DType dtype, const Shape& shape,
                                                       const TensorSlice& slice) const;
  // Converts a dense host tensor into `outs` (host buffers, one per output, exact sizes).
  // `shape` is the tensor's (or, for a slice, the slice's: it is converted on its own).
  // `global_amax`: NVFP4's amax (the fused group's or the whole tensor's, reduced by the caller;
  // refused when below the bytes' own max|x|); nullopt: the bytes' own.
  absl::Status ConvertHost(const Entry& e, DType dtype, const Shape& shape, const void* data,
                           std::span<const formats::MutableBytes> outs,
                           std::optional<float> global_amax = std::nullopt) const;
  // Converts a dense CUDA device tensor (or slice, of `shape`) with the GPU kernels into device
  // buffers it allocates on the tensor's device (one per output, exact sizes), and waits for them. Unimplemented in
  // builds without CUDA kernels.
  absl::StatusOr<std::vector<std::shared_ptr<uint8_t>>> ConvertDevice(const Entry& e, DType dtype, const Shape& shape,
                                                                      const void* data,
                                                                      std::optional<float> global_amax = std::nullopt) const;
  // Whether a push of `e` needs a caller-reduced global amax: an NVFP4 member of a fused group,
  // or an NVFP4 slice (the amax spans tensors or ranks).
  static bool NeedsReducedAmax(const Entry& e, bool slice);
  // Whether this build converts device tensors on the GPU (ConvertDevice and HasKernels:
  // trainer_convert_device.cc with CUDA kernels, trainer_convert_no_kernels.cc without).
  static bool HasKernels();

 private:
  // The shape `e` quantizes: `shape` with its last two dimensions swapped when e.transpose.
  static Shape Quantized(const Entry& e, const Shape& shape);

  formats::QuantizeOptions options_;
  std::vector<Entry> entries_;
  absl::flat_hash_map<std::string, size_t> by_name_;
};

}  // namespace refit::client

#endif  // REFIT_CLIENT_TRAINER_CONVERT_H_
