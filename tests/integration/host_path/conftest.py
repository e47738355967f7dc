"""Real processes on loopback: refitd, the example engine (POSIX shm) and the example trainer."""
import hashlib
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

BIN = Path(os.environ.get("REFIT_BINARY_DIR", "build"))
SRC = Path(os.environ.get("REFIT_SOURCE_DIR", "."))
REFITD = BIN / "src/server/refitd"
ENGINE = BIN / "tools/examples/example_engine"
TRAINER = BIN / "tools/examples/example_trainer"


def wait_for(pred, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class Node:
    """One rollout node: refitd + example engine, in a temp dir."""

    def __init__(self, tmp: Path, config: str = "", spec: str | None = None):
        self.tmp = tmp
        self.sock = tmp / "refitd.sock"
        self.address = f"unix:{self.sock}"
        cfg = tmp / "refitd.yaml"
        cfg.write_text(f"listen: {self.address}\nlog_level: debug\n" + config)
        args = [str(REFITD), "--config", str(cfg)]
        if spec:
            args += ["--model-spec", spec]
        self.daemon_log = tmp / "refitd.log"
        self.daemon = subprocess.Popen(args, stdout=open(self.daemon_log, "w"), stderr=subprocess.STDOUT)
        wait_for(lambda: self.sock.exists() or self.daemon.poll() is not None, what="refitd socket")
        assert self.daemon.poll() is None, self.daemon_log.read_text()
        self.engine_log = tmp / "engine.log"
        self.shm = f"/refit-test-{uuid.uuid4().hex[:12]}"
        self.engine = subprocess.Popen([str(ENGINE), "--address", self.address, "--shm", self.shm],
                                       stdout=open(self.engine_log, "w"), stderr=subprocess.STDOUT)
        wait_for(lambda: "registered" in self.engine_log.read_text() or self.engine.poll() is not None,
                 what="engine registration")
        assert self.engine.poll() is None, self.engine_log.read_text()

    def shm_digest(self) -> str:
        """The engine's bytes, read straight from its shared memory (not through refitd)."""
        return hashlib.sha256(Path("/dev/shm" + self.shm).read_bytes()).hexdigest()

    def trainer(self, *args, timeout=60, check_rc=None):
        p = subprocess.run([str(TRAINER), "--address", self.address, *args], capture_output=True, text=True,
                           timeout=timeout)
        lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
        if check_rc is not None:
            assert p.returncode == check_rc, p.stdout + p.stderr
        return p, lines

    def resumed(self):
        return [json.loads(l) for l in self.engine_log.read_text().splitlines() if '"resumed"' in l]

    def stop(self):
        """Stops engine then daemon; returns the engine's exit report."""
        exit_report = None
        if self.engine.poll() is None:
            self.engine.send_signal(signal.SIGTERM)
            self.engine.wait(timeout=20)
        for l in self.engine_log.read_text().splitlines():
            if '"exit"' in l:
                exit_report = json.loads(l)
        if self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
            self.daemon.wait(timeout=20)
        return exit_report


@pytest.fixture
def node_factory(tmp_path):
    nodes = []

    def make(config="", spec=None):
        d = tmp_path / f"node{len(nodes)}"
        d.mkdir()
        n = Node(d, config, spec)
        nodes.append(n)
        return n

    yield make
    for n in nodes:
        for p in (n.engine, n.daemon):
            if p.poll() is None:
                p.kill()
                p.wait()
        Path("/dev/shm" + n.shm).unlink(missing_ok=True)
