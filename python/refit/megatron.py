"""A Megatron-core model chunk's `named_parameters()`, pushed as they are by every rank.

    import refit, refit.megatron
    from megatron.core import parallel_state as ps

    shards = refit.megatron.shards(
        model_chunk.named_parameters(),
        tp_rank=ps.get_tensor_model_parallel_rank(), tp_size=ps.get_tensor_model_parallel_world_size(),
        layer_offset=first_layer_of_this_pp_stage,           # e.g. get_transformer_layer_offset(config)
        ep_rank=ps.get_expert_model_parallel_rank(), num_local_experts=config.num_moe_experts // ep_size,
        named_buffers=model_chunk.named_buffers())           # MoE routers' expert_bias
    report = refit.distributed.refit(model_parallel_group, client, "my-model", shards)

refitd maps the Megatron-core names and layouts to the checkpoint's (the model spec's `source:
{layout: megatron, ...}` section: grouped-query `linear_qkv`, `linear_fc1` = [gate; up] per TP
rank, fused layer norms, padded vocabulary, MLA projections, shared experts, gpt-oss's stacked
experts, Qwen3-Next / Qwen3.5 gated attention, gated delta-net and MTP layers; docs/config.md). This module only says, per tensor,
what Megatron-core's own conventions say and refitd cannot see:

- its tensor-parallel shard, as a `Shard` along Megatron's partition dimension (dim 0 for the
  column-parallel `linear_qkv`, `linear_fc1`, `word_embeddings` and `output_layer`; dim 1 for the
  row-parallel `linear_proj` and `linear_fc2`; a parameter's own `partition_dim` attribute, as
  Megatron-core sets it, wins): start = tp_rank * local rows, full shape = tp_size times as long;
- global layer and expert numbers: `decoder.layers.{l}` -> `l + layer_offset` (the pipeline
  stage's first layer), `local_experts.{e}` / grouped-GEMM `weight{e}` -> `e + ep_rank *
  num_local_experts`;
- who pushes a replicated tensor: tensor-parallel replicas (layer norms, the router, the final
  norm) are pushed by tp rank 0 only, and non-expert tensors by ep rank 0 only (expert-parallel
  ranks hold copies of them), so every checkpoint tensor arrives exactly once. Expert tensors
  are split by the expert tensor-parallel size (`etp_rank`/`etp_size`, default the TP ones) and
  pushed by expert data-parallel rank 0 (`edp_rank`) only.

Pass the model-parallel group (every TP x PP x EP rank of ONE data-parallel replica) to
refit.distributed.refit; other data-parallel replicas do not push.
"""
from __future__ import annotations

import re
from typing import Iterable, Optional

from .distributed import Shard

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
_LOCAL_EXPERT = re.compile(r"\.mlp\.experts\.local_experts\.(\d+)\.")
_GROUPED_EXPERT = re.compile(r"\.mlp\.experts\.(linear_fc[12])\.(weight|bias)(\d+)$")
_DIM0 = ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias", "linear_fc1.weight",
         "linear_fc1.bias", "embedding.word_embeddings.weight", "output_layer.weight",
         # MLA's column-parallel up projections (its down projections are replicated under TE,
         # column-parallel under the local spec: their partition_dim attribute says which)
         "self_attention.linear_q_up_proj.weight", "self_attention.linear_kv_up_proj.weight",
         "self_attention.linear_q_proj.weight",
         # gpt-oss attention sinks: one per head
         "self_attention.core_attention.softmax_offset",
         # Qwen3-Next / Qwen3.5 gated delta-net (per TP rank its heads' parts of each) and MTP
         "self_attention.in_proj.weight", "self_attention.conv1d.weight", "self_attention.A_log",
         "self_attention.dt_bias", "eh_proj.weight")
_DIM1 = ("self_attention.linear_proj.weight", "linear_fc2.weight", "self_attention.out_proj.weight")
# Buffers that are checkpoint tensors (the rest of named_buffers() is runtime state).
_BUFFERS = ("mlp.router.expert_bias",)


def partition_dim(name: str, param=None) -> Optional[int]:
    """Megatron-core's tensor-parallel partition dimension of `name`, None when replicated."""
    if param is not None and hasattr(param, "tensor_model_parallel"):
        # conv1d, A_log and dt_bias of a gated delta-net carry tensor_model_parallel alone (dim 0)
        return int(getattr(param, "partition_dim", 0)) if getattr(param, "tensor_model_parallel") else None
    grouped = _GROUPED_EXPERT.search(name)
    if grouped:
        if grouped.group(1) == "linear_fc1":
            return 0
        return 1 if grouped.group(2) == "weight" else None  # a row-parallel bias is whole
    if name.endswith(_DIM0):
        return 0
    if name.endswith(_DIM1):
        return 1
    return None


def is_expert(name: str) -> bool:
    return bool(_LOCAL_EXPERT.search(name) or _GROUPED_EXPERT.search(name))


def global_name(name: str, layer_offset: int = 0, expert_offset: int = 0) -> str:
    """`name` without "module." wrappers, with global layer and expert numbers."""
    while name.startswith("module."):
        name = name[len("module."):]
    name = _LAYER.sub(lambda m: f"decoder.layers.{int(m.group(1)) + layer_offset}.", name)
    name = _LOCAL_EXPERT.sub(lambda m: f".mlp.experts.local_experts.{int(m.group(1)) + expert_offset}.", name)
    return _GROUPED_EXPERT.sub(
        lambda m: f".mlp.experts.{m.group(1)}.{m.group(2)}{int(m.group(3)) + expert_offset}", name)


def shards(named_parameters: Iterable, *, tp_rank: int = 0, tp_size: int = 1, layer_offset: int = 0,
           ep_rank: int = 0, num_local_experts: int = 0, etp_rank: Optional[int] = None,
           etp_size: Optional[int] = None, edp_rank: int = 0, named_buffers: Optional[Iterable] = None,
           pp_rank: Optional[int] = None) -> dict:
    """name -> tensor or Shard for refit.distributed.refit: this rank's part of the refit.

    `named_buffers` (the chunk's named_buffers()): the buffers that are checkpoint tensors are
    taken from it (the MoE router's `expert_bias`, DeepSeek-V3's e_score_correction_bias); the
    others are runtime state and left out. `edp_rank`: the expert data-parallel rank inside the
    model-parallel group (an expert tensor-parallel size below the TP size leaves several copies
    of each expert there, e.g. TP 2 with expert TP 1); only edp rank 0 pushes experts. `pp_rank`:
    given and not 0, the stage's embedding.word_embeddings.weight is a copy of the first stage's
    (Megatron-core builds one on the last stage for MTP layers, or for a tied output layer) and
    is left out."""
    etp_rank = tp_rank if etp_rank is None else etp_rank
    etp_size = tp_size if etp_size is None else etp_size
    named = list(named_parameters)
    if named_buffers is not None:
        named += [(n, b) for n, b in named_buffers if n.endswith(_BUFFERS)]
    out = {}
    for name, param in named:
        expert = is_expert(name)
        rank, size = (etp_rank, etp_size) if expert else (tp_rank, tp_size)
        if not expert and ep_rank != 0:
            continue  # a copy: ep rank 0 pushes it
        if expert and edp_rank != 0:
            continue  # a copy: expert data-parallel rank 0 pushes it
        dim = partition_dim(name, param)
        tensor = param.detach() if hasattr(param, "detach") else param
        key = global_name(name, layer_offset, ep_rank * num_local_experts)
        if pp_rank and key == "embedding.word_embeddings.weight":
            continue  # the first stage pushes it
        if dim is None or size == 1:
            if rank == 0:
                out[key] = tensor
            continue
        out[key] = Shard.even(tensor, dim=dim, index=rank, count=size)
    return out
