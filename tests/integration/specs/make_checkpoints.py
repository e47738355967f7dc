#!/usr/bin/env python3
"""Synthetic trainer checkpoints for the model families of deploy/models/, laid out from a model's
config.json.

Each family's checkpoint has the real model's tensor names, dtypes and structure (fused
candidates, experts, MLA projections, BMM-style experts, Gemma norms, an MTP layer), every shape
computed from the config. The config is the real model's (tests/models/<model>/config.json) with
the family's sizes overridden to small ones (SMALL below; --set overrides more), and is written
next to the weights as config.json: the spec's sizes come from it, as from a real checkpoint's.
Weights are deterministic pseudo-random BF16 values for a seed. Standard library only.

    make_checkpoints.py FAMILY OUT_DIR [--seed N] [--set KEY=JSON]...   (FAMILY: llama3, qwen3_moe,
                                                                        deepseek_v3, gpt_oss, qwen35,
                                                                        llama3_ct, deepseek_v3_absorbed,
                                                                        gpt_oss_trtllm, or all)
    make_checkpoints.py FAMILY OUT_DIR --real

--real lays the checkpoint out from the real model's config, unchanged, in shards of at most 5 GB
with model.safetensors.index.json as Hugging Face writes them, but writes only the headers: each
file is extended to its full size as a hole (sparse), so a DeepSeek-V3-sized checkpoint takes a
few megabytes of disk. Its tensors read as zeros; tools that read headers only (`refitctl spec
lint`) see the real model.
"""
import argparse
import copy
import json
import os
import random
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "golden"))
import st_io  # noqa: E402

MODELS = os.path.join(HERE, "..", "..", "models")

# family -> (the real model it is laid out from, the sizes its small test checkpoint overrides)
FAMILIES = {
    "llama3": ("Meta-Llama-3-8B", {
        "hidden_size": 512, "intermediate_size": 768, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256}),
    "qwen3_moe": ("Qwen3-30B-A3B", {
        "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 128, "num_experts": 4, "moe_intermediate_size": 128, "vocab_size": 256}),
    # q_lora_rank 2048: a fused q_a + kv_a of 2624 rows, whose block scales line up like the real 2112.
    "deepseek_v3": ("DeepSeek-V3", {
        "hidden_size": 256, "num_hidden_layers": 2, "first_k_dense_replace": 1, "num_nextn_predict_layers": 0,
        "q_lora_rank": 2048, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
        "v_head_dim": 128, "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 256,
        "moe_intermediate_size": 128, "n_routed_experts": 4, "n_shared_experts": 1, "vocab_size": 256}),
    "gpt_oss": ("gpt-oss-20b", {
        "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "num_local_experts": 4, "intermediate_size": 256, "vocab_size": 256,
        "layer_types": ["sliding_attention", "full_attention"]}),
    # gpt_oss_mxfp4_trtllm.yaml: sizes the TRT-LLM MXFP4 MoE pads (hidden 320 -> 512 rows and 10 ->
    # 16 blocks of 32; intermediate 192 -> 256, so gate/up's 384 rows -> 512).
    "gpt_oss_trtllm": ("gpt-oss-20b", {
        "hidden_size": 320, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "num_local_experts": 4, "intermediate_size": 192, "vocab_size": 256,
        "layer_types": ["sliding_attention", "full_attention"]}),
    # Layer 0 gated delta-net, layer 1 gated full attention, one MTP layer (in text_config).
    "qwen35": ("Qwen3.5-27B", {
        "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 128, "linear_num_key_heads": 2, "linear_key_head_dim": 64,
        "linear_num_value_heads": 4, "linear_value_head_dim": 64, "full_attention_interval": 2,
        "layer_types": ["linear_attention", "full_attention"], "mtp_num_hidden_layers": 1, "vocab_size": 256}),
}
# Families of another shipped spec for the same model: the same checkpoint (llama3_ct_fp8_dynamic.yaml,
# deepseek_v3_fp8_absorbed.yaml).
FAMILIES["llama3_ct"] = FAMILIES["llama3"]
FAMILIES["deepseek_v3_absorbed"] = FAMILIES["deepseek_v3"]

SHARD_BYTES = 5 * 10**9  # Hugging Face's default max_shard_size


class Builder:
    """Tensors by name; with shapes_only, their dtypes and shapes without bytes."""

    def __init__(self, seed, shapes_only=False):
        self.rng = random.Random(seed)
        self.shapes_only = shapes_only
        self.tensors = {}

    def bf16(self, name, shape, scale_exp=0x3C, center_one=False):
        """BF16 values of magnitude ~2^(2*scale_exp - 127 - 14 .. -7); norms centred on 1 if asked."""
        if self.shapes_only:
            self.tensors[name] = ("BF16", list(shape), None)
            return
        n = st_io.numel(shape)
        data = bytearray(self.rng.randbytes(2 * n))
        hi = data[1::2]
        if center_one:
            # 1.0 .. 1.99 with random sign of a small deviation: exponent 127 (0x3F80 | mantissa)
            table = bytes([0x3F] * 256)
            data[0::2] = bytes(b & 0x7F for b in data[0::2])
            data[0::2] = bytes((b | 0x80) for b in data[0::2])
            data[1::2] = hi.translate(table)
        else:
            table = bytes([(b & 0x80) | (scale_exp + (b & 0x03)) for b in range(256)])
            data[1::2] = hi.translate(table)
        self.tensors[name] = ("BF16", list(shape), bytes(data))

    def f32(self, name, shape, lo=0.5, hi=2.0):
        if self.shapes_only:
            self.tensors[name] = ("F32", list(shape), None)
            return
        n = st_io.numel(shape)
        vals = [self.rng.uniform(lo, hi) for _ in range(n)]
        self.tensors[name] = ("F32", list(shape), struct.pack(f"<{n}f", *vals))

    def norm(self, name, shape):
        self.bf16(name, shape, center_one=True)


def text(config):
    """The language model's sizes: text_config of a multimodal config, else the config itself."""
    return config.get("text_config", config)


def head_dim(c):
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def llama3(b, config, real):
    c = text(config)
    h, inter, vocab = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    q, kv = c["num_attention_heads"] * head_dim(c), c["num_key_value_heads"] * head_dim(c)
    b.bf16("model.embed_tokens.weight", [vocab, h])
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        b.norm(p + "input_layernorm.weight", [h])
        b.bf16(p + "self_attn.q_proj.weight", [q, h])
        b.bf16(p + "self_attn.k_proj.weight", [kv, h])
        b.bf16(p + "self_attn.v_proj.weight", [kv, h])
        b.bf16(p + "self_attn.o_proj.weight", [h, q])
        b.norm(p + "post_attention_layernorm.weight", [h])
        b.bf16(p + "mlp.gate_proj.weight", [inter, h])
        b.bf16(p + "mlp.up_proj.weight", [inter, h])
        b.bf16(p + "mlp.down_proj.weight", [h, inter])
    b.norm("model.norm.weight", [h])
    b.bf16("lm_head.weight", [vocab, h])


def qwen3_moe(b, config, real):
    """The small checkpoint also carries ModelOpt's calibrated input scales (refits never carry
    them: the engine keeps its own); a trainer's real checkpoint has none."""
    c = text(config)
    h, hd, experts, inter, vocab = (c["hidden_size"], head_dim(c), c["num_experts"], c["moe_intermediate_size"],
                                    c["vocab_size"])
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    b.bf16("model.embed_tokens.weight", [vocab, h])
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        b.norm(p + "input_layernorm.weight", [h])
        b.bf16(p + "self_attn.q_proj.weight", [q, h])
        b.bf16(p + "self_attn.k_proj.weight", [kv, h])
        b.bf16(p + "self_attn.v_proj.weight", [kv, h])
        b.bf16(p + "self_attn.o_proj.weight", [h, q])
        b.norm(p + "self_attn.q_norm.weight", [hd])
        b.norm(p + "self_attn.k_norm.weight", [hd])
        b.norm(p + "post_attention_layernorm.weight", [h])
        b.bf16(p + "mlp.gate.weight", [experts, h])
        for e in range(experts):
            ep = p + f"mlp.experts.{e}."
            b.bf16(ep + "gate_proj.weight", [inter, h])
            b.bf16(ep + "up_proj.weight", [inter, h])
            b.bf16(ep + "down_proj.weight", [h, inter])
            if not real:
                for m in ("gate", "up", "down"):
                    b.f32(ep + f"{m}_proj.input_scale", [])
    b.norm("model.norm.weight", [h])
    b.bf16("lm_head.weight", [vocab, h])


def deepseek_v3(b, config, real):
    c = text(config)
    h, q_lora, kv_lora, rope, heads = (c["hidden_size"], c["q_lora_rank"], c["kv_lora_rank"], c["qk_rope_head_dim"],
                                       c["num_attention_heads"])
    nope, v, inter, moe_inter = c["qk_nope_head_dim"], c["v_head_dim"], c["intermediate_size"], c["moe_intermediate_size"]
    experts, shared, vocab = c["n_routed_experts"], c["n_shared_experts"], c["vocab_size"]
    layers, mtp = c["num_hidden_layers"], c.get("num_nextn_predict_layers", 0)
    b.bf16("model.embed_tokens.weight", [vocab, h])
    for l in range(layers + mtp):
        p = f"model.layers.{l}."
        if l >= layers:  # a multi-token-prediction layer, numbered after the last one
            b.bf16(p + "embed_tokens.weight", [vocab, h])
            b.norm(p + "enorm.weight", [h])
            b.norm(p + "hnorm.weight", [h])
            b.bf16(p + "eh_proj.weight", [h, 2 * h])
            b.norm(p + "shared_head.norm.weight", [h])
            b.bf16(p + "shared_head.head.weight", [vocab, h])
        b.norm(p + "input_layernorm.weight", [h])
        b.bf16(p + "self_attn.q_a_proj.weight", [q_lora, h])
        b.norm(p + "self_attn.q_a_layernorm.weight", [q_lora])
        b.bf16(p + "self_attn.q_b_proj.weight", [heads * (nope + rope), q_lora])
        b.bf16(p + "self_attn.kv_a_proj_with_mqa.weight", [kv_lora + rope, h])
        b.norm(p + "self_attn.kv_a_layernorm.weight", [kv_lora])
        b.bf16(p + "self_attn.kv_b_proj.weight", [heads * (nope + v), kv_lora])
        b.bf16(p + "self_attn.o_proj.weight", [h, heads * v])
        b.norm(p + "post_attention_layernorm.weight", [h])
        if l < c["first_k_dense_replace"]:
            b.bf16(p + "mlp.gate_proj.weight", [inter, h])
            b.bf16(p + "mlp.up_proj.weight", [inter, h])
            b.bf16(p + "mlp.down_proj.weight", [h, inter])
            continue
        b.bf16(p + "mlp.gate.weight", [experts, h])
        b.f32(p + "mlp.gate.e_score_correction_bias", [experts], -0.1, 0.1)
        for e in range(experts):
            ep = p + f"mlp.experts.{e}."
            b.bf16(ep + "gate_proj.weight", [moe_inter, h])
            b.bf16(ep + "up_proj.weight", [moe_inter, h])
            b.bf16(ep + "down_proj.weight", [h, moe_inter])
        b.bf16(p + "mlp.shared_experts.gate_proj.weight", [shared * moe_inter, h])
        b.bf16(p + "mlp.shared_experts.up_proj.weight", [shared * moe_inter, h])
        b.bf16(p + "mlp.shared_experts.down_proj.weight", [h, shared * moe_inter])
    b.norm("model.norm.weight", [h])
    b.bf16("lm_head.weight", [vocab, h])


def gpt_oss(b, config, real):
    c = text(config)
    h, heads, kv_heads, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], head_dim(c)
    experts, inter, vocab = c["num_local_experts"], c["intermediate_size"], c["vocab_size"]
    b.bf16("model.embed_tokens.weight", [vocab, h])
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        b.norm(p + "input_layernorm.weight", [h])
        b.bf16(p + "self_attn.q_proj.weight", [heads * hd, h])
        b.bf16(p + "self_attn.q_proj.bias", [heads * hd])
        b.bf16(p + "self_attn.k_proj.weight", [kv_heads * hd, h])
        b.bf16(p + "self_attn.k_proj.bias", [kv_heads * hd])
        b.bf16(p + "self_attn.v_proj.weight", [kv_heads * hd, h])
        b.bf16(p + "self_attn.v_proj.bias", [kv_heads * hd])
        b.bf16(p + "self_attn.o_proj.weight", [h, heads * hd])
        b.bf16(p + "self_attn.o_proj.bias", [h])
        b.bf16(p + "self_attn.sinks", [heads])
        b.norm(p + "post_attention_layernorm.weight", [h])
        b.bf16(p + "mlp.router.weight", [experts, h])
        b.bf16(p + "mlp.router.bias", [experts])
        # BMM-style experts as HF's bf16 GptOss stores them: [E, in, out], gate/up interleaved.
        b.bf16(p + "mlp.experts.gate_up_proj", [experts, h, 2 * inter])
        b.bf16(p + "mlp.experts.gate_up_proj_bias", [experts, 2 * inter])
        b.bf16(p + "mlp.experts.down_proj", [experts, inter, h])
        b.bf16(p + "mlp.experts.down_proj_bias", [experts, h])
    b.norm("model.norm.weight", [h])
    b.bf16("lm_head.weight", [vocab, h])


def qwen35(b, config, real):
    """Gated delta-net layers' input projection: the small checkpoint holds it fused as
    in_proj_qkvz / in_proj_ba (the Qwen3-Next layout refitd's Megatron-core mapping targets), the
    real one split as Qwen3.5 was released (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a)."""
    c = text(config)
    h, inter, vocab, heads, hd = c["hidden_size"], c["intermediate_size"], c["vocab_size"], \
        c["num_attention_heads"], head_dim(c)
    kv = c["num_key_value_heads"] * hd
    kh, kd, vh, vd = (c["linear_num_key_heads"], c["linear_key_head_dim"], c["linear_num_value_heads"],
                      c["linear_value_head_dim"])
    conv = c.get("linear_conv_kernel_dim", 4)

    def gemma_norm(name, shape):  # zero-centred: the engine adds 1
        b.bf16(name, shape, scale_exp=0x3C)

    def full_attention(p):
        b.bf16(p + "self_attn.q_proj.weight", [2 * heads * hd, h])  # query and output gate
        b.bf16(p + "self_attn.k_proj.weight", [kv, h])
        b.bf16(p + "self_attn.v_proj.weight", [kv, h])
        b.bf16(p + "self_attn.o_proj.weight", [h, heads * hd])
        gemma_norm(p + "self_attn.q_norm.weight", [hd])
        gemma_norm(p + "self_attn.k_norm.weight", [hd])

    def linear_attention(p):
        if real:
            b.bf16(p + "linear_attn.in_proj_qkv.weight", [2 * kh * kd + vh * vd, h])
            b.bf16(p + "linear_attn.in_proj_z.weight", [vh * vd, h])
            b.bf16(p + "linear_attn.in_proj_b.weight", [vh, h])
            b.bf16(p + "linear_attn.in_proj_a.weight", [vh, h])
        else:
            b.bf16(p + "linear_attn.in_proj_qkvz.weight", [2 * kh * kd + 2 * vh * vd, h])
            b.bf16(p + "linear_attn.in_proj_ba.weight", [2 * vh, h])
        b.bf16(p + "linear_attn.conv1d.weight", [2 * kh * kd + vh * vd, 1, conv])
        b.f32(p + "linear_attn.A_log", [vh], -1.0, 1.0)
        b.bf16(p + "linear_attn.dt_bias", [vh])
        b.norm(p + "linear_attn.norm.weight", [vd])
        b.bf16(p + "linear_attn.out_proj.weight", [h, vh * vd])

    def mlp(p):
        b.bf16(p + "mlp.gate_proj.weight", [inter, h])
        b.bf16(p + "mlp.up_proj.weight", [inter, h])
        b.bf16(p + "mlp.down_proj.weight", [h, inter])

    b.bf16("model.embed_tokens.weight", [vocab, h])
    for l, kind in enumerate(c["layer_types"][:c["num_hidden_layers"]]):
        p = f"model.layers.{l}."
        gemma_norm(p + "input_layernorm.weight", [h])
        if kind == "linear_attention":
            linear_attention(p)
        else:
            full_attention(p)
        gemma_norm(p + "post_attention_layernorm.weight", [h])
        mlp(p)
    gemma_norm("model.norm.weight", [h])
    b.bf16("lm_head.weight", [vocab, h])
    # Multi-token-prediction draft layers.
    b.bf16("mtp.fc.weight", [h, 2 * h])
    gemma_norm("mtp.pre_fc_norm_embedding.weight", [h])
    gemma_norm("mtp.pre_fc_norm_hidden.weight", [h])
    for l in range(c.get("mtp_num_hidden_layers", 1)):
        p = f"mtp.layers.{l}."
        gemma_norm(p + "input_layernorm.weight", [h])
        full_attention(p)
        gemma_norm(p + "post_attention_layernorm.weight", [h])
        mlp(p)
    gemma_norm("mtp.norm.weight", [h])


BUILDERS = {"llama3": llama3, "qwen3_moe": qwen3_moe, "deepseek_v3": deepseek_v3, "gpt_oss": gpt_oss,
            "qwen35": qwen35, "llama3_ct": llama3, "deepseek_v3_absorbed": deepseek_v3, "gpt_oss_trtllm": gpt_oss}


def real_config(family):
    with open(os.path.join(MODELS, FAMILIES[family][0], "config.json")) as f:
        return json.load(f)


def family_config(family, overrides=None, real=False):
    """The config a family's checkpoint is laid out from: the real model's, with the family's
    small sizes (unless real) and `overrides` set where the model's sizes live (text_config for
    a multimodal config)."""
    config = copy.deepcopy(real_config(family))
    sizes = text(config)
    if not real:
        sizes.update(FAMILIES[family][1])
    sizes.update(overrides or {})
    return config


def write_sparse(out_dir, tensors):
    """Headers only, each file extended to its full size as a hole; shards of at most
    SHARD_BYTES in the builder's (module) order, with model.safetensors.index.json."""
    shards, current, size = [], [], 0
    for name, (dtype, shape, _) in tensors.items():
        n = st_io.numel(shape) * st_io.DTYPE_SIZES[dtype]
        if current and size + n > SHARD_BYTES:
            shards.append(current)
            current, size = [], 0
        current.append((name, dtype, shape, n))
        size += n
    shards.append(current)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name, dtype, shape, n in sorted(shard):
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
            offset += n
            weight_map[name] = file
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * ((8 - len(blob) % 8) % 8)
        with open(os.path.join(out_dir, file), "wb") as f:
            f.write(struct.pack("<Q", len(blob)) + blob)
            f.truncate(8 + len(blob) + offset)
        total += offset
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)


def make(family, out_dir, seed=0, overrides=None, real=False):
    config = family_config(family, overrides, real)
    b = Builder(f"{family}:{seed}", shapes_only=real)
    BUILDERS[family](b, config, real)
    os.makedirs(out_dir, exist_ok=True)
    if real:
        write_sparse(out_dir, b.tensors)
    else:
        st_io.write(os.path.join(out_dir, "model.safetensors"), b.tensors, {"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    return out_dir


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("family", choices=[*FAMILIES, "all"])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                    help="a config size to override besides the family's small ones (e.g. num_experts=8)")
    ap.add_argument("--real", action="store_true",
                    help="the real model's sizes, headers only (sparse files, sharded as Hugging Face does)")
    args = ap.parse_args()
    overrides = {}
    for kv in args.set:
        key, _, value = kv.partition("=")
        overrides[key] = json.loads(value)
    families = list(FAMILIES) if args.family == "all" else [args.family]
    for fam in families:
        make(fam, os.path.join(args.out_dir, fam) if args.family == "all" else args.out_dir, args.seed, overrides,
             args.real)


if __name__ == "__main__":
    main()
