"""Real processes on loopback: refitd, the example engine (POSIX shm) and the example trainer."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "harness"))
import refit_harness as h  # noqa: E402
from refit_harness import BIN, ENGINE, REFITD, SRC, TRAINER  # noqa: E402,F401


def wait_for(pred, timeout=20.0, what="condition"):
    h.wait_for(pred, timeout, what)


class Node:
    """One rollout node: refitd + example engine, in a temp dir."""

    def __init__(self, tmp: Path, config: str = "", spec: str | None = None):
        self.tmp = tmp
        self.sock = tmp / "refitd.sock"
        self.address = f"unix:{self.sock}"
        cfg = tmp / "refitd.yaml"
        cfg.write_text(f"listen: {self.address}\nlog_level: debug\n" + config)
        self.daemon_log = tmp / "refitd.log"
        self.daemon = h.start_refitd(cfg, self.daemon_log, *(["--model-spec", spec] if spec else []),
                                     ready=self.sock.exists, timeout=20)
        self.engine_log = tmp / "engine.log"
        self.shm = h.new_shm("test")
        self.engine = h.start_engine(self.address, self.engine_log, "--shm", self.shm, timeout=20)

    def shm_digest(self) -> str:
        """The engine's bytes, read straight from its shared memory (not through refitd)."""
        return h.shm_digest(self.shm)

    def trainer(self, *args, timeout=60, check_rc=None):
        p, lines = h.run_trainer(self.address, *args, timeout=timeout)
        if check_rc is not None:
            assert p.returncode == check_rc, p.stdout + p.stderr
        return p, lines

    def resumed(self):
        return [json.loads(l) for l in self.engine_log.read_text().splitlines() if '"resumed"' in l]

    def stop(self):
        """Stops engine then daemon; returns the engine's exit report."""
        exit_report = None
        h.stop(self.engine)
        for l in self.engine_log.read_text().splitlines():
            if '"exit"' in l:
                exit_report = json.loads(l)
        h.stop(self.daemon)
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
        h.kill(n.engine)
        h.kill(n.daemon)
        h.unlink_shm(n.shm)
