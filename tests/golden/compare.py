#!/usr/bin/env python3
"""Checks `refitctl quantize` against the oracle goldens in tests/golden/data/ (stdlib only).

For one format F:
  1. refitctl quantize --format F data/F.safetensors OUT; every tensor of
     data/F.expected.safetensors must be in OUT with the same dtype, shape and bytes, and OUT
     must hold nothing else;
  2. the same with --fp32-input round_to_bf16 on data/F.round_to_bf16.safetensors;
  3. each data/reject_F*.safetensors must make refitctl fail with an error naming the tensor
     in the file's "bad_tensor" metadata.
On a mismatch it prints, per tensor, the number of differing elements and the first one
(flat and multi-dimensional index, expected vs got bytes and decoded values).

Usage: compare.py --refitctl PATH --format F [--data DIR]
"""

import argparse
import glob
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import st_io  # noqa: E402

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def decode_e4m3(b):
    sign = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 3) & 0xF, b & 0x7
    if e == 0xF and m == 0x7:
        return float("nan")
    if e == 0:
        return sign * m / 8.0 * 2.0 ** -6
    return sign * (1 + m / 8.0) * 2.0 ** (e - 7)


def describe(dtype, raw, name):
    """Human-readable value of one element's bytes."""
    if dtype == "F32":
        return repr(struct.unpack("<f", raw)[0])
    if dtype == "BF16":
        return repr(struct.unpack("<f", b"\x00\x00" + raw)[0])
    if dtype == "F8_E4M3":
        return repr(decode_e4m3(raw[0]))
    if dtype == "U8" and (name.endswith("_scale_inv") or name.endswith("_scales")):
        return f"2^{raw[0] - 127}" if raw[0] not in (0, 255) else ("byte 0" if raw[0] == 0 else "NaN")
    if dtype == "U8":
        lo, hi = raw[0] & 0xF, raw[0] >> 4
        fmt = lambda c: ("-" if c & 8 else "+") + repr(E2M1[c & 7])  # noqa: E731
        return f"fp4 pair (even {fmt(lo)}, odd {fmt(hi)})"
    return raw.hex()


def unravel(flat, shape):
    idx = []
    for d in reversed(shape):
        idx.append(flat % d if d else 0)
        flat = flat // d if d else 0
    return tuple(reversed(idx))


def compare_files(expected, got):
    """Returns a list of failure messages (empty when identical)."""
    problems = []
    for name in sorted(set(expected) - set(got)):
        problems.append(f"missing from output: {name}")
    for name in sorted(set(got) - set(expected)):
        problems.append(f"unexpected tensor in output: {name} {got[name][0]}{list(got[name][1])}")
    for name in sorted(set(expected) & set(got)):
        (edt, eshape, eraw), (gdt, gshape, graw) = expected[name], got[name]
        if edt != gdt or tuple(eshape) != tuple(gshape):
            problems.append(f"{name}: expected {edt}{list(eshape)}, got {gdt}{list(gshape)}")
            continue
        if eraw == graw:
            continue
        size = st_io.DTYPE_SIZES[edt]
        bad = [i for i in range(len(eraw) // size)
               if eraw[i * size:(i + 1) * size] != graw[i * size:(i + 1) * size]]
        i = bad[0]
        e, g = eraw[i * size:(i + 1) * size], graw[i * size:(i + 1) * size]
        problems.append(
            f"{name} ({edt}{list(eshape)}): {len(bad)} of {len(eraw) // size} elements differ; "
            f"first at flat {i} index {list(unravel(i, eshape))}: expected {e.hex()} "
            f"({describe(edt, e, name)}), got {g.hex()} ({describe(edt, g, name)})")
    return problems


def run(cmd):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600)


def check_quantize(refitctl, fmt, inp, exp_path, extra, tmp):
    out = os.path.join(tmp, os.path.basename(inp) + ".out")
    cmd = [refitctl, "quantize", "--format", fmt] + extra + [inp, out]
    proc = run(cmd)
    label = " ".join([fmt] + extra)
    if proc.returncode != 0:
        return [f"[{label}] `{' '.join(cmd)}` exited {proc.returncode}:\n{proc.stdout.strip()}"]
    expected, _ = st_io.read(exp_path)
    got, _ = st_io.read(out)
    return [f"[{label}] {p}" for p in compare_files(expected, got)]


def check_reject(refitctl, fmt, path, tmp):
    _, meta = st_io.read(path)
    bad = meta["bad_tensor"]
    out = os.path.join(tmp, os.path.basename(path) + ".out")
    cmd = [refitctl, "quantize", "--format", fmt, path, out]
    proc = run(cmd)
    where = os.path.basename(path)
    if proc.returncode == 0:
        return [f"[{where}] expected failure on non-finite input {bad}, but refitctl succeeded"]
    if bad not in proc.stdout:
        return [f"[{where}] refitctl failed but its error does not name {bad}:\n"
                f"{proc.stdout.strip()}"]
    return []


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refitctl", required=True)
    parser.add_argument("--format", required=True)
    parser.add_argument("--data", default=os.path.join(HERE, "data"))
    args = parser.parse_args()
    fmt, data = args.format, args.data

    problems, checks = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        pairs = [(f"{fmt}.safetensors", f"{fmt}.expected.safetensors", []),
                 (f"{fmt}.round_to_bf16.safetensors", f"{fmt}.round_to_bf16.expected.safetensors",
                  ["--fp32-input", "round_to_bf16"])]
        for inp, exp, extra in pairs:
            inp, exp = os.path.join(data, inp), os.path.join(data, exp)
            if not os.path.exists(inp) or not os.path.exists(exp):
                problems.append(f"golden file missing: {inp} / {exp}")
                continue
            checks += 1
            problems += check_quantize(args.refitctl, fmt, inp, exp, extra, tmp)
        # reject_nvfp4*.safetensors also matches reject_nvfp4_te*: select by the file's format.
        rejects = [p for p in sorted(glob.glob(os.path.join(data, f"reject_{fmt}*.safetensors")))
                   if st_io.read(p)[1].get("format") == fmt]
        if not rejects:
            problems.append(f"no reject_{fmt}*.safetensors in {data}")
        for path in rejects:
            checks += 1
            problems += check_reject(args.refitctl, fmt, path, tmp)

    for p in problems:
        print("FAIL", p)
    print(f"golden {fmt}: {checks} checks, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
