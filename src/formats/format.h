// Checkpoint formats refitd emits, and the CPU reference quantizers that define their bytes.
// ../shared/FORMATS.md Part A names the one producer each format reproduces bit for bit; the
// CUDA kernels in kernels/ must equal these functions byte for byte. What each format is
// (geometry, outputs, metadata names, entry points) is its row in format_info.h's table; the
// functions here read that table.
// Thread-safe: pure functions; callers own all buffers.
#ifndef REFIT_FORMATS_FORMAT_H_
#define REFIT_FORMATS_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"

namespace refit::formats {

enum class Format : uint8_t {
  kBf16,  // IEEE RNE cast (passthrough when dtypes match)
  kFp16,
  kFp32,
  kFp8Block128,       // DeepGEMM per_block_cast_to_fp8(use_ue8m0=False)
  kFp8Block128Ue8m0,  // same with use_ue8m0=True + canonicalization (FORMATS.md B §4.4)
  kMxfp8,             // TransformerEngine MXFP8 RCEIL
  kNvfp4,             // ModelOpt NVFP4QTensor
  kNvfp4Te,           // TransformerEngine 1-D NVFP4
  kMxfp4,             // triton_kernels downcast_to_mxfp_torch ROUND_UP, gpt-oss naming
  kCtFp8Channel,      // compressed-tensors float-quantized, FP8 per output channel (FP8_DYNAMIC)
  kCtFp8Tensor,       // compressed-tensors float-quantized, FP8 per tensor
  kCtNvfp4,           // compressed-tensors nvfp4-pack-quantized (NVFP4A16)
  kCtW4a16,           // compressed-tensors pack-quantized, int4 symmetric group 128 (W4A16)
};
// Keep in step with the last enumerator: format_table.cc checks one row per enumerator.
inline constexpr size_t kFormatCount = static_cast<size_t>(Format::kCtW4a16) + 1;

// The row's name (format_info.h): "bf16", "fp8_block128", "nvfp4", ... (`refitctl formats`).
const char* FormatName(Format f);
absl::StatusOr<Format> ParseFormat(std::string_view name);
// True for formats that need a per-tensor (or per-fused-group) global amax before encoding.
bool NeedsGlobalAmax(Format f);

enum class Fp32InputPolicy : uint8_t { kExact, kRoundToBf16 };
enum class NonfinitePolicy : uint8_t { kReject, kPropagate };

struct QuantizeOptions {
  Fp32InputPolicy fp32_input = Fp32InputPolicy::kExact;
  NonfinitePolicy nonfinite = NonfinitePolicy::kReject;
};

// One checkpoint tensor that a format emits for one input tensor. The emitted tensor's name is
// the input tensor's name with `suffix` appended ("" for the data tensor of FP8/NVFP4, "_scale_inv",
// "_scale", "_scale_2", "_blocks", "_scales").
struct OutputSpec {
  std::string suffix;
  DType dtype;
  Shape shape;
  uint64_t bytes;
};

// A dense row-major host tensor.
struct ConstTensor {
  DType dtype;
  Shape shape;
  const void* data;
};

struct MutableBytes {
  void* data;
  uint64_t bytes;
};

// What `f` emits for an input of this dtype and shape, in a fixed order. InvalidArgument (with a
// reason, e.g. "K=100 is not a multiple of 16") when the format cannot take the tensor; callers
// that convert whole checkpoints then keep the tensor unquantized.
absl::StatusOr<std::vector<OutputSpec>> PlanOutputs(Format f, DType input, const Shape& shape);

// max|x| over the tensor in fp32, after the input policy (round_to_bf16) is applied.
// NaN/Inf are reported as InvalidArgument naming `tensor_name` and the first bad index when
// options.nonfinite == kReject.
absl::StatusOr<float> Amax(const ConstTensor& in, const QuantizeOptions& options,
                           std::string_view tensor_name);

// Quantizes `in` (BF16 or FP32) into `outs`, which match PlanOutputs(f, ...) one to one.
// `global_amax`: for NeedsGlobalAmax formats, the amax A shared by the fused group (max over
// its members); when absent the tensor's own amax is used. Ignored by other formats.
// Errors name `tensor_name`.
// `supplied_amax`: the tensor's own max|x| as its producer stated it (a trainer-supplied amax);
// for NeedsGlobalAmax formats, InvalidArgument naming the tensor when it is below the tensor's
// real max|x| (checked in the same pass that computes it). Ignored by other formats.
absl::Status Quantize(Format f, const ConstTensor& in, const QuantizeOptions& options,
                      std::optional<float> global_amax, std::span<const MutableBytes> outs,
                      std::string_view tensor_name, std::optional<float> supplied_amax = std::nullopt);

// Inverse, to fp32 (for verification and error-bound tests). `parts` match PlanOutputs.
absl::Status Dequantize(Format f, const Shape& shape, std::span<const ConstTensor> parts,
                        std::span<float> out);

}  // namespace refit::formats

#endif  // REFIT_FORMATS_FORMAT_H_
