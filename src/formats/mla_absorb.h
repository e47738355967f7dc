// DeepSeek multi-latent attention's absorbed weights, as SGLang derives them from kv_b_proj
// after loading (python/sglang/srt/models/deepseek_v2.py, DeepseekV2ForCausalLM.post_load_weights;
// FORMATS.md-style description in docs/formats.md "Derived parameters").
//
// kv_b_proj.weight is [heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]: per head, the
// qk_nope rows then the v rows. SGLang keeps
//   w_kc = w_kc.transpose(1, 2).contiguous().transpose(1, 2)   stored as [heads, kv_lora_rank, qk_nope]
//   w_vc = w_vc.contiguous().transpose(1, 2)                   stored as [heads, v_head_dim, kv_lora_rank]
// and the engine registers that storage in memory order (the shapes on the right). A block-FP8
// kv_b_proj (128x128 `weight_scale_inv`) is first dequantized to BF16 as `block_quant_dequant`
// does: bf16(float(q) * s), one rounding.
// Thread-safe: pure functions; callers own all buffers.
#ifndef REFIT_FORMATS_MLA_ABSORB_H_
#define REFIT_FORMATS_MLA_ABSORB_H_

#include <cstdint>
#include <span>

#include "absl/status/status.h"

namespace refit::formats {

struct MlaAbsorbGeometry {
  int64_t heads = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t kv_lora_rank = 0;

  int64_t Rows() const { return heads * (qk_nope_head_dim + v_head_dim); }
  int64_t InputElements() const { return Rows() * kv_lora_rank; }
  int64_t WkcElements() const { return heads * kv_lora_rank * qk_nope_head_dim; }
  int64_t WvcElements() const { return heads * v_head_dim * kv_lora_rank; }
  // The 128x128 block scales of an FP8 kv_b_proj: [ceil(Rows / 128), ceil(kv_lora_rank / 128)].
  int64_t ScaleRows() const { return (Rows() + 127) / 128; }
  int64_t ScaleCols() const { return (kv_lora_rank + 127) / 128; }
};

// InvalidArgument when a dimension is not positive or a buffer's size differs from the geometry.
absl::Status CheckMlaAbsorbGeometry(const MlaAbsorbGeometry& g);

// BF16 kv_b_proj (raw bf16 bits, row-major) -> w_kc and w_vc (bf16 bits, the layouts above).
absl::Status MlaAbsorbBf16(const MlaAbsorbGeometry& g, std::span<const uint16_t> kv_b, std::span<uint16_t> w_kc,
                           std::span<uint16_t> w_vc);

// E4M3 kv_b_proj with F32 128x128 block scales (DeepSeek-V3 `weight_scale_inv`) -> BF16 w_kc
// and w_vc. Element (r, c) is bf16(E4M3(q) * scale_inv[r / 128][c / 128]) in fp32 with one
// round-to-nearest-even (NaN codes stay NaN).
absl::Status MlaAbsorbFp8Block128(const MlaAbsorbGeometry& g, std::span<const uint8_t> kv_b,
                                  std::span<const float> scale_inv, std::span<uint16_t> w_kc, std::span<uint16_t> w_vc);

}  // namespace refit::formats

#endif  // REFIT_FORMATS_MLA_ABSORB_H_
