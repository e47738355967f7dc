"""Shared by the deploy/ checks: where things are, the metric families refitd registers, and a
real refitd started from the deploy configuration (paths moved into a temp dir)."""
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

SRC = Path(os.environ.get("REFIT_SOURCE_DIR", Path(__file__).resolve().parents[2]))
DEPLOY = SRC / "deploy"
BUILD = Path(os.environ.get("REFIT_BINARY_DIR", SRC / "build"))
REFITD = Path(os.environ.get("REFITD", BUILD / "src/server/refitd"))
ENGINE = BUILD / "tools/examples/example_engine"
TRAINER = BUILD / "tools/examples/example_trainer"


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
        self.shm = f"/refit-deploy-test-{uuid.uuid4().hex[:12]}"
        self.log_path = tmp / "refitd.log"
        self.proc = subprocess.Popen([str(need_refitd()), "--config", str(config)],
                                     stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        self.admin_port = None
        while time.monotonic() < deadline and self.proc.poll() is None:
            m = re.search(r"event=listening .*admin_port=(\d+)", self.log_path.read_text())
            if m:
                self.admin_port = int(m.group(1))
                break
            time.sleep(0.02)
        assert self.admin_port, f"refitd did not start:\n{self.log_path.read_text()}"

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}{path}", timeout=10) as r:
                return r.status, r.read().decode().strip()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode().strip()

    def start_engine(self):
        log = self.tmp / "engine.log"
        self.engine = subprocess.Popen([str(need_binary(ENGINE)), "--address", self.address, "--shm", self.shm],
                                       stdout=open(log, "w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.engine.poll() is None and "registered" not in log.read_text():
            time.sleep(0.02)
        assert self.engine.poll() is None and "registered" in log.read_text(), log.read_text()

    def refit(self):
        p = subprocess.run([str(need_binary(TRAINER)), "--address", self.address, "--refits", "1"],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr

    def stop(self) -> int:
        if self.engine and self.engine.poll() is None:
            self.engine.send_signal(signal.SIGTERM)
            try:
                self.engine.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.engine.kill()
                self.engine.wait()
        Path("/dev/shm" + self.shm).unlink(missing_ok=True)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture
def systemd_refitd(tmp_path):
    """refitd running deploy/systemd/refitd.yaml with deploy/models/demo-llama.yaml."""
    config = deploy_config_for_test((DEPLOY / "systemd/refitd.yaml").read_text(), tmp_path,
                                    DEPLOY / "models/demo-llama.yaml")
    daemon = LiveRefitd(tmp_path, config)
    yield daemon
    daemon.stop()
