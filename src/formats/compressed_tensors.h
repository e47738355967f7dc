// The compressed-tensors formats (llm-compressor checkpoints, quant_method "compressed-tensors"):
// the bytes the compressed-tensors package's compressors write for a BF16 model after
// llm-compressor's min-max weight observer (FORMATS.md Part A, docs/formats.md).
//   ct_fp8_channel  "" F8_E4M3 [..., N, K]; "_scale" BF16 [..., N, 1]       (float-quantized, FP8_DYNAMIC)
//   ct_fp8_tensor   "" F8_E4M3 [..., N, K]; "_scale" BF16 [1]               (float-quantized, FP8)
//   ct_nvfp4        "_packed" U8 [..., N, K/2]; "_scale" F8_E4M3 [..., N, K/16];
//                   "_global_scale" F32 [1]                                 (nvfp4-pack-quantized, NVFP4A16)
//   ct_w4a16        "_packed" I32 [..., N, K/8]; "_scale" BF16 [..., N, K/128];
//                   "_shape" I64 [rank]                                     (pack-quantized, W4A16)
// The package computes in the model's dtype: every intermediate that torch evaluates on a BF16
// tensor is rounded to BF16 here too (Bf16 below), whatever the input dtype.
// Thread-safe: pure functions; callers own all buffers.
#ifndef REFIT_FORMATS_COMPRESSED_TENSORS_H_
#define REFIT_FORMATS_COMPRESSED_TENSORS_H_

#include <cstdint>
#include <span>

#include "formats/format.h"

namespace refit::formats::ct {

inline constexpr int64_t kNvfp4Block = 16;
inline constexpr int64_t kW4a16Group = 128;

// Per row: s = bf16(amax / 448) (a zero scale becomes bf16 eps 2^-7); q = E4M3(bf16(x / s) + 0).
void QuantizeFp8Channel(const ConstTensor& in, Fp32InputPolicy policy, float global_amax,
                        std::span<const MutableBytes> outs);
// As ct_fp8_channel with one amax A over the whole tensor (the resolved global amax).
void QuantizeFp8Tensor(const ConstTensor& in, Fp32InputPolicy policy, float global_amax,
                       std::span<const MutableBytes> outs);
void DequantizeFp8Channel(const Shape& shape, std::span<const ConstTensor> parts, std::span<float> out);
void DequantizeFp8Tensor(const Shape& shape, std::span<const ConstTensor> parts, std::span<float> out);

// G = bf16(bf16(1 / max(A, 2^-126)) * 2688) (1 when not finite); per 16-block S = E4M3(G * bf16(b / 6)),
// 0x20 (0.125) when that is zero; data E2M1(x / (S / G)) with torch.sign's sign rule.
// A is the tensor's amax or its fused group's (format_info.h GlobalAmax::kAny).
void QuantizeNvfp4(const ConstTensor& in, Fp32InputPolicy policy, float global_amax,
                   std::span<const MutableBytes> outs);
void DequantizeNvfp4(const Shape& shape, std::span<const ConstTensor> parts, std::span<float> out);

// Per 128-group: s = bf16(b / 7.5) (zero: 2^-7); q = round_half_even(clamp(bf16(x / s) + 0, -8, 7));
// nibble q + 8, element 8i+j in bits 4j..4j+3 of int32 word i. "_shape" holds the input shape.
void QuantizeW4a16(const ConstTensor& in, Fp32InputPolicy policy, float global_amax,
                   std::span<const MutableBytes> outs);
void DequantizeW4a16(const Shape& shape, std::span<const ConstTensor> parts, std::span<float> out);

}  // namespace refit::formats::ct

#endif  // REFIT_FORMATS_COMPRESSED_TENSORS_H_
