#!/usr/bin/env python3
"""Tiny synthetic trainer checkpoints for the model families of deploy/models/.

Each checkpoint has the real family's tensor names, dtypes and structure (fused candidates,
experts, MLA projections, BMM-style experts, Gemma norms, an MTP layer) at reduced sizes, with
deterministic pseudo-random BF16 values for a seed. Standard library only.

    make_checkpoints.py FAMILY OUT_DIR [--seed N]     (FAMILY: llama3, qwen3_moe, deepseek_v3,
                                                       gpt_oss, qwen35, or all)
"""
import argparse
import json
import os
import random
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "golden"))
import st_io  # noqa: E402


class Builder:
    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.tensors = {}

    def bf16(self, name, shape, scale_exp=0x3C, center_one=False):
        """BF16 values of magnitude ~2^(2*scale_exp - 127 - 14 .. -7); norms centred on 1 if asked."""
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
        n = st_io.numel(shape)
        vals = [self.rng.uniform(lo, hi) for _ in range(n)]
        self.tensors[name] = ("F32", list(shape), struct.pack(f"<{n}f", *vals))

    def norm(self, name, shape):
        self.bf16(name, shape, center_one=True)


def llama3(b):
    h, q, kv, inter, vocab = 512, 512, 256, 768, 256
    b.bf16("model.embed_tokens.weight", [vocab, h])
    for l in range(2):
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


def qwen3_moe(b):
    h, q, kv, hd, experts, inter, vocab = 256, 256, 128, 128, 4, 128, 256
    b.bf16("model.embed_tokens.weight", [vocab, h])
    for l in range(2):
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
            for m in ("gate", "up", "down"):  # calibrated activation scales: the engine keeps them
                b.f32(ep + f"{m}_proj.input_scale", [])
    b.norm("model.norm.weight", [h])
    b.bf16("lm_head.weight", [vocab, h])


def deepseek_v3(b):
    h, q_lora, kv_lora, rope, heads, nope, v, inter, moe_inter, experts, vocab = \
        256, 2048, 512, 64, 2, 128, 128, 256, 128, 4, 256
    b.bf16("model.embed_tokens.weight", [vocab, h])
    for l in range(2):
        p = f"model.layers.{l}."
        b.norm(p + "input_layernorm.weight", [h])
        b.bf16(p + "self_attn.q_a_proj.weight", [q_lora, h])
        b.norm(p + "self_attn.q_a_layernorm.weight", [q_lora])
        b.bf16(p + "self_attn.q_b_proj.weight", [heads * (nope + rope), q_lora])
        b.bf16(p + "self_attn.kv_a_proj_with_mqa.weight", [kv_lora + rope, h])
        b.norm(p + "self_attn.kv_a_layernorm.weight", [kv_lora])
        b.bf16(p + "self_attn.kv_b_proj.weight", [heads * (nope + v), kv_lora])
        b.bf16(p + "self_attn.o_proj.weight", [h, heads * v])
        b.norm(p + "post_attention_layernorm.weight", [h])
        if l == 0:
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
        b.bf16(p + "mlp.shared_experts.gate_proj.weight", [moe_inter, h])
        b.bf16(p + "mlp.shared_experts.up_proj.weight", [moe_inter, h])
        b.bf16(p + "mlp.shared_experts.down_proj.weight", [h, moe_inter])
    b.norm("model.norm.weight", [h])
    b.bf16("lm_head.weight", [vocab, h])


def gpt_oss(b):
    h, heads, kv_heads, hd, experts, inter, vocab = 256, 4, 2, 64, 4, 256, 256
    b.bf16("model.embed_tokens.weight", [vocab, h])
    for l in range(2):
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


def qwen35(b):
    h, inter, vocab, heads, hd, kv = 256, 512, 256, 2, 128, 128

    def gemma_norm(name, shape):  # zero-centred: the engine adds 1
        b.bf16(name, shape, scale_exp=0x3C)

    def full_attention(p):
        b.bf16(p + "self_attn.q_proj.weight", [2 * heads * hd, h])  # query and output gate
        b.bf16(p + "self_attn.k_proj.weight", [kv, h])
        b.bf16(p + "self_attn.v_proj.weight", [kv, h])
        b.bf16(p + "self_attn.o_proj.weight", [h, heads * hd])
        gemma_norm(p + "self_attn.q_norm.weight", [hd])
        gemma_norm(p + "self_attn.k_norm.weight", [hd])

    def mlp(p):
        b.bf16(p + "mlp.gate_proj.weight", [inter, h])
        b.bf16(p + "mlp.up_proj.weight", [inter, h])
        b.bf16(p + "mlp.down_proj.weight", [h, inter])

    b.bf16("model.embed_tokens.weight", [vocab, h])
    for l in range(2):
        p = f"model.layers.{l}."
        gemma_norm(p + "input_layernorm.weight", [h])
        if l == 0:  # gated delta-net linear attention
            b.bf16(p + "linear_attn.in_proj_qkvz.weight", [768, h])
            b.bf16(p + "linear_attn.in_proj_ba.weight", [8, h])
            b.bf16(p + "linear_attn.conv1d.weight", [512, 1, 4])
            b.f32(p + "linear_attn.A_log", [4], -1.0, 1.0)
            b.bf16(p + "linear_attn.dt_bias", [4])
            b.norm(p + "linear_attn.norm.weight", [64])
            b.bf16(p + "linear_attn.out_proj.weight", [h, 256])
        else:
            full_attention(p)
        gemma_norm(p + "post_attention_layernorm.weight", [h])
        mlp(p)
    gemma_norm("model.norm.weight", [h])
    b.bf16("lm_head.weight", [vocab, h])
    # Multi-token-prediction draft layer.
    b.bf16("mtp.fc.weight", [h, 2 * h])
    gemma_norm("mtp.pre_fc_norm_embedding.weight", [h])
    gemma_norm("mtp.pre_fc_norm_hidden.weight", [h])
    gemma_norm("mtp.layers.0.input_layernorm.weight", [h])
    full_attention("mtp.layers.0.")
    gemma_norm("mtp.layers.0.post_attention_layernorm.weight", [h])
    mlp("mtp.layers.0.")
    gemma_norm("mtp.norm.weight", [h])


FAMILIES = {"llama3": llama3, "qwen3_moe": qwen3_moe, "deepseek_v3": deepseek_v3, "gpt_oss": gpt_oss,
            "qwen35": qwen35}


def make(family, out_dir, seed):
    b = Builder(f"{family}:{seed}")
    FAMILIES[family](b)
    os.makedirs(out_dir, exist_ok=True)
    st_io.write(os.path.join(out_dir, "model.safetensors"), b.tensors, {"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump({"model_family": family, "seed": seed, "torch_dtype": "bfloat16"}, f, indent=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("family", choices=[*FAMILIES, "all"])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    families = list(FAMILIES) if args.family == "all" else [args.family]
    for fam in families:
        make(fam, os.path.join(args.out_dir, fam) if args.family == "all" else args.out_dir, args.seed)


if __name__ == "__main__":
    main()
