// Host launch API of the GPU quantizers: the device twin of formats::Quantize (formats/format.h).
// Same formats, same outputs in the same order (formats::PlanOutputs), byte-identical results;
// only the memory is on the device and the work is enqueued on a CUDA stream.
//
// Threading: every function only enqueues work on `stream` (a cudaStream_t passed as void*;
// nullptr = the legacy default stream) and returns without synchronizing, except
// NonfiniteProbe::Check, which synchronizes the stream. Callers own all device buffers and keep
// them alive until the stream has passed the work. Functions are safe to call concurrently on
// different streams.
#ifndef REFIT_KERNELS_QUANTIZE_H_
#define REFIT_KERNELS_QUANTIZE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/device_allocation.h"
#include "formats/format.h"

namespace refit::kernels {

// Records the smallest flat index of a non-finite input element seen by the kernels it is given
// to (options.nonfinite == kReject). Owns 8 bytes of device memory.
class NonfiniteProbe {
 public:
  static absl::StatusOr<NonfiniteProbe> Create();
  NonfiniteProbe(NonfiniteProbe&& other) noexcept = default;
  NonfiniteProbe& operator=(NonfiniteProbe&& other) noexcept = default;

  // Clears the record (enqueued on `stream`).
  absl::Status Reset(void* stream);
  // Synchronizes `stream`; InvalidArgument naming `tensor_name` and the first bad flat index when
  // a non-finite element was recorded since the last Reset.
  absl::Status Check(std::string_view tensor_name, void* stream) const;
  unsigned long long* device_word() const { return word_.as<unsigned long long>(); }

 private:
  explicit NonfiniteProbe(DeviceAllocation word) : word_(std::move(word)) {}
  DeviceAllocation word_;
};

// Where the global amax of NVFP4 formats comes from: the host (one pass over the input), or a
// device float filled by AccumulateAmax (the two-pass path; no host round trip).
// `claim`: the tensor's own amax as the trainer supplied it (NVFP4 formats): the encode also
// checks it against every block's max|x| in the same pass and records a block that exceeds it
// (see kAmaxClaimBit); the caller's check of the word then refuses the tensor.
struct GlobalAmax {
  std::optional<float> host;
  const float* device = nullptr;
  std::optional<float> claim;
};

// A recorded word (~0ULL: nothing) is either the first non-finite flat index, or kAmaxClaimBit |
// the flat index of a block whose max|x| exceeds GlobalAmax::claim (non-finite input wins: its
// index is smaller).
inline constexpr unsigned long long kAmaxClaimBit = 1ULL << 63;
// OK for ~0ULL; otherwise InvalidArgument naming `tensor_name` and what the word records.
absl::Status RecordedStatus(unsigned long long word, std::string_view tensor_name, std::optional<float> claim);

// Quantizes the device tensor `in` (BF16 or FP32, dense row-major) into `outs` (device buffers,
// one per formats::PlanOutputs entry, in that order, exact byte sizes).
// options.nonfinite == kReject requires `probe`: the kernels record the first non-finite element
// there and the caller must Check it before using the outputs; kPropagate encodes non-finite
// values with the producer's arithmetic. NVFP4 formats need `amax` (host or device); other
// formats ignore it.
absl::Status Quantize(formats::Format f, const formats::ConstTensor& in,
                      const formats::QuantizeOptions& options, const GlobalAmax& amax,
                      std::span<const formats::MutableBytes> outs, std::string_view tensor_name,
                      const NonfiniteProbe* probe, void* stream);

// As Quantize, recording non-finite input in `first_bad` instead of a NonfiniteProbe: a device
// word the caller set to ~0ULL, which the kernels lower to the first bad flat index. Lets one
// array of words, read back with one copy, serve every tensor of a bucket. `first_bad` may be
// nullptr only under kPropagate and without amax.claim (an exceeded claim is recorded there
// too, under either policy; decode with RecordedStatus).
absl::Status QuantizeRecording(formats::Format f, const formats::ConstTensor& in,
                               const formats::QuantizeOptions& options, const GlobalAmax& amax,
                               std::span<const formats::MutableBytes> outs, std::string_view tensor_name,
                               unsigned long long* first_bad, void* stream);

// The argument checks Quantize makes before enqueuing anything: input dtype and shape for the
// format, output count, exact sizes, non-null pointers, alignment. Errors name `tensor_name`.
absl::Status CheckQuantizeArgs(formats::Format f, const formats::ConstTensor& in,
                               std::span<const formats::MutableBytes> outs, std::string_view tensor_name);

// The per-format output byte sizes Quantize expects (the same as formats::PlanOutputs' bytes).
absl::StatusOr<std::vector<uint64_t>> OutputBytes(formats::Format f, DType input, const Shape& shape);

// *amax_device = max(*amax_device, max|x|) over `in` after the input policy; NaN dominates.
// Call ResetAmax first; calling it for every member of a fused group yields the group's amax.
absl::Status ResetAmax(float* amax_device, void* stream);
absl::Status AccumulateAmax(const formats::ConstTensor& in, const formats::QuantizeOptions& options,
                            float* amax_device, void* stream);

}  // namespace refit::kernels

#endif  // REFIT_KERNELS_QUANTIZE_H_
