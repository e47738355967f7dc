"""Model-family refits with real processes: refitd with a deploy/models spec, the example engine
holding that family's engine layout (POSIX shm), the example trainer pushing a tiny synthetic
checkpoint, and `refitctl convert` as the offline reference."""
import hashlib
import json
import os
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
    subprocess.run([sys.executable, str(MAKE), family, str(out), "--seed", str(seed)], check=True)
    return out


def convert(spec: str, checkpoint: Path, out: Path, engine_layout=False) -> Path:
    args = [str(REFITCTL), "convert", "--spec", spec, str(checkpoint), str(out)]
    if engine_layout:
        args.insert(2, "--engine-layout")
    p = subprocess.run(args, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return out


class FamilyNode:
    """refitd with a family spec plus an engine that loaded `checkpoint` in that spec's layout."""

    def __init__(self, tmp: Path, spec: str, checkpoint: Path):
        self.tmp, self.spec = tmp, spec
        self.sock = tmp / "refitd.sock"
        self.address = f"unix:{self.sock}"
        cfg = tmp / "refitd.yaml"
        cfg.write_text(f"listen: {self.address}\nlog_level: debug\n")
        self.daemon_log = tmp / "refitd.log"
        self.daemon = subprocess.Popen([str(REFITD), "--config", str(cfg), "--model-spec", spec],
                                       stdout=open(self.daemon_log, "w"), stderr=subprocess.STDOUT)
        wait_for(lambda: self.sock.exists() or self.daemon.poll() is not None, what="refitd socket")
        assert self.daemon.poll() is None, self.daemon_log.read_text()
        self.engine_log = tmp / "engine.log"
        self.shm = f"/refit-spec-{uuid.uuid4().hex[:12]}"
        self.engine = subprocess.Popen([str(ENGINE), "--address", self.address, "--shm", self.shm,
                                        "--spec", spec, "--checkpoint", str(checkpoint)],
                                       stdout=open(self.engine_log, "w"), stderr=subprocess.STDOUT)
        wait_for(lambda: "registered" in self.engine_log.read_text() or self.engine.poll() is not None,
                 what="engine registration")
        assert self.engine.poll() is None, self.engine_log.read_text()

    def shm_digest(self) -> str:
        return hashlib.sha256(Path("/dev/shm" + self.shm).read_bytes()).hexdigest()

    def trainer(self, checkpoint: Path, *args, timeout=120):
        p = subprocess.run([str(TRAINER), "--address", self.address, "--spec", self.spec,
                            "--checkpoint", str(checkpoint), *args],
                           capture_output=True, text=True, timeout=timeout)
        lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
        return p, lines

    def resumed(self):
        return [json.loads(l) for l in self.engine_log.read_text().splitlines() if '"resumed"' in l]

    def stop(self):
        for proc in (self.engine, self.daemon):
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
        for p in (n.engine, n.daemon):
            if p.poll() is None:
                p.kill()
                p.wait()
        Path("/dev/shm" + n.shm).unlink(missing_ok=True)
