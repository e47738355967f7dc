#!/usr/bin/env python3
"""A synthetic Llama-shaped BF16 checkpoint of a chosen size, for `refitctl convert` benchmarks.

    make_bf16_checkpoint.py OUT_DIR --gb 6 [--hidden 4096] [--intermediate 14336] [--shard-gb 2]

Writes HF-style shards (model-0000i-of-0000N.safetensors + model.safetensors.index.json) of
layers model.layers.{L}.{self_attn.{q,k,v,o}_proj,mlp.{gate,up,down}_proj,input_layernorm,
post_attention_layernorm}.weight until about --gb GB, plus embeddings and the final norm.
Values are finite pseudo-random BF16 of magnitude ~2^-6 (every exponent in a small range), so
every format's quantizer accepts them. Standard library only; one tensor in memory at a time.
Matches deploy/models/llama3_fp8.yaml's names.
"""
import argparse
import json
import os
import struct

# High byte of a BF16: sign kept, exponent 0x78..0x7B (about 2^-7 .. 2^-4 after the low bit).
HIGH = bytes([(b & 0x80) | (0x3C + (b & 0x03)) for b in range(256)])


def bf16_bytes(n):
    data = bytearray(os.urandom(2 * n))
    data[1::2] = bytes(data[1::2]).translate(HIGH)
    return data


def tensors(hidden, inter, layers, vocab):
    kv = hidden // 4
    yield "model.embed_tokens.weight", [vocab, hidden]
    for l in range(layers):
        p = f"model.layers.{l}"
        yield f"{p}.input_layernorm.weight", [hidden]
        yield f"{p}.self_attn.q_proj.weight", [hidden, hidden]
        yield f"{p}.self_attn.k_proj.weight", [kv, hidden]
        yield f"{p}.self_attn.v_proj.weight", [kv, hidden]
        yield f"{p}.self_attn.o_proj.weight", [hidden, hidden]
        yield f"{p}.post_attention_layernorm.weight", [hidden]
        yield f"{p}.mlp.gate_proj.weight", [inter, hidden]
        yield f"{p}.mlp.up_proj.weight", [inter, hidden]
        yield f"{p}.mlp.down_proj.weight", [hidden, inter]
    yield "model.norm.weight", [hidden]


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def write_shard(path, items):
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in items:
        n = 2 * numel(shape)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * ((8 - len(blob) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for _, shape in items:
            f.write(bf16_bytes(numel(shape)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--gb", type=float, default=6.0)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--intermediate", type=int, default=14336)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--shard-gb", type=float, default=2.0)
    a = ap.parse_args()
    per_layer = 2 * (2 * a.hidden * a.hidden + 2 * (a.hidden // 4) * a.hidden + 3 * a.intermediate * a.hidden)
    fixed = 2 * a.vocab * a.hidden
    layers = max(1, int((a.gb * 1e9 - fixed) // per_layer))
    os.makedirs(a.out, exist_ok=True)
    shards, cur, size = [], [], 0
    for name, shape in tensors(a.hidden, a.intermediate, layers, a.vocab):
        n = 2 * numel(shape)
        if cur and size + n > a.shard_gb * 1e9:
            shards.append(cur)
            cur, size = [], 0
        cur.append((name, shape))
        size += n
    shards.append(cur)
    weight_map, total = {}, 0
    for i, items in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        write_shard(os.path.join(a.out, file), items)
        for name, shape in items:
            weight_map[name] = file
            total += 2 * numel(shape)
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    print(json.dumps({"layers": layers, "tensors": len(weight_map), "bytes": total, "shards": len(shards)}))


if __name__ == "__main__":
    main()
