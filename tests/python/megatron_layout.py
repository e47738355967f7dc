"""A Hugging Face checkpoint laid out as Megatron-core holds it on one (tp, pp, ep) rank: the
names and per-rank tensors a Megatron-core GPTModel chunk's `named_parameters()` gives.

Written from Megatron-core's and Megatron-Bridge's published conventions, independently of
refitd's own mapping (src/refit/megatron_source.cc), so that the tests check one against the
other:

- megatron/core/transformer/attention.py (SelfAttention.get_query_key_value_tensors): the
  output of `linear_qkv` is viewed as [num_query_groups_per_partition, (heads_per_group + 2) *
  head_dim] and split into the group's query heads, then one key and one value head; each TP
  rank holds num_query_groups / tp whole groups (ColumnParallelLinear along dim 0).
  Megatron-Bridge src/megatron/bridge/models/conversion/param_mapping.py (QKVMapping, its
  merge_qkv_weights) builds that interleaving from HF q/k/v_proj.
- megatron/core/transformer/mlp.py (gated linear unit): `linear_fc1`'s output is chunked in two,
  act(first) * second, per TP rank: rank r holds [gate_proj shard r; up_proj shard r]
  (param_mapping.py GatedMLPMapping).
- ColumnParallelLinear / VocabParallelEmbedding split dim 0 in tp equal parts, RowParallelLinear
  (`linear_proj`, `linear_fc2`) dim 1; norms and the MoE router are replicated on every TP rank
  (param_mapping.py ColumnParallelMapping, RowParallelMapping, ReplicatedMapping).
- TELayerNormColumnParallelLinear fuses the preceding norm into the linear: `linear_qkv.
  layer_norm_weight` = input_layernorm, `linear_fc1.layer_norm_weight` = post_attention_layernorm
  (dense layers); MoE layers keep a separate `pre_mlp_layernorm`.
- megatron/training/tokenizer/tokenizer.py (_vocab_size_with_padding): the vocabulary is padded
  to a multiple of make_vocab_size_divisible_by * tp with extra (zero here) rows.
- megatron/core/transformer/transformer_layer.py (get_transformer_layer_offset): pipeline stage
  s of pp holds layers [s * L / pp, (s + 1) * L / pp), numbered from 0 locally; the embedding is
  on the first stage, final_layernorm and output_layer on the last.
- megatron/core/transformer/moe/moe_layer.py (local_expert_indices): EP rank e holds global
  experts [e * n_local, (e + 1) * n_local) as mlp.experts.local_experts.{0..n_local-1};
  megatron/core/transformer/moe/experts.py (SequentialMLP) gives each its linear_fc1/fc2, split
  by the expert tensor-parallel size like the dense MLP.
"""
import torch


def pad_rows(t, rows):
    if t.shape[0] == rows:
        return t
    return torch.cat([t, torch.zeros((rows - t.shape[0],) + tuple(t.shape[1:]), dtype=t.dtype)])


def padded_vocab(vocab, divisible_by, tp):
    multiple = divisible_by * tp
    return ((vocab + multiple - 1) // multiple) * multiple


def megatron_chunk(hf, *, layers, heads, groups, head_dim, tp, tp_rank, pp, pp_rank, ep=1, ep_rank=0,
                   experts=0, divisible_by=96):
    """{local Megatron-core name: this rank's tensor} for one model chunk."""
    out = {}
    per_stage = layers // pp
    first = pp_rank * per_stage
    qpg = heads // groups
    vocab_rows = padded_vocab(hf["model.embed_tokens.weight"].shape[0], divisible_by, tp)
    if pp_rank == 0:
        out["embedding.word_embeddings.weight"] = pad_rows(hf["model.embed_tokens.weight"], vocab_rows).chunk(tp)[tp_rank]
    for local in range(per_stage):
        h = f"model.layers.{first + local}."
        m = f"decoder.layers.{local}."
        q, k, v = (hf[h + f"self_attn.{p}_proj.weight"] for p in "qkv")
        qkv = []
        for g in range(groups):
            qkv += [q[g * qpg * head_dim:(g + 1) * qpg * head_dim], k[g * head_dim:(g + 1) * head_dim],
                    v[g * head_dim:(g + 1) * head_dim]]
        out[m + "self_attention.linear_qkv.weight"] = torch.cat(qkv).chunk(tp)[tp_rank]
        out[m + "self_attention.linear_qkv.layer_norm_weight"] = hf[h + "input_layernorm.weight"]
        out[m + "self_attention.linear_proj.weight"] = hf[h + "self_attn.o_proj.weight"].chunk(tp, dim=1)[tp_rank]
        if h + "self_attn.q_norm.weight" in hf:
            out[m + "self_attention.q_layernorm.weight"] = hf[h + "self_attn.q_norm.weight"]
            out[m + "self_attention.k_layernorm.weight"] = hf[h + "self_attn.k_norm.weight"]
        if experts:
            out[m + "pre_mlp_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"]
            out[m + "mlp.router.weight"] = hf[h + "mlp.gate.weight"]
            local_count = experts // ep
            for i in range(local_count):
                e = h + f"mlp.experts.{ep_rank * local_count + i}."
                x = m + f"mlp.experts.local_experts.{i}."
                out[x + "linear_fc1.weight"] = torch.cat([hf[e + "gate_proj.weight"].chunk(tp)[tp_rank],
                                                          hf[e + "up_proj.weight"].chunk(tp)[tp_rank]])
                out[x + "linear_fc2.weight"] = hf[e + "down_proj.weight"].chunk(tp, dim=1)[tp_rank]
        else:
            out[m + "mlp.linear_fc1.layer_norm_weight"] = hf[h + "post_attention_layernorm.weight"]
            out[m + "mlp.linear_fc1.weight"] = torch.cat([hf[h + "mlp.gate_proj.weight"].chunk(tp)[tp_rank],
                                                          hf[h + "mlp.up_proj.weight"].chunk(tp)[tp_rank]])
            out[m + "mlp.linear_fc2.weight"] = hf[h + "mlp.down_proj.weight"].chunk(tp, dim=1)[tp_rank]
    if pp_rank == pp - 1:
        out["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
        out["output_layer.weight"] = pad_rows(hf["lm_head.weight"], vocab_rows).chunk(tp)[tp_rank]
    return {n: t.contiguous() for n, t in out.items()}
