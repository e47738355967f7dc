"""Model-family refits with real processes: refitd with a deploy/models spec (its sizes from the
checkpoint's config.json), the example engine holding that family's engine layout (POSIX shm;
one process per engine rank), the example trainer pushing a tiny synthetic checkpoint, and
`refitctl convert` as the offline reference."""
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

BIN = Path(os.environ.get("REFIT_BINARY_DIR", "build"))
SRC = Path(os.environ.get("REFIT_SOURCE_DIR", Path(__file__).resolve().parents[3]))
REFITD = BIN / "src/server/refitd"
ENGINE = BIN / "tools/examples/example_engine"
TRAINER = BIN / "tools/examples/example_trainer"
REFITCTL = BIN / "tools/refitctl"  # the refitctl binary
MAKE = Path(__file__).resolve().parent / "make_checkpoints.py"


def wait_for(pred, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def make_checkpoint(family: str, out: Path, seed: int) -> Path:
    """The family's small checkpoint, with its config.json (the real model's, sizes overridden)."""
    subprocess.run([sys.executable, str(MAKE), family, str(out), "--seed", str(seed)], check=True)
    return out


def make_real_checkpoint(family: str, out: Path) -> Path:
    """The real model's shapes and config.json, headers only (sparse files)."""
    subprocess.run([sys.executable, str(MAKE), family, str(out), "--real"], check=True)
    return out


def convert(spec: str, checkpoint: Path, out: Path, engine_layout=False) -> Path:
    args = [str(REFITCTL), "convert", "--spec", spec, str(checkpoint), str(out)]
    if engine_layout:
        args.insert(2, "--engine-layout")
    p = subprocess.run(args, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return out


def tp_size(spec) -> int:
    """The spec's tensor_parallel.size (1 without one)."""
    m = re.search(r"^tensor_parallel:\s*\{size:\s*(\d+)\s*\}", Path(spec).read_text(), re.M)
    return int(m.group(1)) if m else 1


class FamilyNode:
    """refitd with a family spec, its sizes from `checkpoint`'s config.json, plus an engine that
    loaded `checkpoint` in that spec's layout: one example engine per engine rank of the spec's
    tensor_parallel.size, each registering its rank (POSIX shm each)."""

    def __init__(self, tmp: Path, spec: str, checkpoint: Path):
        self.tmp, self.spec = tmp, spec
        self.sock = tmp / "refitd.sock"
        self.address = f"unix:{self.sock}"
        cfg = tmp / "refitd.yaml"
        cfg.write_text(f"listen: {self.address}\nlog_level: debug\nmodel_config: {checkpoint / 'config.json'}\n")
        self.daemon_log = tmp / "refitd.log"
        self.daemon = subprocess.Popen([str(REFITD), "--config", str(cfg), "--model-spec", spec],
                                       stdout=open(self.daemon_log, "w"), stderr=subprocess.STDOUT)
        wait_for(lambda: self.sock.exists() or self.daemon.poll() is not None, what="refitd socket")
        assert self.daemon.poll() is None, self.daemon_log.read_text()
        self.ranks = tp_size(spec)
        self.engines, self.engine_logs, self.shms = [], [], []
        for r in range(self.ranks):
            log = tmp / (f"engine{r}.log" if self.ranks > 1 else "engine.log")
            shm = f"/refit-spec-{uuid.uuid4().hex[:12]}"
            args = [str(ENGINE), "--address", self.address, "--shm", shm, "--spec", spec, "--checkpoint", str(checkpoint)]
            if self.ranks > 1:
                args += ["--tp-rank", str(r)]
            engine = subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT)
            wait_for(lambda: "registered" in log.read_text() or engine.poll() is not None, what="engine registration")
            assert engine.poll() is None, log.read_text()
            self.engines.append(engine)
            self.engine_logs.append(log)
            self.shms.append(shm)
        self.engine, self.engine_log, self.shm = self.engines[0], self.engine_logs[0], self.shms[0]

    def shm_digest(self) -> str:
        h = hashlib.sha256()
        for shm in self.shms:
            h.update(Path("/dev/shm" + shm).read_bytes())
        return h.hexdigest()

    def trainer(self, checkpoint: Path, *args, timeout=120):
        p = subprocess.run([str(TRAINER), "--address", self.address, "--spec", self.spec,
                            "--checkpoint", str(checkpoint), *args],
                           capture_output=True, text=True, timeout=timeout)
        lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
        return p, lines

    def resumed(self):
        """Rank 0's resumes (the ranks resume together)."""
        return [json.loads(l) for l in self.engine_log.read_text().splitlines() if '"resumed"' in l]

    def stop(self):
        for proc in (*self.engines, self.daemon):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=20)


@pytest.fixture
def family_node(tmp_path):
    nodes = []

    def make(spec, checkpoint):
        d = tmp_path / f"node{len(nodes)}"
        d.mkdir()
        n = FamilyNode(d, spec, checkpoint)
        nodes.append(n)
        return n

    yield make
    for n in nodes:
        for p in (*n.engines, n.daemon):
            if p.poll() is None:
                p.kill()
                p.wait()
        for shm in n.shms:
            Path("/dev/shm" + shm).unlink(missing_ok=True)
