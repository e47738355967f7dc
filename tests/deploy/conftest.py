"""Shared by the deploy/ checks: where things are, the metric families refitd registers, and a
real refitd started from the deploy configuration (paths moved into a temp dir)."""
import os
import re
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))
import refit_harness as h  # noqa: E402

SRC = h.SRC
DEPLOY = SRC / "deploy"
BUILD = h.BIN
REFITD = Path(os.environ.get("REFITD", h.REFITD))
ENGINE = h.ENGINE
TRAINER = h.TRAINER


def need_tool(name: str) -> str:
    """The path of a tool tools/setup installs; a missing one fails the test, naming it."""
    path = shutil.which(name)
    assert path, f"'{name}' is not on PATH; tools/setup installs it"
    return path


def need_binary(path: Path) -> Path:
    assert path.is_file() and os.access(path, os.X_OK), f"{path} not found; build the {path.name} target"
    return path


def need_refitd() -> Path:
    return need_binary(REFITD)


def registered_families() -> dict[str, str]:
    """name -> type of every family refitd registers (RefitMetrics::Register, the listeners'
    ListenerMetrics::Register and the process_* families), read from their source."""
    text = "".join((SRC / f).read_text() for f in ("src/metrics/refit_metrics.cc", "src/server/connection_limits.cc",
                                                    "src/metrics/process_metrics.cc"))
    found = re.findall(r'registry\.Add(Counter|Gauge|Histogram)\(\s*"([A-Za-z_:][\w:]*)"', text)
    assert found, "no registrations found in src/metrics/refit_metrics.cc"
    return {name: kind.lower() for kind, name in found}


def series_names(families: dict[str, str]) -> set[str]:
    """The sample names a scrape can contain: a histogram x gives x_bucket, x_sum, x_count."""
    names = set()
    for name, kind in families.items():
        if kind == "histogram":
            names |= {name + "_bucket", name + "_sum", name + "_count"}
        else:
            names.add(name)
    return names


def families_in_exposition(text: str) -> dict[str, str]:
    """name -> type from the # TYPE lines of a Prometheus text exposition (families without
    any series yet still have one)."""
    return {m.group(1): m.group(2) for m in re.finditer(r"^# TYPE (\S+) (\S+)$", text, re.M)}


def deploy_config_for_test(config_text: str, tmp: Path, spec_path: Path) -> Path:
    """A copy of a deploy config that runs unprivileged on this machine: control socket in
    `tmp`, admin endpoint on a free loopback port, the model spec at `spec_path`. Every other
    key keeps its deploy value."""
    cfg = yaml.safe_load(config_text)
    cfg["listen"] = f"unix:{tmp / 'refitd.sock'}"
    cfg["admin"] = {"listen": "127.0.0.1:0"}
    cfg["model_spec"] = str(spec_path)
    out = tmp / "refitd.yaml"
    out.write_text(yaml.safe_dump(cfg))
    return out


class LiveRefitd:
    """refitd, and on request the example engine (demo model in POSIX shm) and one refit by the
    example trainer, so that every metric family has series."""

    def __init__(self, tmp: Path, config: Path):
        self.tmp = tmp
        self.address = yaml.safe_load(config.read_text())["listen"]
        self.engine = None
        self.shm = h.new_shm("deploy-test")
        self.log_path = tmp / "refitd.log"
        self.proc = h.start([need_refitd(), "--config", config], self.log_path, lambda: self._admin_port() is not None,
                            "refitd listening")
        self.admin_port = self._admin_port()

    def _admin_port(self) -> int | None:
        m = re.search(r"event=listening .*admin_port=(\d+)", self.log_path.read_text())
        return int(m.group(1)) if m else None

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}{path}", timeout=10) as r:
                return r.status, r.read().decode().strip()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode().strip()

    def start_engine(self):
        need_binary(ENGINE)
        self.engine = h.start_engine(self.address, self.tmp / "engine.log", "--shm", self.shm)

    def refit(self):
        need_binary(TRAINER)
        p, _ = h.run_trainer(self.address, "--refits", "1", timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr

    def stop(self) -> int:
        h.stop(self.engine, kill_on_timeout=True)
        h.unlink_shm(self.shm)
        h.stop(self.proc, kill_on_timeout=True)
        return self.proc.returncode


@pytest.fixture
def systemd_refitd(tmp_path):
    """refitd running deploy/systemd/refitd.yaml with deploy/models/demo-llama.yaml."""
    config = deploy_config_for_test((DEPLOY / "systemd/refitd.yaml").read_text(), tmp_path,
                                    DEPLOY / "models/demo-llama.yaml")
    daemon = LiveRefitd(tmp_path, config)
    yield daemon
    daemon.stop()
