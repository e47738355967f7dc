"""Model-family refits with real processes: refitd with a deploy/models spec (its sizes from the
checkpoint's config.json), the example engine holding that family's engine layout (POSIX shm;
one process per engine rank), the example trainer pushing a tiny synthetic checkpoint, and
`refitctl convert` as the offline reference."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "harness"))
import refit_harness as h  # noqa: E402
from refit_harness import BIN, ENGINE, REFITCTL, REFITD, SRC, TRAINER, wait_for  # noqa: E402,F401

MAKE = Path(__file__).resolve().parent / "make_checkpoints.py"


def make_checkpoint(family: str, out: Path, seed: int, overrides=None) -> Path:
    """The family's small checkpoint, with its config.json (the real model's, sizes overridden, and
    `overrides` {key: value} on top)."""
    sets = [a for k, v in (overrides or {}).items() for a in ("--set", f"{k}={json.dumps(v)}")]
    subprocess.run([sys.executable, str(MAKE), family, str(out), "--seed", str(seed), *sets], check=True)
    return out


def make_real_checkpoint(family: str, out: Path) -> Path:
    """The real model's shapes and config.json, headers only (sparse files)."""
    subprocess.run([sys.executable, str(MAKE), family, str(out), "--real"], check=True)
    return out


def convert(spec: str, checkpoint: Path, out: Path, engine_layout=False, tp_rank=None, tp_size=2) -> Path:
    """`refitctl convert`; with `tp_rank`, that rank's engine layout of an engine of `tp_size`."""
    args = [str(REFITCTL), "convert", "--spec", spec, str(checkpoint), str(out)]
    if engine_layout:
        args.insert(2, "--engine-layout")
    if tp_rank is not None:
        args[3:3] = ["--tp-rank", str(tp_rank), "--tp-size", str(tp_size)]
    p = subprocess.run(args, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return out


spec_tp_size = h.spec_tp_size


class FamilyNode:
    """refitd with a family spec, its sizes from `checkpoint`'s config.json, plus an engine that
    loaded `checkpoint` in that spec's layout: one example engine per engine rank of the spec's
    tensor_parallel.size (`tp_size` when given: the engine's size, for a spec that leaves it to the
    engine), each registering its rank (POSIX shm each)."""

    def __init__(self, tmp: Path, spec: str, checkpoint: Path, tp_size=None):
        self.tmp, self.spec = tmp, spec
        self.sock = tmp / "refitd.sock"
        self.address = f"unix:{self.sock}"
        cfg = tmp / "refitd.yaml"
        cfg.write_text(f"listen: {self.address}\nlog_level: debug\nmodel_config: {checkpoint / 'config.json'}\n")
        self.daemon_log = tmp / "refitd.log"
        self.daemon = h.start_refitd(cfg, self.daemon_log, "--model-spec", spec, ready=self.sock.exists)
        self.ranks = tp_size or spec_tp_size(spec)
        self.engines, self.shms, self.engine_logs = h.start_rank_engines(tmp, self.address, spec, checkpoint,
                                                                         shm_kind="spec", tp_size=self.ranks)
        self.engine, self.engine_log, self.shm = self.engines[0], self.engine_logs[0], self.shms[0]

    def shm_digest(self) -> str:
        return h.shm_digest(*self.shms)

    def trainer(self, checkpoint: Path, *args, timeout=120):
        size = ["--tp-size", self.ranks] if self.ranks > 1 else []
        return h.run_trainer(self.address, "--spec", self.spec, "--checkpoint", checkpoint, *size, *args,
                             timeout=timeout)

    def resumed(self):
        """Rank 0's resumes (the ranks resume together)."""
        return [json.loads(l) for l in self.engine_log.read_text().splitlines() if '"resumed"' in l]

    def stop(self):
        for proc in (*self.engines, self.daemon):
            h.stop(proc)


@pytest.fixture
def family_node(tmp_path):
    nodes = []

    def make(spec, checkpoint, tp_size=None):
        d = tmp_path / f"node{len(nodes)}"
        d.mkdir()
        n = FamilyNode(d, spec, checkpoint, tp_size=tp_size)
        nodes.append(n)
        return n

    yield make
    for n in nodes:
        for p in (*n.engines, n.daemon):
            h.kill(p)
        h.unlink_shm(*n.shms)
