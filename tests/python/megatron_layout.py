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


def _embedding_and_head(hf, out, *, tp, tp_rank, pp, pp_rank, divisible_by):
    vocab_rows = padded_vocab(hf["model.embed_tokens.weight"].shape[0], divisible_by, tp)
    if pp_rank == 0:
        out["embedding.word_embeddings.weight"] = pad_rows(hf["model.embed_tokens.weight"], vocab_rows).chunk(tp)[tp_rank]
    if pp_rank == pp - 1:
        out["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
        out["output_layer.weight"] = pad_rows(hf["lm_head.weight"], vocab_rows).chunk(tp)[tp_rank]


def _gated(gate, up, tp, tp_rank):
    """mlp.py: linear_fc1 of a gated MLP, per TP rank [gate shard; up shard]."""
    return torch.cat([gate.chunk(tp)[tp_rank], up.chunk(tp)[tp_rank]])


def deepseek_chunk(hf, *, layers, tp, tp_rank, pp, pp_rank, ep=1, ep_rank=0, experts=0, dense_layers=1,
                   divisible_by=96):
    """{local Megatron-core name: this rank's tensor} of a DeepSeek-V3 chunk under the
    Transformer Engine spec with qk_layernorm and grouped-GEMM experts, following:

    - megatron/core/transformer/multi_latent_attention.py (MLASelfAttention.__init__ and
      get_query_key_value_tensors): linear_q_down_proj [q_lora_rank, hidden] and
      linear_kv_down_proj [kv_lora_rank + qk_pos_emb_head_dim, hidden] are TELinear in
      parallel_mode "duplicated" (every TP rank holds them whole); linear_kv_down_proj's output is
      split [kv_lora_rank; rope] as HF kv_a_proj_with_mqa's. linear_q_up_proj [heads *
      (qk_head_dim + rope), q_lora_rank] and linear_kv_up_proj [heads * (qk_head_dim +
      v_head_dim), kv_lora_rank] are column-parallel, their outputs viewed per head
      [qk_head_dim; rope] / [qk_head_dim; v_head_dim] as HF q_b_proj / kv_b_proj are, so a TP
      rank holds heads [r * heads / tp, (r + 1) * heads / tp).
    - megatron/core/models/gpt/gpt_layer_specs.py (the TE MLA layer spec): with qk_layernorm the
      up projections are TELayerNormColumnParallelLinear: their layer_norm_weight is
      q_a_layernorm / kv_a_layernorm; input_layernorm stays a module of its own; dense layers fuse
      post_attention_layernorm into mlp.linear_fc1, MoE layers have pre_mlp_layernorm.
    - megatron/core/transformer/moe/shared_experts.py (SharedExpertMLP): an MLP of the layer's TP
      group, linear_fc1 = [gate; up] per TP rank, linear_fc2 row-parallel.
    - megatron/core/transformer/moe/router.py (TopKRouter): weight [experts, hidden] on every
      rank; expert_bias (moe_router_enable_expert_bias) a float32 buffer.
    - megatron/core/transformer/moe/experts.py (TEGroupedMLP): mlp.experts.linear_fc1.weight{i} /
      linear_fc2.weight{i} for local expert i.
    - Megatron-Bridge src/megatron/bridge/models/deepseek/common.py: the HF name of each.
    Layers before `dense_layers` (moe_layer_freq / first_k_dense_replace) are dense.
    """
    out = {}
    per_stage = layers // pp
    first = pp_rank * per_stage
    for local in range(per_stage):
        h = f"model.layers.{first + local}."
        m = f"decoder.layers.{local}."
        a = m + "self_attention."
        out[m + "input_layernorm.weight"] = hf[h + "input_layernorm.weight"]
        out[a + "linear_q_down_proj.weight"] = hf[h + "self_attn.q_a_proj.weight"]
        out[a + "linear_q_up_proj.layer_norm_weight"] = hf[h + "self_attn.q_a_layernorm.weight"]
        out[a + "linear_q_up_proj.weight"] = hf[h + "self_attn.q_b_proj.weight"].chunk(tp)[tp_rank]
        out[a + "linear_kv_down_proj.weight"] = hf[h + "self_attn.kv_a_proj_with_mqa.weight"]
        out[a + "linear_kv_up_proj.layer_norm_weight"] = hf[h + "self_attn.kv_a_layernorm.weight"]
        out[a + "linear_kv_up_proj.weight"] = hf[h + "self_attn.kv_b_proj.weight"].chunk(tp)[tp_rank]
        out[a + "linear_proj.weight"] = hf[h + "self_attn.o_proj.weight"].chunk(tp, dim=1)[tp_rank]
        if first + local < dense_layers:
            out[m + "mlp.linear_fc1.layer_norm_weight"] = hf[h + "post_attention_layernorm.weight"]
            out[m + "mlp.linear_fc1.weight"] = _gated(hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"], tp,
                                                      tp_rank)
            out[m + "mlp.linear_fc2.weight"] = hf[h + "mlp.down_proj.weight"].chunk(tp, dim=1)[tp_rank]
            continue
        out[m + "pre_mlp_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"]
        out[m + "mlp.router.weight"] = hf[h + "mlp.gate.weight"]
        out[m + "mlp.router.expert_bias"] = hf[h + "mlp.gate.e_score_correction_bias"]  # a buffer
        s = h + "mlp.shared_experts."
        out[m + "mlp.shared_experts.linear_fc1.weight"] = _gated(hf[s + "gate_proj.weight"], hf[s + "up_proj.weight"],
                                                                 tp, tp_rank)
        out[m + "mlp.shared_experts.linear_fc2.weight"] = hf[s + "down_proj.weight"].chunk(tp, dim=1)[tp_rank]
        local_count = experts // ep
        for i in range(local_count):
            e = h + f"mlp.experts.{ep_rank * local_count + i}."
            out[m + f"mlp.experts.linear_fc1.weight{i}"] = _gated(hf[e + "gate_proj.weight"], hf[e + "up_proj.weight"],
                                                                  tp, tp_rank)
            out[m + f"mlp.experts.linear_fc2.weight{i}"] = hf[e + "down_proj.weight"].chunk(tp, dim=1)[tp_rank]
    _embedding_and_head(hf, out, tp=tp, tp_rank=tp_rank, pp=pp, pp_rank=pp_rank, divisible_by=divisible_by)
    return {n: t.contiguous() for n, t in out.items()}


def gpt_oss_chunk(hf, *, layers, heads, groups, head_dim, tp, tp_rank, pp, pp_rank, ep=1, ep_rank=0, experts=0,
                  divisible_by=96):
    """{local Megatron-core name: this rank's tensor} of a gpt-oss chunk (TE spec, grouped-GEMM
    experts, expert tensor-parallel size 1), following Megatron-Bridge
    src/megatron/bridge/models/gpt_oss/gpt_oss_bridge.py (GPTOSSBridge.mapping_registry,
    GPTOSSMLPGateUpProjMapping, GPTOSSMLPDownProjMapping):

    - linear_qkv weight and bias grouped per query group as for any GQA model (QKVMapping);
      linear_proj.bias (add_bias_linear) is not split by TP;
    - the attention sinks are core_attention.softmax_offset (softmax_type "learnable"), one per
      head, split by TP like the heads (megatron/core/transformer/dot_product_attention.py);
    - the router keeps HF's mlp.router.weight and .bias;
    - expert e's linear_fc1.weight{e} is HF's gate_up_proj[e] ([hidden, 2I], gate and up columns
      alternating) transposed to [2I, hidden] with its even rows (gate) first, then its odd rows
      (up); linear_fc1.bias{e} likewise from gate_up_proj_bias[e]; linear_fc2.weight{e} is
      down_proj[e] ([I, hidden]) transposed, linear_fc2.bias{e} = down_proj_bias[e].
    """
    out = {}
    per_stage = layers // pp
    first = pp_rank * per_stage
    qpg = heads // groups

    def grouped(q, k, v):
        parts = []
        for g in range(groups):
            parts += [q[g * qpg * head_dim:(g + 1) * qpg * head_dim], k[g * head_dim:(g + 1) * head_dim],
                      v[g * head_dim:(g + 1) * head_dim]]
        return torch.cat(parts).chunk(tp)[tp_rank]

    def deinterleave(t):
        return torch.cat([t[0::2], t[1::2]])

    for local in range(per_stage):
        h = f"model.layers.{first + local}."
        m = f"decoder.layers.{local}."
        a = m + "self_attention."
        for w in ("weight", "bias"):
            out[a + f"linear_qkv.{w}"] = grouped(*(hf[h + f"self_attn.{p}_proj.{w}"] for p in "qkv"))
        out[a + "linear_qkv.layer_norm_weight"] = hf[h + "input_layernorm.weight"]
        out[a + "linear_proj.weight"] = hf[h + "self_attn.o_proj.weight"].chunk(tp, dim=1)[tp_rank]
        out[a + "linear_proj.bias"] = hf[h + "self_attn.o_proj.bias"]
        out[a + "core_attention.softmax_offset"] = hf[h + "self_attn.sinks"].chunk(tp)[tp_rank]
        out[m + "pre_mlp_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"]
        out[m + "mlp.router.weight"] = hf[h + "mlp.router.weight"]
        out[m + "mlp.router.bias"] = hf[h + "mlp.router.bias"]
        local_count = experts // ep
        x = h + "mlp.experts."
        for i in range(local_count):
            e = ep_rank * local_count + i
            out[m + f"mlp.experts.linear_fc1.weight{i}"] = deinterleave(hf[x + "gate_up_proj"][e].t())
            out[m + f"mlp.experts.linear_fc1.bias{i}"] = deinterleave(hf[x + "gate_up_proj_bias"][e])
            out[m + f"mlp.experts.linear_fc2.weight{i}"] = hf[x + "down_proj"][e].t()
            out[m + f"mlp.experts.linear_fc2.bias{i}"] = hf[x + "down_proj_bias"][e]
    _embedding_and_head(hf, out, tp=tp, tp_rank=tp_rank, pp=pp, pp_rank=pp_rank, divisible_by=divisible_by)
    return {n: t.contiguous() for n, t in out.items()}


def qwen35_chunk(hf, *, layers, heads, groups, head_dim, linear, tp, tp_rank, pp, pp_rank, divisible_by=96, **_):
    """{local Megatron-core name: this rank's tensor} of a Qwen3-Next / Qwen3.5 chunk (TE spec,
    dense MLPs as in make_checkpoints.py's qwen35; `linear`: the gated delta-net's num_key_heads,
    key_head_dim, num_value_heads, value_head_dim), following:

    - Megatron-Bridge src/megatron/bridge/models/qwen/qwen3_next_bridge.py (mapping_registry): the
      HF name of each Megatron-core tensor; its out_norm is RMSNorm2ZeroCenteredRMSNormMapping
      (Megatron-core's zero-centred out_norm = HF linear_attn.norm - 1).
    - megatron/core/ssm/gated_delta_net.py (GatedDeltaNet.__init__ / forward): in_proj is a
      column-parallel linear whose per-rank output is split [q; k; v; z; beta; alpha], q and k
      of the rank's key heads (key_head_dim each), v and z of its value heads, beta and alpha
      one per value head; conv1d (channels [q; k; v] of the rank's heads), A_log and dt_bias
      (one per value head) are split by TP the same way; out_proj is row-parallel. Value head j
      belongs to key head j // (num_value_heads / num_key_heads) (its repeat_interleave).
    - transformers models/qwen3_next/modeling_qwen3_next.py (Qwen3NextGatedDeltaNet.
      fix_query_key_value_ordering): in_proj_qkvz viewed [num_key_heads, 2 * key_head_dim + 2 *
      (value heads per key head) * value_head_dim] per key head [q; k; v; z], in_proj_ba viewed
      [num_key_heads, 2 * value heads per key head] per key head [b; a]; conv1d runs over
      cat(q, k, v) of all heads (Megatron-Bridge param_mapping.py GDNLinearMapping /
      GDNConv1dMapping do the same regrouping).
    - megatron/core/transformer/attention.py (get_query_key_value_tensors with
      attention_output_gate): linear_qkv per query group [q of its heads; gate of its heads; k;
      v]; HF q_proj (Qwen3NextAttention.forward) viewed [heads, 2 * head_dim] per head [q; gate].
    - megatron/core/transformer/multi_token_prediction.py: the MTP layer (on the last stage) is
      mtp.layers.0.{eh_proj (column-parallel), enorm, hnorm, final_layernorm} around
      mtp.layers.0.transformer_layer.*; megatron/core/models/gpt/gpt_model.py builds the word
      embedding on the MTP stage too (a copy of the first stage's).
    Full-attention layers are those with self_attn.* in `hf`, the others gated delta-net.
    """
    out = {}
    per_stage = layers // pp
    first = pp_rank * per_stage
    qpg = heads // groups
    nk, dk, nv, dv = (linear[k] for k in ("num_key_heads", "key_head_dim", "num_value_heads", "value_head_dim"))
    per_key = nv // nk

    def mine(t, dim=0):
        return t.chunk(tp, dim=dim)[tp_rank]

    def attention(h, m):
        a = m + "self_attention."
        q_and_gate = hf[h + "self_attn.q_proj.weight"].view(heads, 2, head_dim, -1)
        k = hf[h + "self_attn.k_proj.weight"].view(groups, head_dim, -1)
        v = hf[h + "self_attn.v_proj.weight"].view(groups, head_dim, -1)
        per_group = [torch.cat([q_and_gate[g * qpg:(g + 1) * qpg, 0].flatten(0, 1),
                                q_and_gate[g * qpg:(g + 1) * qpg, 1].flatten(0, 1), k[g], v[g]])
                     for g in range(groups)]
        out[a + "linear_qkv.weight"] = mine(torch.cat(per_group))
        out[a + "linear_qkv.layer_norm_weight"] = hf[h + "input_layernorm.weight"]
        out[a + "q_layernorm.weight"] = hf[h + "self_attn.q_norm.weight"]
        out[a + "k_layernorm.weight"] = hf[h + "self_attn.k_norm.weight"]
        out[a + "linear_proj.weight"] = mine(hf[h + "self_attn.o_proj.weight"], 1)

    def delta_net(h, m):
        a = m + "self_attention."
        x = h + "linear_attn."
        qkvz = hf[x + "in_proj_qkvz.weight"].view(nk, 2 * dk + 2 * per_key * dv, -1)
        q, k, v, z = torch.split(qkvz, [dk, dk, per_key * dv, per_key * dv], dim=1)
        b, al = torch.split(hf[x + "in_proj_ba.weight"].view(nk, 2 * per_key, -1), [per_key, per_key], dim=1)
        parts = [q, k, v, z, b, al]
        out[a + "in_proj.weight"] = torch.cat([mine(p.flatten(0, 1)) for p in parts])
        out[a + "in_proj.layer_norm_weight"] = hf[h + "input_layernorm.weight"]
        conv = torch.split(hf[x + "conv1d.weight"], [nk * dk, nk * dk, nv * dv])
        out[a + "conv1d.weight"] = torch.cat([mine(c) for c in conv])
        out[a + "A_log"] = mine(hf[x + "A_log"])
        out[a + "dt_bias"] = mine(hf[x + "dt_bias"])
        out[a + "out_norm.weight"] = (hf[x + "norm.weight"].float() - 1).to(hf[x + "norm.weight"].dtype)
        out[a + "out_proj.weight"] = mine(hf[x + "out_proj.weight"], 1)

    def mlp(h, m):
        out[m + "mlp.linear_fc1.layer_norm_weight"] = hf[h + "post_attention_layernorm.weight"]
        out[m + "mlp.linear_fc1.weight"] = _gated(hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"], tp, tp_rank)
        out[m + "mlp.linear_fc2.weight"] = mine(hf[h + "mlp.down_proj.weight"], 1)

    for local in range(per_stage):
        h = f"model.layers.{first + local}."
        m = f"decoder.layers.{local}."
        (attention if h + "self_attn.q_proj.weight" in hf else delta_net)(h, m)
        mlp(h, m)
    _embedding_and_head(hf, out, tp=tp, tp_rank=tp_rank, pp=pp, pp_rank=pp_rank, divisible_by=divisible_by)
    if pp_rank == pp - 1 and "mtp.fc.weight" in hf:
        if pp > 1:  # the MTP stage's copy of the word embedding
            vocab_rows = padded_vocab(hf["model.embed_tokens.weight"].shape[0], divisible_by, tp)
            out["embedding.word_embeddings.weight"] = mine(pad_rows(hf["model.embed_tokens.weight"], vocab_rows))
        out["mtp.layers.0.eh_proj.weight"] = mine(hf["mtp.fc.weight"])
        out["mtp.layers.0.enorm.weight"] = hf["mtp.pre_fc_norm_embedding.weight"]
        out["mtp.layers.0.hnorm.weight"] = hf["mtp.pre_fc_norm_hidden.weight"]
        out["mtp.layers.0.final_layernorm.weight"] = hf["mtp.norm.weight"]
        attention("mtp.layers.0.", "mtp.layers.0.transformer_layer.")
        mlp("mtp.layers.0.", "mtp.layers.0.transformer_layer.")
    return {n: t.contiguous() for n, t in out.items()}
