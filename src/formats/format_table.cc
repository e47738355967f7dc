// The format descriptor table (format_info.h): one row per format, in enum order. The producer
// each row reproduces is named in format.h and FORMATS.md Part A.
#include <algorithm>

#include "formats/cast.h"
#include "formats/compressed_tensors.h"
#include "formats/format_info.h"
#include "formats/fp8_block128.h"
#include "formats/mxfp4.h"
#include "formats/mxfp8.h"
#include "formats/nvfp4.h"

namespace refit::formats {
namespace {

using S = OutputShape;

constexpr FormatInfo Cast(Format f, std::string_view name, DType target, QuantizeFn quantize) {
  return {f, name, false, {}, GlobalAmax::kNone, {{{"", target, S::kInput}}}, 1, {}, quantize, cast::Dequantize};
}

constexpr std::array kFormats = {
    Cast(Format::kBf16, "bf16", DType::kBF16, cast::QuantizeTo<DType::kBF16>),
    Cast(Format::kFp16, "fp16", DType::kF16, cast::QuantizeTo<DType::kF16>),
    Cast(Format::kFp32, "fp32", DType::kF32, cast::QuantizeTo<DType::kF32>),
    FormatInfo{Format::kFp8Block128,
               "fp8_block128",
               true,
               {128, 128, /*partial=*/true},
               GlobalAmax::kNone,
               {{{"", DType::kF8E4M3, S::kInput}, {"_scale_inv", DType::kF32, S::kPerBlock}}},
               2,
               {.modelopt_algo = "FP8_BLOCK128",
                .reads_modelopt_algo = true,
                .modelopt_alias = "FP8_PB_WO",
                .quant_method = "fp8",
                .fmt = "e4m3",
                .activation_scheme = "dynamic",
                .weight_block_size = true},
               fp8_block128::Quantize,
               fp8_block128::Dequantize},
    FormatInfo{Format::kFp8Block128Ue8m0,
               "fp8_block128_ue8m0",
               true,
               {128, 128, /*partial=*/true},
               GlobalAmax::kNone,
               {{{"", DType::kF8E4M3, S::kInput}, {"_scale_inv", DType::kF32, S::kPerBlock}}},
               2,
               // ModelOpt has no UE8M0 block-128 algorithm: mixed checkpoints name it FP8_BLOCK128.
               {.modelopt_algo = "FP8_BLOCK128",
                .quant_method = "fp8",
                .scale_fmt = "ue8m0",
                .fmt = "e4m3",
                .activation_scheme = "dynamic",
                .weight_block_size = true},
               fp8_block128::QuantizeUe8m0,
               fp8_block128::Dequantize},
    FormatInfo{Format::kMxfp8,
               "mxfp8",
               true,
               {1, 32},
               GlobalAmax::kNone,
               {{{"", DType::kF8E4M3, S::kInput}, {"_scale_inv", DType::kU8, S::kPerBlock}}},
               2,
               {.modelopt_algo = "MXFP8",
                .reads_modelopt_algo = true,
                .quant_method = "mxfp8",
                .scale_fmt = "ue8m0",
                .fmt = "e4m3",
                .activation_scheme = "dynamic",
                .weight_block_size = true},
               mxfp8::Quantize,
               mxfp8::Dequantize},
    FormatInfo{Format::kNvfp4,
               "nvfp4",
               true,
               {1, 16},
               GlobalAmax::kNonzero,
               {{{"", DType::kU8, S::kPackedPairs},
                 {"_scale", DType::kF8E4M3, S::kPerBlock},
                 {"_scale_2", DType::kF32, S::kScalar}}},
               3,
               {.modelopt_algo = "NVFP4", .reads_modelopt_algo = true, .group_size = 16},
               nvfp4::QuantizeModelOpt,
               nvfp4::Dequantize},
    // TE's NVFP4 has ModelOpt's tensors and scale meanings; its checkpoints say NVFP4 too.
    FormatInfo{Format::kNvfp4Te,
               "nvfp4_te",
               true,
               {1, 16},
               GlobalAmax::kAny,
               {{{"", DType::kU8, S::kPackedPairs},
                 {"_scale", DType::kF8E4M3, S::kPerBlock},
                 {"_scale_2", DType::kF32, S::kScalar}}},
               3,
               {.modelopt_algo = "NVFP4", .group_size = 16},
               nvfp4::QuantizeTe,
               nvfp4::Dequantize},
    FormatInfo{Format::kMxfp4,
               "mxfp4",
               true,
               {1, 32},
               GlobalAmax::kNone,
               {{{"_blocks", DType::kU8, S::kPerBlockPacked}, {"_scales", DType::kU8, S::kPerBlock}}},
               2,
               {.modelopt_algo = "MXFP4", .reads_modelopt_algo = true, .quant_method = "mxfp4"},
               mxfp4::Quantize,
               mxfp4::Dequantize},
    // compressed-tensors: the package's compressors after llm-compressor's min-max observer on a
    // BF16 model (compressed_tensors.h). Checkpoints say quant_method "compressed-tensors".
    FormatInfo{Format::kCtFp8Channel,
               "ct_fp8_channel",
               true,
               {1, kWholeDim, /*partial=*/true},
               GlobalAmax::kNone,
               {{{"", DType::kF8E4M3, S::kInput}, {"_scale", DType::kBF16, S::kPerBlock}}},
               2,
               {.quant_method = "compressed-tensors",
                .compressed_tensors = {.format = "float-quantized",
                                       .type = "float",
                                       .num_bits = 8,
                                       .strategy = "channel",
                                       .dynamic_input_strategy = "token"}},
               ct::QuantizeFp8Channel,
               ct::DequantizeFp8Channel},
    // The tensor's amax is its global amax (A = 0 gives the eps scale); fused members are refused
    // by the whole-dimension block, so A is the tensor's own (or a trainer-supplied one).
    FormatInfo{Format::kCtFp8Tensor,
               "ct_fp8_tensor",
               true,
               {kWholeDim, kWholeDim, /*partial=*/true},
               GlobalAmax::kAny,
               {{{"", DType::kF8E4M3, S::kInput}, {"_scale", DType::kBF16, S::kSingle}}},
               2,
               {.quant_method = "compressed-tensors",
                .compressed_tensors = {.format = "float-quantized",
                                       .type = "float",
                                       .num_bits = 8,
                                       .strategy = "tensor",
                                       .dynamic_input_strategy = "tensor"}},
               ct::QuantizeFp8Tensor,
               ct::DequantizeFp8Tensor},
    FormatInfo{Format::kCtNvfp4,
               "ct_nvfp4",
               true,
               {1, 16},
               GlobalAmax::kAny,
               {{{"_packed", DType::kU8, S::kPackedPairs},
                 {"_scale", DType::kF8E4M3, S::kPerBlock},
                 {"_global_scale", DType::kF32, S::kSingle}}},
               3,
               {.quant_method = "compressed-tensors",
                .compressed_tensors = {.format = "nvfp4-pack-quantized",
                                       .type = "float",
                                       .num_bits = 4,
                                       .strategy = "tensor_group",
                                       .group_size = 16,
                                       .scale_dtype = "torch.float8_e4m3fn"}},
               ct::QuantizeNvfp4,
               ct::DequantizeNvfp4},
    FormatInfo{Format::kCtW4a16,
               "ct_w4a16",
               true,
               {1, 128},
               GlobalAmax::kNone,
               {{{"_packed", DType::kI32, S::kPackedInt4x8},
                 {"_scale", DType::kBF16, S::kPerBlock},
                 {"_shape", DType::kI64, S::kShapeVector}}},
               3,
               {.quant_method = "compressed-tensors",
                .compressed_tensors =
                    {.format = "pack-quantized", .type = "int", .num_bits = 4, .strategy = "group", .group_size = 128}},
               ct::QuantizeW4a16,
               ct::DequantizeW4a16},
};

constexpr bool InEnumOrder() {
  for (size_t i = 0; i < kFormats.size(); ++i) {
    if (static_cast<size_t>(kFormats[i].format) != i) return false;
  }
  return true;
}
static_assert(InEnumOrder(), "format_table.cc: rows must follow the Format enum, one row each");
static_assert(kFormats.size() == kFormatCount, "format_table.cc: one row per Format enumerator");

}  // namespace

std::span<const FormatInfo> AllFormats() { return kFormats; }

const FormatInfo& Info(Format f) { return kFormats[static_cast<size_t>(f)]; }

}  // namespace refit::formats
