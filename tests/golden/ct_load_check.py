#!/usr/bin/env python3
"""Checks `refitctl convert`'s compressed-tensors checkpoints against the compressed-tensors package.

For each ct_* format it converts a small BF16 checkpoint (two attention projections, an MLP
projection, a norm and an lm_head the spec leaves alone) and then
  1. loads the output directory with the package's own model-free decompressor
     (`CompressedTensorsDequantizer(out_dir).validate(tensors)`: it reads config.json's
     quantization_config, finds every compressed module from the config groups, decompresses it
     and fails on any qparam it did not consume);
  2. checks that every decompressed weight equals the package's decompression of the package's
     own compression of the input, and that every tensor refitd wrote equals, byte for byte, what
     the package's compressors write (oracles_ct.compress).
Needs the oracle venv (torch, compressed-tensors; README.md "Regenerating"), so it is a manual
check, not a ctest. Usage: ct_load_check.py --refitctl build/tools/refitctl
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import (  # noqa: E402
    CompressedTensorsDequantizer,
)
from safetensors.torch import load_file, save_file  # noqa: E402

import oracles_ct  # noqa: E402

FORMATS = ["ct_fp8_channel", "ct_fp8_tensor", "ct_nvfp4", "ct_w4a16"]
SPEC = """model: ct-load-check
rules:
  - match: "model.layers.{{L}}.self_attn.{{p:q,k}}_proj.weight"
    format: {fmt}
  - match: "model.layers.{{L}}.mlp.down_proj.weight"
    format: {fmt}
"""


def inputs():
    g = torch.Generator().manual_seed(7)
    shapes = {"model.layers.0.self_attn.q_proj.weight": (256, 256),
              "model.layers.0.self_attn.k_proj.weight": (128, 256),
              "model.layers.0.mlp.down_proj.weight": (256, 512),
              "model.layers.0.input_layernorm.weight": (256,),
              "lm_head.weight": (64, 256)}
    return {n: (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16) for n, s in shapes.items()}


def check(refitctl, fmt, work):
    src, out = os.path.join(work, "in"), os.path.join(work, "out")
    os.makedirs(src)
    tensors = inputs()
    save_file(tensors, os.path.join(src, "model.safetensors"))
    with open(os.path.join(src, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"]}, f)
    spec = os.path.join(work, "spec.yaml")
    with open(spec, "w") as f:
        f.write(SPEC.format(fmt=fmt))
    subprocess.run([refitctl, "convert", "--spec", spec, src, out], check=True, capture_output=True)
    written = load_file(os.path.join(out, "model.safetensors"))
    decompressed = CompressedTensorsDequantizer(out).validate(dict(written))
    problems = []
    for name, w in tensors.items():
        module = name[: -len(".weight")]
        if w.dim() < 2 or module == "lm_head":
            if not torch.equal(decompressed[name], w):
                problems.append(f"{name}: not passed through unchanged")
            continue
        want = oracles_ct.compress(fmt, w)
        for param, t in want.items():
            got = written.get(f"{module}.{param}")
            if got is None or got.dtype != t.dtype or got.shape != t.shape or \
                    not torch.equal(got.view(torch.uint8) if got.dtype == torch.float8_e4m3fn else got,
                                    t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t):
                problems.append(f"{module}.{param}: differs from the package's compressor")
        scheme = oracles_ct.scheme_for(fmt)
        from compressed_tensors.compressors import BaseCompressor
        from compressed_tensors.compressors.format import infer_module_format
        scheme.format = infer_module_format(torch.nn.Linear, scheme)
        ref = BaseCompressor.get_value_from_registry(scheme.format).decompress(dict(want), scheme)["weight"]
        if not torch.equal(decompressed[name], ref.to(torch.bfloat16)):
            problems.append(f"{name}: decompressed weight differs from the package's round trip")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refitctl", required=True)
    args = ap.parse_args()
    failed = 0
    for fmt in FORMATS:
        with tempfile.TemporaryDirectory() as work:
            problems = check(os.path.abspath(args.refitctl), fmt, work)
        print(f"{fmt}: " + ("loads with the package's decompressor; bytes equal its compressors'" if not problems
                            else "; ".join(problems)))
        failed += bool(problems)
    print(f"ct_load_check: {len(FORMATS) - failed} passed, {failed} failed of {len(FORMATS)} formats")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
