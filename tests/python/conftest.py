"""Real processes on loopback for the Python package's tests: refitd (the C++ daemon) and an
engine process (engine_main.py, refit.ModuleEngine); the trainer is the test process itself
(refit.TrainerClient). Tests that need torch or transformers skip, with the reason, without them."""
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
BIN = Path(os.environ.get("REFIT_BINARY_DIR", HERE.parents[1] / "build"))
REFITD = BIN / "src/server/refitd"
SRC_DIR = HERE.parents[1]
PYTHON_PKG = SRC_DIR / "python"
sys.path.insert(0, str(PYTHON_PKG))
sys.path.insert(0, str(HERE))


def have(module: str) -> bool:
    try:
        __import__(module)
        return True
    except Exception:
        return False


needs_torch = pytest.mark.skipif(not have("torch"), reason=f"torch is not importable by {sys.executable} "
                                 "(tools/setup installs Debian's python3-torch for /usr/bin/python3)")
needs_transformers = pytest.mark.skipif(not have("transformers"), reason=f"transformers is not importable by "
                                        f"{sys.executable} (tools/setup installs it into the test venv)")


def wait_for(pred, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def events(log: Path):
    return [json.loads(l) for l in log.read_text().splitlines() if l.startswith("{")]


def spec_tp_size(spec) -> int:
    """A spec's tensor_parallel.size (1 without one)."""
    m = re.search(r"^tensor_parallel:\s*\{size:\s*(\d+)\s*\}", Path(spec).read_text(), re.M)
    return int(m.group(1)) if m else 1


class ExampleEngines:
    """tools/examples/example_engine holding checkpoint `ckpt` in `spec`'s engine layout (its sizes
    from ckpt's config.json), one process per engine rank of the spec's tensor_parallel.size, each
    registering its rank; POSIX shm each."""

    def __init__(self, tmp: Path, address: str, spec, ckpt: Path, name: str = "engine"):
        self.procs, self.shms, self.logs = [], [], []
        ranks = spec_tp_size(spec)
        for r in range(ranks):
            shm = f"/refit-{name}-{uuid.uuid4().hex[:12]}"
            log = tmp / (f"{name}{r}.log" if ranks > 1 else f"{name}.log")
            args = [str(BIN / "tools/examples/example_engine"), "--address", address, "--shm", shm, "--spec", str(spec),
                    "--checkpoint", str(ckpt)]
            if ranks > 1:
                args += ["--tp-rank", str(r)]
            proc = subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT)
            self.procs.append(proc)
            self.shms.append(shm)
            self.logs.append(log)
            wait_for(lambda: "registered" in log.read_text() or proc.poll() is not None, what="engine registration")
            assert proc.poll() is None, log.read_text()

    def digest(self) -> str:
        """Every rank's bytes, read from shared memory directly (not through refitd)."""
        h = hashlib.sha256()
        for shm in self.shms:
            h.update(Path("/dev/shm" + shm).read_bytes())
        return h.hexdigest()

    def stop(self, kill=False):
        for p in self.procs:
            if p.poll() is None:
                if kill:
                    p.kill()
                    p.wait()
                else:
                    p.send_signal(signal.SIGTERM)
                    p.wait(timeout=20)
        for shm in self.shms:
            Path("/dev/shm" + shm).unlink(missing_ok=True)


class Daemon:
    """refitd serving `model` (every tensor `format: auto`) on a Unix socket in `tmp`, with
    `failpoints` armed (REFIT_FAILPOINTS: "name=action[@N];...", src/common/failpoint.h)."""

    def __init__(self, tmp: Path, model: str, config: str = "", failpoints: str = ""):
        self.tmp = tmp
        self.sock = tmp / "refitd.sock"
        self.address = f"unix:{self.sock}"
        spec = tmp / "spec.yaml"
        spec.write_text(f"model: {model}\ndefaults:\n  format: auto\n")
        cfg = tmp / "refitd.yaml"
        cfg.write_text(f"listen: {self.address}\nlog_level: debug\nmodel_spec: {spec}\n" + config)
        self.log = tmp / "refitd.log"
        env = dict(os.environ)
        env.pop("REFIT_FAILPOINTS", None)
        if failpoints:
            env["REFIT_FAILPOINTS"] = failpoints
        self.proc = subprocess.Popen([str(REFITD), "--config", str(cfg)], stdout=open(self.log, "w"),
                                     stderr=subprocess.STDOUT, env=env)
        wait_for(lambda: self.sock.exists() or self.proc.poll() is not None, what="refitd socket")
        assert self.proc.poll() is None, self.log.read_text()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=20)


class Engine:
    """engine_main.py in its own process; its snapshots land in tmp/out."""

    def __init__(self, tmp: Path, address: str, model: str, seed=0, dtype="f32"):
        self.out = tmp / "out"
        self.out.mkdir()
        self.shm = f"/refit-pytest-{uuid.uuid4().hex[:12]}"
        self.log = tmp / "engine.log"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PYTHON_PKG), os.environ.get("PYTHONPATH", "")]))
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "engine_main.py"), "--address", address, "--model", model, "--out",
             str(self.out), "--seed", str(seed), "--dtype", dtype, "--shm", self.shm],
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT, env=env)
        wait_for(lambda: any(e["event"] == "registered" for e in events(self.log)) or self.proc.poll() is not None,
                 what="engine registration")
        assert self.proc.poll() is None, self.log.read_text()

    def shm_digest(self) -> str:
        """The engine's bytes, read from its shared memory directly (not through refitd)."""
        return hashlib.sha256(Path("/dev/shm" + self.shm).read_bytes()).hexdigest()

    def wait_version(self, v):
        wait_for(lambda: any(e.get("version") == v for e in events(self.log) if e["event"] == "resumed")
                 or self.proc.poll() is not None, what=f"engine snapshot of version {v}")
        assert self.proc.poll() is None, self.log.read_text()

    def snapshot(self, v):
        import torch

        self.wait_version(v) if v else None
        return torch.load(self.out / f"v{v}.pt")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)
        return [e for e in events(self.log) if e["event"] == "exit"]


@pytest.fixture
def node(tmp_path):
    """make(model, subdir=None, config="", failpoints="", **engine_kwargs) -> (Daemon, Engine); both
    are stopped after the test; `config` is appended to refitd's, `failpoints` armed in it. Several
    nodes in one test each need their own `subdir`."""
    made = []

    def make(model, subdir=None, config="", failpoints="", **kwargs):
        where = tmp_path
        if subdir is not None:
            where = tmp_path / subdir
            where.mkdir()
        d = Daemon(where, model, config, failpoints)
        made.append(d)
        e = Engine(where, d.address, model, **kwargs)
        made.append(e)
        return d, e

    yield make
    for p in reversed(made):
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait()
        if isinstance(p, Engine):
            Path("/dev/shm" + p.shm).unlink(missing_ok=True)


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path, "toy")
    yield d
    if d.proc.poll() is None:
        d.proc.kill()
        d.proc.wait()
