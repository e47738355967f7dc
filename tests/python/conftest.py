"""Real processes on loopback for the Python package's tests: refitd (the C++ daemon) and an
engine process (engine_main.py, refit.ModuleEngine); the trainer is the test process itself
(refit.TrainerClient). Tests that need torch or transformers skip, with the reason, without them."""
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "harness"))
import refit_harness as h  # noqa: E402
from refit_harness import BIN, REFITD, spec_tp_size, wait_for  # noqa: E402,F401

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


def events(log: Path):
    return h.json_lines(log.read_text())


class ExampleEngines:
    """tools/examples/example_engine holding checkpoint `ckpt` in `spec`'s engine layout (its sizes
    from ckpt's config.json), one process per engine rank of the spec's tensor_parallel.size, each
    registering its rank; POSIX shm each."""

    def __init__(self, tmp: Path, address: str, spec, ckpt: Path, name: str = "engine"):
        self.procs, self.shms, self.logs = h.start_rank_engines(tmp, address, spec, ckpt, name=name, shm_kind=name)

    def digest(self) -> str:
        """Every rank's bytes, read from shared memory directly (not through refitd)."""
        return h.shm_digest(*self.shms)

    def stop(self, kill=False):
        for p in self.procs:
            if kill:
                h.kill(p)
            else:
                h.stop(p)
        h.unlink_shm(*self.shms)


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
        self.proc = h.start_refitd(cfg, self.log, env=env, ready=self.sock.exists)

    def stop(self):
        h.stop(self.proc)


class Engine:
    """engine_main.py in its own process; its snapshots land in tmp/out."""

    def __init__(self, tmp: Path, address: str, model: str, seed=0, dtype="f32"):
        self.out = tmp / "out"
        self.out.mkdir()
        self.shm = h.new_shm("pytest")
        self.log = tmp / "engine.log"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PYTHON_PKG), os.environ.get("PYTHONPATH", "")]))
        self.proc = h.start([sys.executable, HERE / "engine_main.py", "--address", address, "--model", model, "--out",
                             self.out, "--seed", seed, "--dtype", dtype, "--shm", self.shm], self.log,
                            lambda: any(e["event"] == "registered" for e in events(self.log)), "engine registration",
                            env=env)

    def shm_digest(self) -> str:
        """The engine's bytes, read from its shared memory directly (not through refitd)."""
        return h.shm_digest(self.shm)

    def wait_version(self, v):
        wait_for(lambda: any(e.get("version") == v for e in events(self.log) if e["event"] == "resumed")
                 or self.proc.poll() is not None, what=f"engine snapshot of version {v}")
        assert self.proc.poll() is None, self.log.read_text()

    def snapshot(self, v):
        import torch

        self.wait_version(v) if v else None
        return torch.load(self.out / f"v{v}.pt")

    def stop(self):
        h.stop(self.proc, timeout=30)
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
        h.kill(p.proc)
        if isinstance(p, Engine):
            h.unlink_shm(p.shm)


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path, "toy")
    yield d
    h.kill(d.proc)
