"""Fault scenarios with real processes: refitd (restartable, with failpoints), an example engine
that survives refitd (--reconnect) and example trainers. The engine's bytes are read straight
from its shared memory, never through refitd."""
import hashlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

BIN = Path(os.environ.get("REFIT_BINARY_DIR", "build"))
SRC = Path(os.environ.get("REFIT_SOURCE_DIR", "."))
REFITD = BIN / "src/server/refitd"
ENGINE = BIN / "tools/examples/example_engine"
TRAINER = BIN / "tools/examples/example_trainer"


def sanitized_build():
    """Whether BIN is the sanitizer stage's build (ASAN+UBSAN)."""
    cache = BIN / "CMakeCache.txt"
    return cache.exists() and re.search(r"^REFIT_SANITIZE:\w+=.*undefined", cache.read_text(), re.M) is not None


def wait_for(pred, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def committed_ok(lines, version):
    """One refit line: committed as `version`, the engine's bytes equal to the offline conversion."""
    return (len(lines) == 1 and lines[0]["outcome"] == "committed" and lines[0]["version"] == version
            and lines[0]["engine_matches_expected"])


def silent_trainer_aborted_at_deadline(node):
    """A trainer that begins and never sends: waits until refitd aborts it at the session deadline."""
    t = node.trainer_async("--fault", "silent")
    try:
        wait_for(lambda: 'reason="session deadline passed' in node.log(), what="deadline abort")
    finally:
        t.kill()
        t.wait()


def finish(node, versions):
    """The engine served only whole versions, ended clean, and resumed exactly `versions`."""
    assert node.resumed_versions() == versions
    report = node.stop()
    assert report is not None and report["mixed"] == 0, report
    assert report["dirty"] is False, report


class FaultNode:
    """refitd + an engine on a temp Unix socket. refitd can be killed and restarted with other
    failpoints; the engine re-registers on its own."""

    def __init__(self, tmp: Path, config: str = "", failpoints: str = "", listen: str = "", env=None,
                 engine_args=()):
        self.tmp = tmp
        self.engine_args = list(engine_args)
        self.sock = tmp / "refitd.sock"
        self.address = listen or f"unix:{self.sock}"
        self.env = dict(os.environ, **(env or {}))
        self.config = tmp / "refitd.yaml"
        self.config.write_text(f"listen: {self.address}\nlog_level: debug\n" + config)
        self.runs = 0
        self.daemon = None
        self.start_daemon(failpoints)
        self.engine = None
        self.engines = 0
        self.shms = []
        self.start_engine()

    # --- refitd ---
    def start_daemon(self, failpoints: str = ""):
        self.runs += 1
        self.daemon_log = self.tmp / f"refitd.{self.runs}.log"
        env = dict(self.env)
        env.pop("REFIT_FAILPOINTS", None)
        if failpoints:
            env["REFIT_FAILPOINTS"] = failpoints
        self.sock.unlink(missing_ok=True)
        self.daemon = subprocess.Popen([str(REFITD), "--config", str(self.config)], env=env,
                                       stdout=open(self.daemon_log, "w"), stderr=subprocess.STDOUT)
        wait_for(lambda: "event=listening" in self.daemon_log.read_text() or self.daemon.poll() is not None,
                 what="refitd listening")
        assert self.daemon.poll() is None, self.daemon_log.read_text()

    def log(self) -> str:
        return self.daemon_log.read_text()

    def admin(self, path: str):
        port = re.search(r"admin_port=(\d+)", self.log()).group(1)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def wait_daemon_dead(self, timeout=30):
        wait_for(lambda: self.daemon.poll() is not None, timeout=timeout, what="refitd to die")
        return self.daemon.returncode

    # --- engine ---
    def start_engine(self):
        self.engines += 1
        self.engine_log = self.tmp / f"engine.{self.engines}.log"
        self.shm = f"/refit-fault-{uuid.uuid4().hex[:12]}"
        self.shms.append(self.shm)
        self.engine = subprocess.Popen([str(ENGINE), "--address", self.address, "--shm", self.shm, "--reconnect",
                                        *self.engine_args],
                                       stdout=open(self.engine_log, "w"), stderr=subprocess.STDOUT, env=self.env)
        wait_for(lambda: '"registered"' in self.engine_log.read_text() or self.engine.poll() is not None,
                 what="engine registration")
        assert self.engine.poll() is None, self.engine_log.read_text()
        self.wait_registered()

    def wait_registered(self):
        wait_for(lambda: "event=engine_registered" in self.log(), what="engine registered with refitd")

    def events(self, kind):
        return [json.loads(l) for l in self.engine_log.read_text().splitlines() if f'"{kind}"' in l]

    def resumed_versions(self):
        return [e["version"] for e in self.events("resumed")]

    def resumed_tags(self):
        return [e["tag"] for e in self.events("resumed")]

    def shm_digest(self) -> str:
        return hashlib.sha256(Path("/dev/shm" + self.shm).read_bytes()).hexdigest()

    # --- trainers ---
    def trainer(self, *args, timeout=120, env=None, **kwargs):
        p = subprocess.run([str(TRAINER), "--address", self.address, *args], capture_output=True, text=True,
                           timeout=timeout, env=env if env is not None else self.env, **kwargs)
        lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
        return p, lines

    def trainer_async(self, *args):
        return subprocess.Popen([str(TRAINER), "--address", self.address, *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.env)

    def stop(self):
        """Stops the engine, then refitd; returns the engine's exit report."""
        report = None
        if self.engine.poll() is None:
            self.engine.send_signal(signal.SIGTERM)
            self.engine.wait(timeout=30)
        for l in self.engine_log.read_text().splitlines():
            if '"exit"' in l:
                report = json.loads(l)
        if self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
            self.daemon.wait(timeout=30)
        return report


@pytest.fixture
def fault_node(tmp_path):
    nodes = []

    def make(config="", failpoints="", listen="", env=None, engine_args=()):
        d = tmp_path / f"node{len(nodes)}"
        d.mkdir()
        n = FaultNode(d, config, failpoints, listen, env, engine_args)
        nodes.append(n)
        return n

    yield make
    for n in nodes:
        for p in (n.engine, n.daemon):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        for shm in n.shms:
            Path("/dev/shm" + shm).unlink(missing_ok=True)
