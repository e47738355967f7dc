#!/usr/bin/env python3
"""Regenerates tests/golden/data/: golden inputs and the oracle-computed expected outputs.

For each format F (fp8_block128, fp8_block128_ue8m0, mxfp8, nvfp4, nvfp4_te, mxfp4, and the
compressed-tensors formats ct_fp8_channel, ct_fp8_tensor, ct_nvfp4, ct_w4a16) it writes
  data/F.safetensors                      inputs  in.<case>            (BF16 / F32)
  data/F.expected.safetensors             outputs in.<case><suffix>    (as `refitctl quantize`
                                          --format F names them; tensors F cannot take are copied
                                          unchanged)
  data/F.round_to_bf16[.expected].safetensors   the same for `--fp32-input round_to_bf16`
  data/reject_F[_inf].safetensors         a NaN / -Inf input that the default policy rejects;
                                          metadata "bad_tensor" names the tensor the error must name
Expected bytes come only from the oracles in oracles.py (see README.md), never from refitd.

Needs the pinned packages of requirements.txt (a venv outside the repository). Deterministic:
re-running reproduces the committed files byte for byte; `--check` verifies exactly that.

`--formats F,G` regenerates (or checks) only those formats' files, and needs only their oracle
packages: `--formats ct_fp8_channel,ct_fp8_tensor,ct_nvfp4,ct_w4a16` needs torch and
compressed-tensors, nothing else.

Usage: make_goldens.py [--out DIR] [--check] [--allow-unpinned] [--formats F,G,...]
"""

import argparse
import functools
import importlib.metadata
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import st_io  # noqa: E402

PINS_FILE = os.path.join(HERE, "requirements.txt")


def pinned_versions():
    pins = {}
    with open(PINS_FILE) as f:
        for line in f:
            line = line.split("#")[0].strip()
            if "==" in line:
                name, version = line.split("==")
                pins[name.strip()] = version.strip()
    return pins


# The compressed-tensors formats' oracle (oracles_ct.py) needs only these pinned packages.
CT_FORMATS = ("ct_fp8_channel", "ct_fp8_tensor", "ct_nvfp4", "ct_w4a16")
CT_PACKAGES = ("torch", "compressed-tensors", "numpy")


def check_pins(allow_unpinned, selected):
    bad = []
    only_ct = all(f in CT_FORMATS for f in selected)
    for name, want in pinned_versions().items():
        if only_ct and name not in CT_PACKAGES:
            continue
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            have = None
        if have is None or have.split("+")[0] != want:
            bad.append(f"{name}: pinned {want}, installed {have}")
    if bad and not allow_unpinned:
        sys.exit("oracle versions differ from requirements.txt:\n  " + "\n  ".join(bad))
    for line in bad:
        print("warning:", line, file=sys.stderr)


def import_oracles():
    # ModelOpt's quantize() asks whether a TensorRT-LLM FP4 kernel could run before it checks
    # its arguments; on a machine without a GPU that query raises. Answer "no" so the pure-torch
    # path (the one FORMATS.md §6.2 describes) runs.
    from modelopt.torch.quantization.qtensor import nvfp4_tensor
    nvfp4_tensor.fp4_compatible = lambda: False
    import oracles
    oracles.TORCHAO_LOG2_CORNER_CASES.add("sat_ulp_above_f32")
    return oracles


def formats(oracles, cases):
    """name -> (case builder, oracle(tensor, case_name), K multiple the format needs).

    `oracles()` imports an oracle module on first use: ModelOpt/torchao ("oracles") or
    compressed-tensors ("ct"), so a run over some formats needs only their packages."""
    return {
        "fp8_block128": (cases.fp8_block128_cases, lambda t, case: oracles().fp8_block128(t), 1),
        "fp8_block128_ue8m0": (cases.fp8_block128_cases, lambda t, case: oracles().fp8_block128_ue8m0(t), 1),
        "mxfp8": (cases.mxfp8_cases, lambda t, case: oracles().mxfp8(t, case), 32),
        "nvfp4": (cases.nvfp4_cases, lambda t, case: oracles().nvfp4(t), 16),
        "nvfp4_te": (cases.nvfp4_te_cases, lambda t, case: oracles().nvfp4_te(t), 16),
        "mxfp4": (cases.mxfp4_cases, lambda t, case: oracles().mxfp4(t), 32),
        "ct_fp8_channel": (cases.ct_fp8_channel_cases, lambda t, case: oracles("ct").oracle("ct_fp8_channel")(t, case), 1),
        "ct_fp8_tensor": (cases.ct_fp8_tensor_cases, lambda t, case: oracles("ct").oracle("ct_fp8_tensor")(t, case), 1),
        "ct_nvfp4": (cases.ct_nvfp4_cases, lambda t, case: oracles("ct").oracle("ct_nvfp4")(t, case), 16),
        "ct_w4a16": (cases.ct_w4a16_cases, lambda t, case: oracles("ct").oracle("ct_w4a16")(t, case), 128),
    }


ORACLE_NAMES = {
    "fp8_block128": "DeepGEMM per_block_cast_to_fp8 (transcription)",
    "fp8_block128_ue8m0": "DeepGEMM per_block_cast_to_fp8 use_ue8m0 + SGLang requant (transcription)",
    "mxfp8": "torchao to_mx RCEIL; TE float_to_e8m0 transcription for sat_ulp_above_f32",
    "nvfp4": "nvidia-modelopt NVFP4QTensor.quantize",
    "nvfp4_te": "TE reference_nvfp4.py 1x16 (transcription), S_enc=1 when amax=0",
    "mxfp4": "triton_kernels downcast_to_mxfp_torch ROUND_UP (transcription)",
    "ct_fp8_channel": "compressed-tensors 0.20.0 FP8_DYNAMIC weights: calculate_qparams + compress_module",
    "ct_fp8_tensor": "compressed-tensors 0.20.0 FP8 weights: calculate_qparams + compress_module",
    "ct_nvfp4": "compressed-tensors 0.20.0 NVFP4A16: generate_gparam + calculate_qparams + compress_module",
    "ct_w4a16": "compressed-tensors 0.20.0 W4A16: calculate_qparams + compress_module",
}


ALL_FORMATS = list(ORACLE_NAMES)


def stored(torch, dtype, values):
    """(torch tensor as the file stores it, safetensors triple)."""
    if dtype == "BF16":
        t = values.to(torch.bfloat16)
        back = t.to(torch.float32)
        same = (back.view(torch.int32) == values.view(torch.int32)) | (back.isnan() & values.isnan())
        if not bool(same.all()):
            raise ValueError("a BF16 case holds a value bf16 cannot represent exactly")
        raw = t.contiguous().view(torch.int16).numpy().astype("<i2").tobytes()
    else:
        t = values.to(torch.float32)
        raw = t.contiguous().numpy().astype("<f4").tobytes()
    return t, (dtype, tuple(t.shape), raw)


def quantize_set(torch, case_list, oracle, k_multiple, round_to_bf16=False):
    inputs, expected = {}, {}
    for case, dtype, values in case_list:
        name = "in." + case
        if name in inputs:
            raise ValueError(f"duplicate case {case}")
        t, triple = stored(torch, dtype, values)
        inputs[name] = triple
        if t.dim() != 2 or t.shape[1] % k_multiple != 0:
            expected[name] = triple  # the format cannot take it: copied unchanged
            continue
        x = t.to(torch.bfloat16) if (round_to_bf16 and t.dtype == torch.float32) else t
        for suffix, out in oracle(x, case).items():
            expected[name + suffix] = out
    return inputs, expected


def generate(out_dir, selected):
    import torch
    import cases

    torch.set_flush_denormal(False)
    loaded = {}

    def oracles(which="oracles"):
        if which not in loaded:
            if which == "ct":
                import oracles_ct
                loaded[which] = oracles_ct
            else:
                loaded[which] = import_oracles()
        return loaded[which]

    os.makedirs(out_dir, exist_ok=True)
    written = []

    def write(fname, tensors, metadata):
        st_io.write(os.path.join(out_dir, fname), tensors, metadata)
        written.append(fname)

    for fmt, (builder, oracle, k_multiple) in formats(oracles, cases).items():
        if fmt not in selected:
            continue
        meta = {"format": fmt, "oracle": ORACLE_NAMES[fmt]}
        inputs, expected = quantize_set(torch, builder(), oracle, k_multiple)
        write(f"{fmt}.safetensors", inputs, {"format": fmt, "role": "input"})
        write(f"{fmt}.expected.safetensors", expected, dict(meta, role="expected"))

        k = max(64, k_multiple)
        inputs, expected = quantize_set(torch, cases.round_to_bf16_cases(k), oracle, k_multiple,
                                        round_to_bf16=True)
        write(f"{fmt}.round_to_bf16.safetensors", inputs,
              {"format": fmt, "role": "input", "fp32_input": "round_to_bf16"})
        write(f"{fmt}.round_to_bf16.expected.safetensors", expected,
              dict(meta, role="expected", fp32_input="round_to_bf16"))

        for tag, (case_list, bad) in cases.reject_cases(max(64, k_multiple)).items():
            inputs, _ = quantize_set(torch, case_list, lambda t, c: {}, 1)
            write(f"reject_{fmt}{tag}.safetensors", inputs,
                  {"format": fmt, "role": "reject", "bad_tensor": bad})
    return written


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(HERE, "data"))
    parser.add_argument("--check", action="store_true",
                        help="regenerate into a temporary folder and compare with --out")
    parser.add_argument("--allow-unpinned", action="store_true")
    parser.add_argument("--formats", help="comma-separated formats to generate (default: all)")
    args = parser.parse_args()
    every = ALL_FORMATS
    selected = args.formats.split(",") if args.formats else every
    unknown = sorted(set(selected) - set(every))
    if unknown:
        sys.exit(f"unknown formats: {', '.join(unknown)}")
    check_pins(args.allow_unpinned, selected)
    if not args.check:
        files = generate(args.out, selected)
        total = sum(os.path.getsize(os.path.join(args.out, f)) for f in files)
        print(f"wrote {len(files)} files, {total} bytes, to {args.out}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(tmp, selected)
        differ = []
        for f in files:
            with open(os.path.join(tmp, f), "rb") as a:
                fresh = a.read()
            path = os.path.join(args.out, f)
            old = open(path, "rb").read() if os.path.exists(path) else None
            if old != fresh:
                differ.append(f)
        mine = [f for f in os.listdir(args.out) if any(
            f.startswith(p) for fmt in selected for p in (fmt + ".", f"reject_{fmt}.", f"reject_{fmt}_inf."))]
        stale = sorted(set(mine) - set(files))
        for f in differ:
            print("differs:", f)
        for f in stale:
            print("not generated any more:", f)
        print(f"{len(files) - len(differ)} of {len(files)} files reproduce byte for byte")
        return 1 if differ or stale else 0


if __name__ == "__main__":
    sys.exit(main())
