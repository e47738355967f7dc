// Megatron-core source layout (spec `source: {layout: megatron}`): maps one tensor a trainer
// rank pushes under its Megatron-core name to the checkpoint (Hugging Face) tensors it holds
// parts of, as slices (TensorSlice) of those tensors, so that the slice assembler and the
// ledger validate a Megatron refit exactly like one of checkpoint names: every checkpoint tensor
// exactly once, every sliced one tiled.
//
// What a pushed tensor says: its name with GLOBAL layer and expert numbers (refit.megatron
// renumbers a pipeline stage's and an expert-parallel rank's local ones), and its tensor-parallel
// shard as a slice along the dimension Megatron partitions (start = tp_rank * local rows, full
// shape = the TP-concatenated tensor); a tensor not split by TP is pushed whole, by one rank.
//
//   decoder.layers.{L}.self_attention.linear_qkv.{weight,bias}  rows: per query group
//       [q heads of the group; k; v] -> model.layers.{L}.self_attn.{q,k,v}_proj.*
//   ...linear_qkv.layer_norm_weight / input_layernorm.weight  -> ...input_layernorm.weight
//   ...self_attention.linear_proj.weight                       -> ...self_attn.o_proj.weight (slice as pushed)
//   ...self_attention.{q,k}_layernorm.weight                   -> ...self_attn.{q,k}_norm.weight
//   ...mlp.linear_fc1.weight  per TP rank [gate shard; up shard] -> ...mlp.{gate,up}_proj.weight
//   ...mlp.linear_fc1.layer_norm_weight / pre_mlp_layernorm.weight -> ...post_attention_layernorm.weight
//   ...mlp.linear_fc2.weight                                   -> ...mlp.down_proj.weight
//   ...mlp.router.weight                                       -> ...mlp.gate.weight
//   ...mlp.experts.local_experts.{E}.linear_fc{1,2}.weight and grouped-GEMM
//      ...mlp.experts.linear_fc{1,2}.weight{E}                 -> ...mlp.experts.{E}.{gate,up,down}_proj.weight
//   embedding.word_embeddings.weight / output_layer.weight (vocab rows, padding past
//       source.vocab_size dropped)                            -> model.embed_tokens.weight / lm_head.weight
//   decoder.final_layernorm.weight                             -> model.norm.weight
// MLA (source.attention mla, DeepSeek-V3), per layer:
//   self_attention.linear_q_down_proj / linear_q_up_proj / linear_q_proj / linear_kv_down_proj /
//   linear_kv_up_proj .weight -> self_attn.q_a_proj / q_b_proj / q_proj / kv_a_proj_with_mqa /
//   kv_b_proj .weight (slices as pushed: Megatron-core and HF order the up projections' rows by
//   head alike); fused linear_qkv_down_proj -> [q_a_proj; kv_a_proj_with_mqa] rows;
//   linear_q_up_proj.layer_norm_weight / q_layernorm -> q_a_layernorm, linear_kv_up_proj.
//   layer_norm_weight / kv_layernorm -> kv_a_layernorm, linear_q{,kv}_down_proj.layer_norm_weight /
//   linear_q_proj.layer_norm_weight -> input_layernorm.
// Shared experts: mlp.shared_experts.linear_fc1 ([gate; up] per TP rank) / linear_fc2 ->
//   mlp.shared_experts.{gate,up,down}_proj; mlp.router.expert_bias -> mlp.gate.e_score_correction_bias.
// gpt-oss (source.experts gpt_oss): self_attention.core_attention.softmax_offset -> self_attn.sinks,
//   mlp.router.{weight,bias} -> mlp.router.*, and each expert e's linear_fc1 / linear_fc2 weight and
//   bias -> entry e of the stacked mlp.experts.gate_up_proj[_bias] ([E, in, out], gate/up columns
//   interleaved: a reordered piece) / down_proj[_bias] ([E, in, out]: transposed).
// Qwen3-Next / Qwen3.5 (source.attention gated): linear_qkv per query group [q heads; their output
//   gates; k; v] -> q_proj (per head [q; gate]), k_proj, v_proj; gated delta-net
//   self_attention.in_proj.weight (per TP rank [q; k; v; z; b; a] of its heads) -> linear_attn.
//   in_proj_qkvz (per key head [q; k; v; z]) / in_proj_ba (per key head [b; a]); conv1d.weight (per
//   TP rank [q; k; v] of its heads) -> linear_attn.conv1d.weight; A_log, dt_bias, out_proj.weight,
//   in_proj.layer_norm_weight renamed; out_norm.weight refused (it is the checkpoint's norm minus 1);
//   mlp.shared_experts.* -> mlp.shared_expert.*, shared_experts.gate_weight -> mlp.shared_expert_gate;
//   mtp.layers.0.{eh_proj,enorm,hnorm,final_layernorm} -> mtp.{fc,pre_fc_norm_embedding,
//   pre_fc_norm_hidden,norm}, mtp.layers.{N}.transformer_layer.* -> mtp.layers.{N}.* as a layer.
// Leading "module." wrappers (DDP, Float16Module) are ignored. Names outside embedding.,
// decoder. and output_layer. are taken as checkpoint names.
//
// Thread-safe (pure functions).
#ifndef REFIT_REFIT_MEGATRON_SOURCE_H_
#define REFIT_REFIT_MEGATRON_SOURCE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "refit/types.h"
#include "spec/model_spec.h"

namespace refit {

// One checkpoint tensor's part: `desc` (a slice, or whole when it covers the tensor; offset 0)
// whose bytes lie contiguously at `src_offset` in the pushed tensor's bytes.
// `reorder` other than kNone: the piece is the whole pushed tensor (`rows` x `cols` elements,
// cols 1 for a vector) rearranged by ReorderPiece first.
enum class Reorder : uint8_t {
  kNone,
  kTranspose,           // [rows, cols] -> [cols, rows]
  kGluInterleaveT,      // [gate; up] rows [2I, cols] -> [cols, 2I], column 2j gate row j, 2j + 1 up row j
  kGluInterleave,       // a [gate; up] vector [2I] -> gate j at 2j, up j at 2j + 1
};

struct SourcePiece {
  TensorDesc desc;
  uint64_t src_offset = 0;
  Reorder reorder = Reorder::kNone;
  uint64_t rows = 0, cols = 0;
};

// Writes piece `p`'s bytes (desc.nbytes) to `dst` from the pushed tensor's bytes `src`
// (p.reorder != kNone).
void ReorderPiece(const SourcePiece& p, const uint8_t* src, uint8_t* dst);

// The pieces of pushed tensor `in` (possibly none: rows that are all vocabulary padding);
// nullopt when `in.name` is not a Megatron-core name. Errors name the tensor: an unknown
// Megatron name, a shape the source section's heads/groups/head_dim do not explain, a TP shard
// along another dimension than Megatron's.
absl::StatusOr<std::optional<std::vector<SourcePiece>>> MapMegatron(const spec::MegatronSource& source,
                                                                      const TensorDesc& in);

// The whole checkpoint tensors (name, dtype, shape) a manifest entry of a Megatron-core name and
// full shape stands for; {entry} for a checkpoint name.
absl::StatusOr<std::vector<TensorDesc>> MapMegatronManifest(const spec::MegatronSource& source, const TensorDesc& entry);

}  // namespace refit

#endif  // REFIT_REFIT_MEGATRON_SOURCE_H_
