"""What the GPU integration tests share: the binaries (tests/harness/refit_harness.py) and the
host-path tests' 20 s wait_for, the GPU count, whether the build has CUDA or NCCL, and
the fixtures that skip, printing why, on a machine without them (`-rs` in CMakeLists.txt shows the
reasons)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "harness"))
import refit_harness as h  # noqa: E402
from refit_harness import BIN, ENGINE, REFITCTL, REFITD, SRC, TRAINER  # noqa: E402,F401


def wait_for(pred, timeout=20.0, what="condition"):
    h.wait_for(pred, timeout, what)


def gpu_count():
    """(number of GPUs nvidia-smi lists, why none when 0)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0, "nvidia-smi not found"
    p = subprocess.run([smi, "-L"], capture_output=True, text=True)
    n = sum(1 for l in p.stdout.splitlines() if l.startswith("GPU "))
    return n, (p.stderr.strip() or "nvidia-smi lists no GPU")


def _cache() -> str:
    path = BIN / "CMakeCache.txt"
    return path.read_text() if path.exists() else ""


def built_with_cuda() -> bool:
    cache = _cache()
    return "CMAKE_CUDA_COMPILER:" in cache and "REFIT_CUDA:BOOL=ON" in cache


def built_with_nccl() -> bool:
    return "REFIT_NCCL_LIBRARY:FILEPATH=/" in _cache()


@pytest.fixture
def require_gpu():
    """Skips without a CUDA device or without a CUDA build of refitd."""
    n, why = gpu_count()
    if n == 0:
        pytest.skip(f"no CUDA device: {why}")
    if not built_with_cuda():
        pytest.skip("refitd was built without CUDA")


@pytest.fixture
def require_two_gpus():
    """Skips with fewer than two CUDA devices or without NCCL in the build."""
    n, why = gpu_count()
    if n < 2:
        pytest.skip(f"needs 2 CUDA devices, {n} present ({why})" if n == 0 else f"needs 2 CUDA devices, {n} present")
    if not built_with_nccl():
        pytest.skip("refitd was built without NCCL")


@pytest.fixture
def nccl_placement(monkeypatch):
    """Where an NCCL test puts refitd and its trainers (refit_harness.nccl_placement: GPU 1 and
    GPU 0 with two GPUs; with one, both on GPU 0, each process with its own NCCL_HOSTID over
    loopback; correctness only). Skips without a GPU or without NCCL."""
    n, why = gpu_count()
    if n == 0:
        pytest.skip(f"no CUDA device: {why}")
    if not built_with_nccl():
        pytest.skip("refitd was built without NCCL")
    return h.nccl_placement(n, monkeypatch)


class GpuNode:
    """refitd with `staging: device` (or `staging`) and the data plane `transport` on GPU `device`, and the
    example engine (CUDA IPC registration) on the same GPU, in `tmp`. `trainer(*args)` runs the
    example trainer on GPU `trainer_gpu`; `engine_matches(seed)` is refitctl verify against the
    offline conversion of refit 0 of `seed`. `spec`: a model spec file for refitd, the engine and
    the trainer (the demo spec when empty). `env`: variables added to refitd's environment (e.g.
    REFIT_FAILPOINTS)."""

    def __init__(self, tmp: Path, transport: str, device: int, trainer_gpu: int = 0, deadline_ms: int = 60000,
                 socket: str = "", spec: str = "", staging: str = "device", engine_args=(), env=None):
        tmp.mkdir(parents=True, exist_ok=True)
        self.tmp = tmp
        self.trainer_gpu = trainer_gpu
        self.spec_flags = ["--spec", spec] if spec else []
        self.sock = tmp / "refitd.sock"
        self.address = f"unix:{self.sock}"
        cfg = tmp / "refitd.yaml"
        extra = f"  cuda_ipc_socket: {socket}\n" if socket else ""
        cfg.write_text(f"listen: {self.address}\nstaging: {staging}\nlog_level: debug\n"
                       + (f"model_spec: {spec}\n" if spec else "") +
                       f"data_plane:\n  transport: {transport}\n  device: {device}\n{extra}"
                       f"limits:\n  session_deadline_ms: {deadline_ms}\n  bucket_bytes: 1048576\n")
        self.log = tmp / "refitd.log"
        self.engine = None
        self.daemon = h.start_refitd(cfg, self.log, env={**os.environ, **(env or {})}, ready=self.sock.exists,
                                     timeout=20)
        self.engine_log = tmp / "engine.log"
        self.engine = h.start_engine(self.address, self.engine_log, "--gpu", device, *engine_args, *self.spec_flags,
                                     timeout=20, logs=(self.log,))

    def trainer(self, *args, timeout=180, env=None):
        return h.run_trainer(self.address, "--gpu", self.trainer_gpu, *self.spec_flags, *args, timeout=timeout,
                             env={**os.environ, **(env or {})})

    def engine_matches(self, seed):
        d = self.tmp / f"expected-{seed}"
        d.mkdir(exist_ok=True)
        subprocess.run([str(TRAINER), "--dump", str(d), "--seed", str(seed)], check=True, capture_output=True)
        p = subprocess.run([str(REFITCTL), "verify", str(d / "converted.safetensors"), "--address", self.address,
                            "--json"], capture_output=True, text=True)
        return json.loads(p.stdout.splitlines()[-1])

    def close(self):
        for proc in (self.engine, self.daemon):
            h.stop(proc, kill_on_timeout=True)


def node_fixture(tmp_path, **defaults):
    """A generator for a node_factory fixture: make(**kw) starts a GpuNode (defaults updated by
    kw; `tmp`: its directory, tmp_path by default); every node is closed after the test."""
    nodes = []

    def make(tmp=None, **kw):
        nodes.append(GpuNode(tmp or tmp_path, **dict(defaults, **kw)))
        return nodes[-1]

    yield make
    for n in nodes:
        n.close()
