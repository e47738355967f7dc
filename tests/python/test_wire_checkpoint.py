"""Wire format checkpoint from Python (refit.trainer): the library converts the tensors refitd's
wire plan lists before sending them (whole, or as shards split on block boundaries), and the
engine (the example engine holding the Llama-3 FP8 spec's engine layout, as its two engine
ranks) ends up with exactly the bytes a BF16-wire refit gives. Qwen3-MoE NVFP4 (fused gate/up groups) from two trainer
ranks (a gloo group, wire_rank.py), each pushing half of every matrix: refit.distributed reduces
the NVFP4 global amax over the group, and the engine again holds the BF16-wire refit's bytes."""
import json
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BIN, HERE, PYTHON_PKG, SRC_DIR, ExampleEngines, needs_torch, wait_for

SPEC = SRC_DIR / "deploy/models/llama3_fp8.yaml"
MAKE = SRC_DIR / "tests/integration/specs/make_checkpoints.py"
REFITD = BIN / "src/server/refitd"


def _load(path: Path):
    """A safetensors file as {name: torch tensor} (BF16/F32 only), read without the safetensors package."""
    import torch

    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    dtypes = {"BF16": torch.bfloat16, "F32": torch.float32}
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        lo, hi = e["data_offsets"]
        data = bytearray(raw[8 + n + lo:8 + n + hi])
        out[name] = torch.frombuffer(data, dtype=dtypes[e["dtype"]]).reshape(e["shape"]).clone()
    return out


@needs_torch
def test_checkpoint_wire_from_python_equals_bf16_wire(tmp_path):
    from refit.trainer import TrainerClient

    ckpts = []
    for seed in range(2):
        d = tmp_path / f"ckpt{seed}"
        subprocess.run([sys.executable, str(MAKE), "llama3", str(d), "--seed", str(seed)], check=True)
        ckpts.append(d)
    sock = tmp_path / "refitd.sock"
    address = f"unix:{sock}"
    (tmp_path / "refitd.yaml").write_text(
        f"listen: {address}\nlog_level: debug\nmodel_config: {ckpts[0] / 'config.json'}\n")
    procs, engines = [], None
    try:
        procs.append(subprocess.Popen([str(REFITD), "--config", str(tmp_path / "refitd.yaml"), "--model-spec",
                                       str(SPEC)], stdout=open(tmp_path / "refitd.log", "w"),
                                      stderr=subprocess.STDOUT))
        wait_for(lambda: "event=listening" in (tmp_path / "refitd.log").read_text() or procs[0].poll() is not None,
                 what="refitd listening")
        engines = ExampleEngines(tmp_path, address, SPEC, ckpts[0])  # two engine ranks (the spec leaves TP to them)
        digest = engines.digest

        weights = [_load(c / "model.safetensors") for c in ckpts]
        with TrainerClient(address) as client:
            model = client.status().model
            bf16 = client.refit(model, weights[1])
            want = digest()
            client.refit(model, weights[0], wire_format="checkpoint")
            assert digest() != want
            ckpt = client.refit(model, weights[1], wire_format="checkpoint")
            assert ckpt.outcome == "committed"
            assert digest() == want
            assert ckpt.bytes_in < bf16.bytes_in, (ckpt.bytes_in, bf16.bytes_in)
            # Shards split on FP8 block boundaries (rows at multiples of 128) convert on their own.
            client.refit(model, weights[0], wire_format="checkpoint")
            with client.session(model, weights[1], wire_format="checkpoint") as s:
                for name, t in weights[1].items():
                    split = t.shape[0] // 2 // 128 * 128 if t.dim() == 2 else 0
                    if 0 < split < t.shape[0]:
                        s.push(name, t[:split].contiguous(), dim=0, start=0, full_shape=list(t.shape))
                        s.push(name, t[split:].contiguous(), dim=0, start=split, full_shape=list(t.shape))
                    else:
                        s.push(name, t)
                sliced = s.commit()
            assert sliced.outcome == "committed" and digest() == want
            with pytest.raises(ValueError):
                client.session(model, weights[1], wire_format="fp8")
    finally:
        if engines is not None:
            engines.stop()
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=20)


@needs_torch
def test_nvfp4_slices_from_two_ranks_equal_bf16_wire(tmp_path):
    from refit.trainer import TrainerClient

    spec = SRC_DIR / "deploy/models/qwen3_moe_nvfp4.yaml"
    ckpts = []
    for seed in range(2):
        d = tmp_path / f"ckpt{seed}"
        subprocess.run([sys.executable, str(MAKE), "qwen3_moe", str(d), "--seed", str(seed)], check=True)
        ckpts.append(d)
    sock = tmp_path / "refitd.sock"
    address = f"unix:{sock}"
    (tmp_path / "refitd.yaml").write_text(
        f"listen: {address}\nlog_level: debug\nmodel_config: {ckpts[0] / 'config.json'}\n")
    procs, engines = [], None
    try:
        procs.append(subprocess.Popen([str(REFITD), "--config", str(tmp_path / "refitd.yaml"), "--model-spec",
                                       str(spec)], stdout=open(tmp_path / "refitd.log", "w"),
                                      stderr=subprocess.STDOUT))
        wait_for(lambda: "event=listening" in (tmp_path / "refitd.log").read_text() or procs[0].poll() is not None,
                 what="refitd listening")
        engines = ExampleEngines(tmp_path, address, spec, ckpts[0], name="pynvfp4")
        digest = engines.digest

        # The calibrated input_scale tensors are the engine's own: refits never carry them.
        weights = [{n: t for n, t in _load(c / "model.safetensors").items() if not n.endswith(".input_scale")}
                   for c in ckpts]
        with TrainerClient(address) as client:
            model = client.status().model
            bf16 = client.refit(model, weights[1])
            want = digest()
            client.refit(model, weights[0])
            assert digest() != want
            # A fused member or an NVFP4 slice pushed without the reduced amax is refused naming it.
            gate = "model.layers.1.mlp.experts.2.gate_proj.weight"
            with client.session(model, weights[1], wire_format="checkpoint") as s:
                assert s.amax_group(gate) == [gate, gate.replace("gate_proj", "up_proj")]
                assert s.amax_group("model.norm.weight") == []
                with pytest.raises(Exception) as e:
                    s.push(gate, weights[1][gate])
                assert f"tensor '{gate}'" in str(e.value) and "fused NVFP4 group" in str(e.value), str(e.value)
                s.abort("test")
        run = tmp_path / "ranks"
        run.mkdir()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PYTHON_PKG), str(HERE), os.environ.get("PYTHONPATH", "")]))
        ranks = [subprocess.Popen([sys.executable, str(HERE / "wire_rank.py"), "--rank", str(r), "--world", "2",
                                   "--init", str(run / "store"), "--address", address, "--checkpoint", str(ckpts[1]),
                                   "--out", str(run / f"rank{r}.json")],
                                  stdout=open(run / f"rank{r}.log", "w"), stderr=subprocess.STDOUT, env=env)
                 for r in range(2)]
        for r, p in enumerate(ranks):
            p.wait(timeout=120)
            assert p.returncode == 0, (run / f"rank{r}.log").read_text()
        results = [json.loads((run / f"rank{r}.json").read_text()) for r in range(2)]
        for r in results:
            assert "report" in r and r["report"]["outcome"] == "committed", results
        assert digest() == want
        assert results[0]["report"]["bytes_in"] < bf16.bytes_in, (results, bf16.bytes_in)
    finally:
        if engines is not None:
            engines.stop()
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=20)
