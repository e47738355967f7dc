"""Fault scenarios with real processes: refitd (restartable, with failpoints), an example engine
that survives refitd (--reconnect) and example trainers. The engine's bytes are read straight
from its shared memory, never through refitd."""
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "harness"))
import refit_harness as h  # noqa: E402
from refit_harness import BIN, ENGINE, REFITD, SRC, TRAINER, wait_for  # noqa: E402,F401


def sanitized_build():
    """Whether BIN is the sanitizer stage's build (ASAN+UBSAN)."""
    cache = BIN / "CMakeCache.txt"
    return cache.exists() and re.search(r"^REFIT_SANITIZE:\w+=.*undefined", cache.read_text(), re.M) is not None


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
        self.daemon = h.start_refitd(self.config, self.daemon_log, env=env)

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
        self.shm = h.new_shm("fault")
        self.shms.append(self.shm)
        self.engine = h.start_engine(self.address, self.engine_log, "--shm", self.shm, "--reconnect",
                                     *self.engine_args, env=self.env, marker='"registered"')
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
        return h.shm_digest(self.shm)

    # --- trainers ---
    def trainer(self, *args, timeout=120, env=None, **kwargs):
        return h.run_trainer(self.address, *args, timeout=timeout, env=env if env is not None else self.env, **kwargs)

    def trainer_async(self, *args):
        return subprocess.Popen([str(TRAINER), "--address", self.address, *map(str, args)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.env)

    def stop(self):
        """Stops the engine, then refitd; returns the engine's exit report."""
        report = None
        h.stop(self.engine, timeout=30)
        for l in self.engine_log.read_text().splitlines():
            if '"exit"' in l:
                report = json.loads(l)
        h.stop(self.daemon, timeout=30)
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
        h.kill(n.engine)
        h.kill(n.daemon)
        h.unlink_shm(*n.shms)
