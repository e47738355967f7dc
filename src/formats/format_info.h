// The format descriptor table: one constant row per Format, saying everything the rest of refitd
// needs to know about a format without switching on it — block geometry, the tensors it emits
// (suffix, dtype, shape), whether it needs a global amax, the checkpoint metadata names it is
// imported from and exported as, and its CPU entry points (src/formats/<format>.cc). The GPU
// entry points are a parallel table in kernels/quantize_table.cc, indexed by the same enum, so
// that this library stays free of CUDA (docs/extending.md, "Add a format").
//
// Adding a format: its file pair, an enumerator in format.h, a row in format_table.cc (and a row
// in kernels/quantize_table.cc). Rows are in enum order; format_table.cc checks that at compile
// time. The format suites iterate this table; docs/extending.md lists the tests that name a
// format some hand-kept list (golden data, docs) lacks.
// Thread-safe: the table is immutable.
#ifndef REFIT_FORMATS_FORMAT_INFO_H_
#define REFIT_FORMATS_FORMAT_INFO_H_

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "formats/format.h"

namespace refit::formats {

// Elements per scale block along the last two input dimensions (1 = not blocked along it).
// Leading dimensions are a batch and never blocked.
struct BlockGeometry {
  int64_t rows = 1;  // along dim -2 (N)
  int64_t cols = 1;  // along dim -1 (K)
  // Partial blocks at the edges are zero-padded (DeepGEMM's 128x128 tiles); otherwise a
  // dimension that is not a whole number of blocks is refused.
  bool partial = false;
};

// A block that spans the whole dimension (per-channel scales span K, a per-tensor scale spans
// both): larger than any dimension, with `partial` set so any size is accepted. It refuses every
// tensor-parallel split and slice along that dimension, which would change the scale.
inline constexpr int64_t kWholeDim = int64_t{1} << 40;

// How an emitted tensor's shape follows from the input shape [..., N, K].
enum class OutputShape : uint8_t {
  kInput,           // [..., N, K]
  kPackedPairs,     // [..., N, K/2]: two 4-bit codes per byte, even element in the low nibble
  kPerBlock,        // [..., N/rows, K/cols] (ceil when the geometry allows partial blocks)
  kPerBlockPacked,  // [..., N/rows, K/cols, cols/2]: each block's packed 4-bit codes (gpt-oss "_blocks")
  kScalar,          // 0-d: the tensor-wide scale
  kSingle,          // [1]: a tensor-wide scale stored with one dimension (compressed-tensors)
  kPackedInt4x8,    // [..., N, K/8]: eight 4-bit codes per little-endian int32, element 8i+j in bits 4j..4j+3
  kShapeVector,     // [rank]: the input's shape (compressed-tensors "weight_shape")
};

struct OutputRole {
  std::string_view suffix;  // appended to the input tensor's name ("" for the data tensor)
  DType dtype;              // for a cast format: the cast's target
  OutputShape shape;
};

// Whether a tensor-wide amax A (of the tensor, or of its fused group) feeds a global scale.
enum class GlobalAmax : uint8_t {
  kNone,
  kAny,       // every A >= 0 encodes (nvfp4_te: A = 0 gives S_enc = 1)
  kNonzero,   // A = 0 is refused: the producer's block scales would be 0/0 (ModelOpt nvfp4)
};

// The names a format has in rollout checkpoints' quantization metadata (spec/quant_config.h
// reads them, refit/checkpoint_io.h writes them). Empty strings are absent fields.
struct CheckpointNames {
  // ModelOpt quant_algo (hf_quant_config.json "quantization", a MIXED_PRECISION layer, or
  // config.json quant_method "modelopt"), written for this format.
  std::string_view modelopt_algo = {};
  // Whether reading modelopt_algo gives this format (nvfp4_te writes NVFP4, which reads as nvfp4).
  bool reads_modelopt_algo = false;
  std::string_view modelopt_alias = {};  // one more quant_algo read as this format
  int64_t group_size = 0;                  // ModelOpt group_size written with, and required of, it (0: none)
  // config.json quantization_config.quant_method of the format's own family; empty: the format
  // is written in the ModelOpt form only.
  std::string_view quant_method = {};
  // quantization_config.scale_fmt, written; when present in a checkpoint it picks among the
  // rows of one quant_method (absent picks the first).
  std::string_view scale_fmt = {};
  std::string_view fmt = {};                // quantization_config.fmt: written, and required when present
  std::string_view activation_scheme = {};  // quantization_config.activation_scheme, written
  bool weight_block_size = false;           // quantization_config.weight_block_size = the geometry
  // compressed-tensors (quant_method "compressed-tensors"): the config group's "format" and its
  // weights' QuantizationArgs. An empty `format` means the format has no compressed-tensors form.
  struct CompressedTensors {
    std::string_view format = {};       // "float-quantized", "nvfp4-pack-quantized", "pack-quantized"
    std::string_view type = {};         // weights.type: "float" or "int"
    int num_bits = 0;                   // weights.num_bits
    std::string_view strategy = {};     // weights.strategy: "channel", "tensor", "tensor_group", "group"
    int group_size = 0;                 // weights.group_size (0: null)
    std::string_view scale_dtype = {};  // weights.scale_dtype as the package writes it (empty: null)
    // input_activations written with the checkpoint: dynamic FP8 with this strategy ("token",
    // "tensor"); empty: weight-only (no input_activations).
    std::string_view dynamic_input_strategy = {};
  } compressed_tensors = {};
};

// CPU reference entry points. REQUIRES (both): shapes and buffers match PlanOutputs; the input
// passed CheckQuantizableInput/CheckFinite (input.h). `global_amax` is the resolved A for
// formats with a global amax (GlobalAmax::kNone formats ignore it).
using QuantizeFn = void (*)(const ConstTensor& in, Fp32InputPolicy policy, float global_amax,
                            std::span<const MutableBytes> outs);
using DequantizeFn = void (*)(const Shape& shape, std::span<const ConstTensor> parts, std::span<float> out);

inline constexpr size_t kMaxOutputs = 3;

struct FormatInfo {
  Format format;
  std::string_view name;  // as the ecosystem names it, and as specs and refitctl spell it
  // False for the casts (bf16, fp16, fp32): any rank, BF16/F16/F32 input, no blocks.
  bool quantized;
  BlockGeometry block;
  GlobalAmax global_amax;
  std::array<OutputRole, kMaxOutputs> outputs;
  size_t output_count;
  CheckpointNames checkpoint;
  QuantizeFn quantize;
  DequantizeFn dequantize;

  std::span<const OutputRole> Outputs() const { return {outputs.data(), output_count}; }
};

// Every row, in enum order.
std::span<const FormatInfo> AllFormats();
// The row of `f`. REQUIRES: `f` is an enumerator of Format.
const FormatInfo& Info(Format f);

// The cast format whose output dtype is `dtype` (bf16, fp16, fp32), if any.
std::optional<Format> CastFormatFor(DType dtype);
// Every suffix some format emits, each once, longest first ("" last): how a checkpoint-format
// tensor name splits into base name and suffix.
std::vector<std::string_view> AllOutputSuffixes();

// Elements per quantization block along dim `dim` (normalized) of a rank-`rank` input.
int64_t BlockAlong(Format f, int dim, size_t rank);

}  // namespace refit::formats

#endif  // REFIT_FORMATS_FORMAT_INFO_H_
