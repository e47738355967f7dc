"""Engine ranks with real processes: one refitd per node, an engine of several rank processes
(rank_engine_main.py, one POSIX shm object each) registering with it, the trainer `refitctl refit`.
Each rank's bytes after every refit equal `refitctl convert --engine-layout --tp-rank R`; a rank
missing at begin, and a rank killed inside the commit window, are refused naming the rank; during
continuous serving no lockstep forward step mixes versions across ranks; a refit while the ranks
sleep is staged and lands on every rank, with one version, at the last rank's wake."""
import json
import os
import signal
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import BIN, HERE, PYTHON_PKG, REFITD, events, needs_torch, wait_for

REFITCTL = BIN / "tools/refitctl"

LLAMA_TP4 = """model: tiny-llama
tensor_parallel: {size: 4}
defaults:
  format: auto
rules:
  - match: "model.embed_tokens.weight"
    shard: {dim: 0}
  - match: "model.layers.{L}.self_attn.{p:q,k,v}_proj.weight"
    target: "model.layers.{L}.self_attn.qkv_proj.weight"
    fuse: {capture: p, order: [q, k, v]}
    shard: {dim: 0}
  - match: "model.layers.{L}.self_attn.o_proj.weight"
    shard: {dim: 1}
  - match: "model.layers.{L}.mlp.{p:gate,up}_proj.weight"
    target: "model.layers.{L}.mlp.gate_up_proj.weight"
    fuse: {capture: p, order: [gate, up]}
    shard: {dim: 0}
  - match: "model.layers.{L}.mlp.down_proj.weight"
    shard: {dim: 1}
  - match: "lm_head.weight"
    shard: {dim: 0}
"""

MOE_TP2_EP2 = """model: tiny-qwen3-moe
tensor_parallel: {size: 2}
expert_parallel: {size: 2}
defaults:
  format: auto
rules:
  - match: "model.layers.{L}.self_attn.{p:q,k,v}_proj.weight"
    target: "model.layers.{L}.self_attn.qkv_proj.weight"
    fuse: {capture: p, order: [q, k, v]}
    shard: {dim: 0}
  - match: "model.layers.{L}.self_attn.o_proj.weight"
    shard: {dim: 1}
  - match: "model.layers.{L}.mlp.experts.{E}.{p:gate,up}_proj.weight"
    target: "model.layers.{L}.mlp.experts.w13_weight"
    format: mxfp8
    fuse: {capture: p, order: [gate, up]}
    stack: {capture: E, count: 4}
  - match: "model.layers.{L}.mlp.experts.{E}.down_proj.weight"
    target: "model.layers.{L}.mlp.experts.w2_weight"
    format: mxfp8
    stack: {capture: E, count: 4}
"""


def llama_tensors(torch, gen, h=64, layers=2, vocab=128):
    t = {"model.embed_tokens.weight": (vocab, h), "lm_head.weight": (vocab, h), "model.norm.weight": (h,)}
    for L in range(layers):
        p = f"model.layers.{L}."
        t.update({p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (h // 2, h),
                  p + "self_attn.v_proj.weight": (h // 2, h), p + "self_attn.o_proj.weight": (h, h),
                  p + "mlp.gate_proj.weight": (2 * h, h), p + "mlp.up_proj.weight": (2 * h, h),
                  p + "mlp.down_proj.weight": (h, 2 * h), p + "input_layernorm.weight": (h,),
                  p + "post_attention_layernorm.weight": (h,)})
    return {n: torch.randn(s, generator=gen).to(torch.bfloat16) for n, s in t.items()}


def moe_tensors(torch, gen, h=64, layers=1, experts=4, inter=64):
    t = {"model.embed_tokens.weight": (128, h), "model.norm.weight": (h,)}
    for L in range(layers):
        p = f"model.layers.{L}."
        t.update({p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (h // 2, h),
                  p + "self_attn.v_proj.weight": (h // 2, h), p + "self_attn.o_proj.weight": (h, h),
                  p + "mlp.gate.weight": (experts, h), p + "input_layernorm.weight": (h,)})
        for e in range(experts):
            q = f"{p}mlp.experts.{e}."
            t.update({q + "gate_proj.weight": (inter, h), q + "up_proj.weight": (inter, h),
                      q + "down_proj.weight": (h, inter)})
    return {n: torch.randn(s, generator=gen).to(torch.bfloat16) for n, s in t.items()}


def read_safetensors(path: Path):
    """{name: (dtype, shape, bytes)} of a .safetensors file."""
    raw = path.read_bytes()
    (n,) = struct.unpack_from("<Q", raw, 0)
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        out[name] = (e["dtype"], e["shape"], raw[8 + n + a:8 + n + b])
    return out


class Expected(dict):
    """(checkpoint k, rank r) -> what `refitctl convert --engine-layout --tp-rank r` says rank r holds
    after a refit of checkpoint k: {name: (dtype, shape, bytes)}; converted when first asked."""

    def __init__(self, node):
        super().__init__()
        self.node = node

    def __missing__(self, key):
        k, r = key
        out = self.node.tmp / f"offline{k}.{r}"
        self.node.refitctl("convert", "--spec", str(self.node.spec), "--engine-layout", "--tp-rank", str(r),
                           str(self.node.checkpoints[k]), str(out))
        self[key] = read_safetensors(out / "engine.safetensors")
        return self[key]


class RankNode:
    """refitd serving `spec` + one rank_engine_main.py process per engine rank."""

    def __init__(self, tmp: Path, spec: str, make_tensors, ranks: int, ep_size=0, failpoints="", serve=False,
                 gpus=None, staging="host"):
        """gpus: each rank's CUDA device (its parameters by CUDA IPC), or None (POSIX shm)."""
        import torch
        from safetensors.torch import save_file

        self.tmp, self.ranks, self.ep_size, self.serve, self.gpus = tmp, ranks, ep_size, serve, gpus
        self.spec = tmp / "spec.yaml"
        self.spec.write_text(spec)
        self.model = spec.split("\n", 1)[0].split(": ", 1)[1]
        gen = torch.Generator().manual_seed(7)
        self.checkpoints = [None]  # refits 1, 2, 3 push checkpoints 1, 2, 3
        for k in range(1, 4):
            path = tmp / f"ckpt{k}.safetensors"
            save_file(make_tensors(torch, gen), str(path))
            self.checkpoints.append(path)
        self.expected = Expected(self)
        self.sock = tmp / "refitd.sock"
        self.address = f"unix:{self.sock}"
        cfg = tmp / "refitd.yaml"
        cfg.write_text(f"listen: {self.address}\nlog_level: debug\nmodel_spec: {self.spec}\nstaging: {staging}\n"
                       "engine:\n  pause_timeout_ms: 5000\n  resume_timeout_ms: 5000\n")
        env = dict(os.environ)
        if failpoints:
            env["REFIT_FAILPOINTS"] = failpoints
        self.log = tmp / "refitd.log"
        self.daemon = subprocess.Popen([str(REFITD), "--config", str(cfg)], stdout=open(self.log, "w"),
                                       stderr=subprocess.STDOUT, env=env)
        wait_for(lambda: "event=listening" in self.log.read_text() or self.daemon.poll() is not None,
                 what="refitd listening")
        assert self.daemon.poll() is None, self.log.read_text()
        self.barrier = f"/dev/shm/refit-barrier-{uuid.uuid4().hex[:12]}"
        if serve:
            Path(self.barrier).write_bytes(bytes(10 * ranks))
        self.procs = {}
        self.shms = {}
        self.starts = 0

    def refitctl(self, *args, check=True):
        p = subprocess.run([str(REFITCTL), *args], capture_output=True, text=True, timeout=120)
        if check:
            assert p.returncode == 0, p.stdout + p.stderr
        return p

    def ctl(self, *args):
        p = self.refitctl(*args, "--address", self.address, "--json", check=False)
        return p.returncode, json.loads(p.stdout.splitlines()[-1])

    def start_rank(self, r):
        self.starts += 1
        params = self.tmp / f"params.{r}.json"
        params.write_text(json.dumps([[n, d, s] for n, (d, s, _) in self.expected[1, r].items()]))
        self.shms[r] = f"/refit-rank-{uuid.uuid4().hex[:12]}"
        log = self.tmp / f"rank{r}.{self.starts}.log"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PYTHON_PKG), os.environ.get("PYTHONPATH", "")]))
        args = [sys.executable, str(HERE / "rank_engine_main.py"), "--address", self.address, "--model", self.model,
                "--tp-rank", str(r), "--tp-size", str(self.ranks), "--ep-size", str(self.ep_size),
                "--params", str(params), "--shm", self.shms[r], "--layout", str(self.tmp / f"layout.{r}.json")]
        if self.serve:
            args += ["--barrier", self.barrier, "--steps", str(self.tmp / f"steps.{r}.{self.starts}.log")]
        if self.gpus is not None:
            snaps = self.tmp / f"snapshots.{r}"
            snaps.mkdir(exist_ok=True)
            args += ["--device", str(self.gpus[r]), "--snapshots", str(snaps)]
        p = subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
        p.log = log
        self.procs[r] = p
        wait_for(lambda: any(e["event"] == "registered" for e in events(log)) or p.poll() is not None,
                 what=f"rank {r} registration")
        assert p.poll() is None, log.read_text()

    def _await_event(self, r, event, count):
        log = self.procs[r].log
        wait_for(lambda: sum(e["event"] == event for e in events(log)) >= count or self.procs[r].poll() is not None,
                 what=f"rank {r} {event}")
        assert self.procs[r].poll() is None, log.read_text()
        return [e for e in events(log) if e["event"] == event][count - 1]

    def sleep_rank(self, r):
        """Rank r sleeps (rank_engine_main.py: SIGUSR1) and releases its shm object."""
        count = sum(e["event"] == "asleep" for e in events(self.procs[r].log)) + 1
        self.procs[r].send_signal(signal.SIGUSR1)
        self._await_event(r, "asleep", count)

    def wake_rank(self, r):
        """Rank r wakes at a new shm object (SIGUSR2); returns whether its wake committed a refit."""
        count = sum(e["event"] == "awake" for e in events(self.procs[r].log)) + 1
        self.procs[r].send_signal(signal.SIGUSR2)
        e = self._await_event(r, "awake", count)
        if e["shm"]:  # "" with GPU ranks: a new CUDA allocation
            Path("/dev/shm" + self.shms[r]).unlink(missing_ok=True)
            self.shms[r] = e["shm"]
        return e["committed"]

    def rank_bytes(self, r):
        layout = json.loads((self.tmp / f"layout.{r}.json").read_text())
        raw = Path("/dev/shm" + self.shms[r]).read_bytes()
        return {n: raw[o:o + b] for n, (o, b) in layout.items()}

    def assert_ranks_hold(self, k, ranks=None):
        if self.gpus is not None:
            return self.assert_gpu_ranks_hold(k)
        for r in range(self.ranks) if ranks is None else ranks:
            held = self.rank_bytes(r)
            want = self.expected[k, r]
            assert held.keys() == want.keys()
            bad = [n for n in want if held[n] != want[n][2]]
            assert not bad, f"rank {r} differs from refitctl convert --tp-rank {r} of checkpoint {k}: {bad[:5]}"

    def assert_gpu_ranks_hold(self, k):
        """Each rank's snapshot of the version it serves now (taken by the rank as it resumed with it)
        equals its offline part of checkpoint k."""
        import torch

        _, status = self.ctl("status")
        for r in range(self.ranks):
            version = status["ranks"][r]["version"]
            snap = self.tmp / f"snapshots.{r}" / f"v{version}.pt"
            wait_for(snap.exists, what=f"rank {r} snapshot of version {version}")
            held = torch.load(snap)
            want = self.expected[k, r]
            assert held.keys() == want.keys()
            bad = [n for n in want if bytes(held[n].numpy().tobytes()) != want[n][2]]
            assert not bad, f"rank {r} differs from refitctl convert --tp-rank {r} of checkpoint {k}: {bad[:5]}"

    def refit(self, k):
        return self.ctl("refit", str(self.checkpoints[k]))

    def close(self):
        for p in list(self.procs.values()) + [self.daemon]:
            if p.poll() is None:
                p.kill()
                p.wait()
        for shm in self.shms.values():
            Path("/dev/shm" + shm).unlink(missing_ok=True)
        Path(self.barrier).unlink(missing_ok=True)


@pytest.fixture
def rank_node(tmp_path):
    made = []

    def make(*args, **kwargs):
        n = RankNode(tmp_path, *args, **kwargs)
        made.append(n)
        return n

    yield make
    for n in made:
        n.close()


@needs_torch
@pytest.mark.parametrize("spec,tensors,ranks,ep", [(LLAMA_TP4, llama_tensors, 4, 0), (MOE_TP2_EP2, moe_tensors, 2, 2)],
                         ids=["llama-tp4", "qwen3moe-tp2-ep2"])
def test_three_refits_write_every_rank_its_offline_part(rank_node, spec, tensors, ranks, ep):
    n = rank_node(spec, tensors, ranks, ep_size=ep)
    for r in range(ranks - 1):
        n.start_rank(r)
    # A rank missing at begin: refused before anything is written, naming it.
    rc, out = n.refit(1)
    assert rc != 0 and f"engine rank {ranks - 1} of tensor_parallel.size {ranks} is not registered" in out["error"], out
    rc, status = n.ctl("status")
    assert [k["registered"] for k in status["ranks"]] == [True] * (ranks - 1) + [False]
    n.start_rank(ranks - 1)
    for k in (1, 2, 3):
        rc, out = n.refit(k)
        assert rc == 0, out
        assert out["version"] == k
        n.assert_ranks_hold(k)
    rc, status = n.ctl("status")
    assert all(k["registered"] and k["version"] == 3 and not k["dirty"] for k in status["ranks"]), status


@needs_torch
@pytest.mark.parametrize("where", ["shm", "gpu"])
def test_a_rank_killed_mid_commit_is_dirty_until_it_registers_again(rank_node, where):
    # The second refit's commit stalls inside the window (every rank paused): rank 1 is killed there.
    # gpu: both ranks' weights on GPU 0 (CUDA IPC), staging: device.
    if where == "gpu" and cuda_devices() < 1:
        pytest.skip("needs a CUDA GPU (found none): the ranks' weights by CUDA IPC")
    gpu = dict(gpus=[0, 0], staging="device") if where == "gpu" else {}
    n = rank_node(MOE_TP2_EP2, moe_tensors, 2, ep_size=2, failpoints="mid_commit=delay:1500@2", **gpu)
    n.start_rank(0)
    n.start_rank(1)
    rc, out = n.refit(1)
    assert rc == 0, out
    victim = n.procs[1]
    p = subprocess.Popen([str(REFITCTL), "refit", str(n.checkpoints[2]), "--address", n.address, "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: sum(e["event"] == "paused" for e in events(victim.log)) == 2, what="rank 1 paused")
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    stdout, _ = p.communicate(timeout=60)
    out = json.loads(stdout.splitlines()[-1])
    assert p.returncode != 0 and "rank1" in out["error"], out
    rc, status = n.ctl("status")
    assert status["ranks"][1]["registered"] is False and status["ranks"][1]["left_dirty"] is True, status
    rc, out = n.refit(3)
    assert rc != 0 and "engine rank 1 of tensor_parallel.size 2 is not registered" in out["error"], out
    assert "left dirty" in out["error"]
    # It restarts with fresh memory: the next full refit lands on every rank.
    n.start_rank(1)
    rc, out = n.refit(3)
    assert rc == 0, out
    n.assert_ranks_hold(3)
    rc, status = n.ctl("status")
    assert all(k["registered"] and not k["dirty"] and not k["left_dirty"] for k in status["ranks"]), status


@needs_torch
def test_no_lockstep_step_mixes_versions_across_ranks(rank_node):
    n = rank_node(MOE_TP2_EP2, moe_tensors, 2, ep_size=2, serve=True)
    n.start_rank(0)
    n.start_rank(1)
    steps = [n.tmp / f"steps.{r}.{r + 1}.log" for r in range(2)]

    def counted():
        return min(len(s.read_text().splitlines()) if s.exists() else 0 for s in steps)

    refits = 0
    deadline = time.monotonic() + 90
    while (refits < 3 or counted() < 1000) and time.monotonic() < deadline:
        rc, out = n.refit(1 + refits % 3)
        assert rc == 0, out
        refits += 1
    assert refits >= 3 and counted() >= 1000, (refits, counted())
    for p in n.procs.values():
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
    logs = [dict(l.split() for l in s.read_text().splitlines()) for s in steps]
    common = set(logs[0]) & set(logs[1])
    assert len(common) >= 1000
    mixed = [s for s in common if logs[0][s] != logs[1][s]]
    assert not mixed, f"{len(mixed)} steps mixed versions across ranks, e.g. step {mixed[0]}"
    assert len({logs[0][s] for s in common}) >= 3  # the steps did see the refits land


@needs_torch
@pytest.mark.parametrize("where", ["shm", "gpu"])
def test_a_refit_while_every_rank_sleeps_lands_on_every_rank_at_the_last_wake(rank_node, where):
    # gpu: both ranks' weights on GPU 0 (CUDA IPC), staging: device; a wake brings a new allocation.
    if where == "gpu" and cuda_devices() < 1:
        pytest.skip("needs a CUDA GPU (found none): the ranks' weights by CUDA IPC")
    gpu = dict(gpus=[0, 0], staging="device") if where == "gpu" else {}
    n = rank_node(MOE_TP2_EP2, moe_tensors, 2, ep_size=2, **gpu)
    n.start_rank(0)
    n.start_rank(1)
    rc, out = n.refit(1)
    assert rc == 0 and out["version"] == 1, out
    n.sleep_rank(0)
    n.sleep_rank(1)
    rc, status = n.ctl("status")
    assert status["engine_asleep"] and [k["asleep"] for k in status["ranks"]] == [True, True], status
    # Received, converted and validated now; committed at the wake.
    rc, out = n.refit(2)
    assert rc == 0 and out["outcome"] == "staged", out
    staged = out["session"]
    assert n.wake_rank(0) is False  # rank 1 still sleeps: so does the engine
    rc, status = n.ctl("status")
    assert status["engine_asleep"] and [k["asleep"] for k in status["ranks"]] == [False, True], status
    assert status["awaiting_wake"] == staged and status["version"] == 1, status
    if where == "shm":
        n.assert_ranks_hold(1, ranks=[0])  # woken at a new shm object with the weights it slept with
    assert n.wake_rank(1) is True  # the last wake commits the staged refit on every rank
    n.assert_ranks_hold(2)
    rc, status = n.ctl("status")
    assert not status["engine_asleep"] and status["awaiting_wake"] == 0 and status["version"] == 2, status
    assert [(k["version"], k["asleep"], k["dirty"]) for k in status["ranks"]] == [(2, False, False)] * 2, status
    assert status["last_refit"]["session"] == staged and status["last_refit"]["outcome"] == "committed", status
    # A sleep and a wake with nothing staged: the rank keeps its weights, the next refit lands.
    n.sleep_rank(1)
    assert n.wake_rank(1) is False
    n.assert_ranks_hold(2)
    rc, out = n.refit(3)
    assert rc == 0 and out["version"] == 3, out
    n.assert_ranks_hold(3)


def cuda_devices():
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:
        return 0


@needs_torch
@pytest.mark.skipif(cuda_devices() < 1, reason="needs a CUDA GPU (found none): engine ranks with parameters by CUDA "
                    "IPC, staged and converted on the GPU")
@pytest.mark.parametrize("staging", ["device", "direct"])
@pytest.mark.parametrize("spec,tensors,ranks,ep", [(LLAMA_TP4, llama_tensors, 4, 0), (MOE_TP2_EP2, moe_tensors, 2, 2)],
                         ids=["llama-tp4", "qwen3moe-tp2-ep2"])
def test_engine_ranks_sharing_one_gpu_refit_on_the_gpu_path(rank_node, staging, spec, tensors, ranks, ep):
    # Every rank on GPU 0, each with its own process, registration and memory: each tensor is
    # received once, converted on the GPU, and each rank's part staged (device) or written in place
    # (direct); every rank holds its offline part after each of three refits.
    n = rank_node(spec, tensors, ranks, ep_size=ep, gpus=[0] * ranks, staging=staging)
    for r in range(ranks):
        n.start_rank(r)
    for k in (1, 2, 3):
        rc, out = n.refit(k)
        assert rc == 0, out
        assert out["version"] == k
        if staging == "direct":
            # Each rank's own shards go straight into its memory; parts every rank shares are
            # staged once and copied to each in the commit.
            assert 0 < out["bytes_in_place"] < out["bytes_out"], out
        else:
            assert out["bytes_in_place"] == 0, out
        n.assert_ranks_hold(k)
    rc, status = n.ctl("status")
    assert all(k["registered"] and k["version"] == 3 and not k["dirty"] for k in status["ranks"]), status


@needs_torch
@pytest.mark.skipif(cuda_devices() < 2, reason=f"needs 2 CUDA GPUs (found {cuda_devices()}): a TP=2 engine with "
                    "one rank per GPU, parameters by CUDA IPC")
@pytest.mark.parametrize("staging", ["host", "device", "direct"])
def test_tp2_engine_on_two_gpus_three_refits_equal_offline(rank_node, staging):
    # Device staging and the converter on rank 0's GPU; rank 1's parts are copied to its GPU in
    # the commit (peer access where the GPUs have it).
    n = rank_node(LLAMA_TP4.replace("size: 4", "size: 2"), llama_tensors, 2, gpus=[0, 1], staging=staging)
    n.start_rank(0)
    n.start_rank(1)
    for k in (1, 2, 3):
        rc, out = n.refit(k)
        assert rc == 0, out
        print(f"refit {k}: pause {out['pause_ms']:.2f} ms, commit {out['commit_ms']:.2f} ms")
        n.assert_ranks_hold(k)
