"""The pieces of python/examples/gpu_llama_refit.py that run without a GPU: the FP8 e4m3 decode and
block-128 dequantizing linear against straightforward references, the engine's parameter table
against what `refitctl convert` writes with deploy/models/demo-llama.yaml, the request protocol,
the driver's verdicts, and the whole flow on the host (refitd + shm engine + trainer over UCX,
checked against the offline conversion)."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BIN, SRC_DIR, needs_torch, needs_transformers

EXAMPLES = SRC_DIR / "python" / "examples"
sys.path.insert(0, str(EXAMPLES))
REFITCTL = BIN / "tools" / "refitctl"
SPEC = SRC_DIR / "deploy" / "models" / "demo-llama.yaml"

pytestmark = needs_torch


def e4m3_by_enumeration():
    """{bits: value} of float8_e4m3fn built the other way round: enumerate sign, exponent and
    mantissa and place each value at its bit pattern."""
    out = {}
    for sign in (0, 1):
        for exp in range(16):
            for man in range(8):
                bits = (sign << 7) | (exp << 3) | man
                if exp == 15 and man == 7:
                    out[bits] = math.nan
                    continue
                magnitude = math.ldexp(man, -9) if exp == 0 else math.ldexp(8 + man, exp - 10)
                out[bits] = -magnitude if sign else magnitude
    return out


def test_e4m3_decode_is_exact_for_every_byte():
    import torch

    import llama_fp8 as L

    want = e4m3_by_enumeration()
    codes = torch.arange(256, dtype=torch.int64).to(torch.uint8)
    for decoded in (L.decode_e4m3(codes), L.e4m3_table("cpu")[codes.long()]):
        for bits in range(256):
            got = float(decoded[bits])
            assert (math.isnan(got) and math.isnan(want[bits])) or (got == want[bits] and
                                                                     math.copysign(1, got) == math.copysign(1, want[bits])), bits
    assert [L.e4m3_value(b) for b in (0x38, 0x7E, 0x01, 0xFE)] == [1.0, 448.0, 2.0 ** -9, -448.0]


def random_fp8(n, k, seed):
    import torch

    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (n, k), generator=g, dtype=torch.int64)
    codes[(codes & 0x7F) == 0x7F] = 0x3F  # no NaN codes
    scales = torch.rand((math.ceil(n / 128), math.ceil(k / 128)), generator=g) * 1e-3 + 1e-5
    return codes.to(torch.uint8), scales


def test_fp8_linear_equals_blockwise_dequantized_linear():
    import torch

    import llama_fp8 as L

    want_values = e4m3_by_enumeration()
    n, k = 300, 200  # partial blocks in both dims
    codes, scales = random_fp8(n, k, 3)
    # Reference: each 128x128 tile dequantized on its own from the enumerated values.
    table = torch.tensor([want_values[b] for b in range(256)], dtype=torch.float32)
    dense = torch.empty(n, k, dtype=torch.float32)
    for i in range(0, n, 128):
        for j in range(0, k, 128):
            tile = codes[i:i + 128, j:j + 128].long()
            dense[i:i + 128, j:j + 128] = table[tile] * scales[i // 128, j // 128]
    assert torch.equal(L.dequantize(codes, scales, torch.float32), dense)
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    layer = L.Fp8Linear(codes, scales)
    assert torch.equal(layer(x), torch.nn.functional.linear(x, dense.to(torch.bfloat16)))
    assert dict(layer.named_buffers()).keys() == {"weight", "weight_scale_inv"}
    with pytest.raises(ValueError, match="do not fit"):
        L.Fp8Linear(codes, scales[:1])


def test_protocol_carries_float32_arrays_bit_for_bit():
    import numpy as np

    from channel import Channel, decode_f32, encode_f32

    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    left, right = Channel(a_r, b_w), Channel(b_r, a_w)
    values = np.array([0.0, -0.0, 1e-45, 3.4e38, np.nan, -np.inf, 1 / 3], dtype=np.float32)
    left.send({"op": "x", "logits": encode_f32(values), "ids": [1, 2]})
    got = right.recv()
    assert got["op"] == "x" and got["ids"] == [1, 2]
    assert decode_f32(got["logits"]).tobytes() == values.tobytes()
    left.close()
    right.close()


def test_verdict_fails_on_every_kind_of_mismatch():
    import numpy as np

    from channel import encode_f32
    from gpu_llama_refit import compare

    logits = np.linspace(-3, 3, 50, dtype=np.float32)
    step = {"change": "noise", "wall_ms": 1.0, "push_ms": 0.5, "commit_ms": 0.5, "trainer_tensors": "cuda",
            "report": {"version": 2, "outcome": "committed", "bytes_in": 1, "bytes_out": 1, "buckets": 1,
                       "tensors": 1, "times_ms": {}}}
    engine = {"version": 2, "ids": [1, 2, 3], "logits": encode_f32(logits), "ms": 1.0}
    reference = {"ids": [1, 2, 3], "logits": encode_f32(logits), "mismatched": []}
    previous = logits + 1
    assert compare(step, engine, reference, previous, 0.0)[0]["ok"]
    bumped = logits.copy()
    bumped[7] += 0.25
    cases = [
        (dict(engine, ids=[1, 2, 4]), reference, previous, 0.0),              # other tokens
        (dict(engine, logits=encode_f32(bumped)), reference, previous, 0.1),  # logits beyond atol
        (engine, dict(reference, mismatched=["x.weight"]), previous, 0.0),     # engine bytes differ
        (engine, reference, logits, 0.0),                                     # weights did not change
        (dict(engine, version=1), reference, previous, 0.0),                  # engine at another version
    ]
    for e, r, p, atol in cases:
        assert not compare(step, e, r, p, atol)[0]["ok"]
    assert compare(step, dict(engine, logits=encode_f32(bumped)), reference, previous, 0.25)[0]["ok"]


def test_registered_dtype_override_keeps_element_size():
    import torch

    import refit

    region = refit.SharedParams.from_tensors({"w": torch.zeros(4, 4, dtype=torch.uint8), "s": torch.ones(2)},
                                             dtypes={"w": "F8_E4M3"})
    try:
        assert [(p.name, p.dtype) for p in region.params] == [("w", "F8_E4M3"), ("s", "F32")]
    finally:
        region.close()
    with pytest.raises(ValueError, match="cannot register as BF16"):
        refit.SharedParams.from_tensors({"w": torch.zeros(4, dtype=torch.uint8)}, dtypes={"w": "BF16"})


def test_cuda_params_register_through_cuda_ipc_fields():
    """EngineAgent turns CudaParam entries into CUDA IPC registrations: storage kind, the handle
    bytes, offset and device reach refit_engine_start as given."""
    import refit
    from refit import _native

    handle = bytes(range(64))
    p = refit.CudaParam("model.norm.weight", "BF16", (8,), 1, handle, 512, 16)
    # The struct as the C ABI sees it.
    fields = {}

    class Spy:
        def refit_engine_start(self, options, array, n, out):
            fields.update(storage=array[0].storage, device=array[0].cuda_device, offset=array[0].offset,
                          handle=bytes(array[0].cuda_ipc_handle), n=n)
            return 3  # INVALID_ARGUMENT

        def refit_last_error(self):
            return b"spy"

        def refit_last_cause(self):
            return b""

        def refit_code_name(self, code):
            return b"INVALID_ARGUMENT"

    real = _native._lib
    _native._lib = Spy()
    try:
        with pytest.raises(refit.RefitError):
            refit.EngineAgent("unix:/x", [p])
    finally:
        _native._lib = real
    assert fields == {"storage": _native.STORAGE_CUDA_IPC, "device": 1, "offset": 512, "handle": handle, "n": 1}


def test_cuda_ipc_handle_from_raw_and_versioned_torch_exports():
    from refit.cuda import cuda_ipc_handle

    raw = bytes(range(64))
    assert cuda_ipc_handle(raw) == raw  # torch 1.x
    assert cuda_ipc_handle(b"\x02c" + raw) == raw  # torch 2.x: version, type 'c', handle
    with pytest.raises(RuntimeError, match="expandable_segments"):
        cuda_ipc_handle(b"\x02e" + bytes(90))
    with pytest.raises(RuntimeError, match="unrecognized"):
        cuda_ipc_handle(bytes(10))


@needs_transformers
def test_refitctl_convert_writes_exactly_the_tensors_the_engine_registers(tmp_path):
    import torch
    from safetensors.torch import save_file

    import llama_fp8 as L

    torch.set_num_threads(1)
    bf16 = L.build_bf16("tiny", 5)
    table = L.engine_table(bf16)
    ckpt = tmp_path / "trainer.safetensors"
    save_file({n: p.detach().contiguous() for n, p in bf16.named_parameters()}, str(ckpt))
    p = subprocess.run([str(REFITCTL), "convert", "--spec", str(SPEC), str(ckpt), str(tmp_path / "out")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    converted = L.read_safetensors(tmp_path / "out" / "model.safetensors")
    assert {n: (d, s) for n, (d, s, _) in converted.items()} == {n: (d, tuple(s)) for n, d, s in table}
    fp8 = [n for n, d, _ in table if d == L.FP8]
    assert len(fp8) == 7 * 2  # q k v o gate up down, 2 layers
    assert json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]["weight_block_size"] \
        == [128, 128]

    # The FP8 model over the converted bytes tracks the BF16 model it came from.
    tensors = L.load_checkpoint(tmp_path / "out" / "model.safetensors", table)
    params = dict(bf16.named_parameters())
    for name in fp8:
        w = params[name].detach().float()
        deq = L.dequantize(tensors[name], tensors[name + "_scale_inv"], torch.float32)
        assert float((deq - w).norm() / w.norm()) < 0.05, name
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        want = bf16(ids).logits.float()
        got = L.fp8_engine_model(L.build_bf16("tiny", 5), tensors)(ids).logits.float()
    cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
    assert float(cos) > 0.99
    path = tmp_path / "out" / "model.safetensors"
    with pytest.raises(ValueError, match="'model.norm.weight' is BF16\\[192\\], the engine holds F32"):
        L.load_checkpoint(path, [(n, "F32" if n == "model.norm.weight" else d, s) for n, d, s in table])
    with pytest.raises(ValueError, match="'model.extra.weight' missing"):
        L.load_checkpoint(path, table + [("model.extra.weight", "BF16", (4,))])


@needs_transformers
def test_example_refits_on_the_host_match_the_offline_conversion(tmp_path):
    """The example end to end with the engine and trainer on the CPU: refitd quantizes what the
    trainer pushes; the engine's bytes, tokens and logits equal the reference built from
    `refitctl convert` after each of 1 + 3 refits, and each refit changed the logits."""
    out = tmp_path / "summary.json"
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    p = subprocess.run([sys.executable, str(EXAMPLES / "gpu_llama_refit.py"), "--build", str(BIN), "--size", "tiny",
                        "--engine-device", "cpu", "--trainer-device", "cpu", "--tokens", "4", "--refits", "3",
                        "--bucket-bytes", "262144", "--workdir", str(tmp_path / "work"), "--out", str(out)],
                       capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-6000:]
    summary = json.loads(out.read_text())
    assert summary["ok"] and summary["model"] == "demo-llama"
    rows = summary["refits"]
    assert [r["version"] for r in rows] == [1, 2, 3, 4]
    assert [r["change"] for r in rows] == ["initial", "gradient", "noise", "gradient"]
    for r in rows:
        assert r["outcome"] == "committed" and r["engine_bytes_equal_reference"] and r["tokens_equal"]
        assert r["max_logit_diff"] == 0.0 and r["buckets"] > 1 and r["bytes_out"] < r["bytes_in"]
        assert len(r["ids"]) == 16 + 4
    assert all(r["logits_changed_vs_previous"] for r in rows[1:])
    assert summary["traffic"]["mixed"] == 0 and summary["traffic"]["forwards"] > 0
    assert summary["engine"]["params"] == 2 * 7 * 2 + 2 * 2 + 3  # fp8 + scales, 2 norms/layer, embed/norm/head
