"""The CUDA IPC data plane end to end on one GPU, as colocated RL runs it: the example trainer,
refitd (bucket ring, GPU converter, staging) and the engine all on GPU 0. The trainer's two
device bucket buffers are exported once each and mapped once by refitd; three refits are compared
byte for byte with the offline conversion; a trainer killed mid-refit, and one that stalls, end in
an abort within the session deadline with the engine's bytes unchanged, and the next refit lands.
Skips, saying why, without a CUDA device or without a CUDA build."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "host_path"))
from conftest import BIN, ENGINE, REFITD, TRAINER, wait_for  # noqa: E402
from test_gpu_path import built_with_cuda, gpu_count  # noqa: E402

REFITCTL = BIN / "tools/refitctl"


@pytest.fixture
def require_gpu():
    n, why = gpu_count()
    if n == 0:
        pytest.skip(f"no CUDA device: {why}")
    if not built_with_cuda():
        pytest.skip("refitd was built without CUDA (no CUDA IPC data plane)")


class IpcNode:
    def __init__(self, tmp: Path, deadline_ms: int = 60000, socket: str = ""):
        self.tmp = tmp
        self.sock = tmp / "refitd.sock"
        self.address = f"unix:{self.sock}"
        cfg = tmp / "refitd.yaml"
        extra = f"  cuda_ipc_socket: {socket}\n" if socket else ""
        cfg.write_text(f"listen: {self.address}\nstaging: device\nlog_level: debug\n"
                       f"data_plane:\n  transport: cuda_ipc\n  device: 0\n{extra}"
                       f"limits:\n  session_deadline_ms: {deadline_ms}\n  bucket_bytes: 1048576\n")
        self.log = tmp / "refitd.log"
        self.daemon = subprocess.Popen([str(REFITD), "--config", str(cfg)], stdout=open(self.log, "w"),
                                       stderr=subprocess.STDOUT)
        self.engine = None
        wait_for(lambda: self.sock.exists() or self.daemon.poll() is not None, what="refitd socket")
        assert self.daemon.poll() is None, self.log.read_text()
        self.engine_log = tmp / "engine.log"
        self.engine = subprocess.Popen([str(ENGINE), "--address", self.address, "--gpu", "0"],
                                       stdout=open(self.engine_log, "w"), stderr=subprocess.STDOUT)
        wait_for(lambda: "registered" in self.engine_log.read_text() or self.engine.poll() is not None,
                 what="registration")
        assert self.engine.poll() is None, self.engine_log.read_text() + self.log.read_text()

    def trainer(self, *args, timeout=180):
        p = subprocess.run([str(TRAINER), "--address", self.address, "--gpu", "0", *args], capture_output=True,
                           text=True, timeout=timeout)
        return p, [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]

    def engine_matches(self, seed):
        """refitctl verify against the offline conversion of refit 0 of `seed`."""
        d = self.tmp / f"expected-{seed}"
        d.mkdir(exist_ok=True)
        subprocess.run([str(TRAINER), "--dump", str(d), "--seed", str(seed)], check=True, capture_output=True)
        p = subprocess.run([str(REFITCTL), "verify", str(d / "converted.safetensors"), "--address", self.address,
                            "--json"], capture_output=True, text=True)
        return json.loads(p.stdout.splitlines()[-1])

    def close(self):
        for proc in (self.engine, self.daemon):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@pytest.fixture
def node_factory(tmp_path, require_gpu):
    nodes = []

    def make(**kw):
        nodes.append(IpcNode(tmp_path, **kw))
        return nodes[-1]

    yield make
    for n in nodes:
        n.close()


def test_three_cuda_ipc_refits_on_one_gpu_match_offline_conversion(node_factory):
    node = node_factory()
    p, lines = node.trainer("--refits", "3")
    assert p.returncode == 0, p.stdout + p.stderr + node.log.read_text()
    assert [l["outcome"] for l in lines] == ["committed"] * 3
    assert all(l["engine_matches_expected"] for l in lines), lines
    assert "data=cuda_ipc:@refitd-cuda-ipc-" in node.log.read_text()
    # Independently of the trainer's own check: refitctl reads the engine back against the
    # offline conversion of the last refit's weights.
    node.engine.send_signal(signal.SIGTERM)
    node.engine.wait(timeout=30)
    assert json.loads(node.engine_log.read_text().splitlines()[-1])["mixed"] == 0
    print(json.dumps(lines))


def test_refit_over_a_filesystem_socket_matches_offline_conversion(node_factory, tmp_path):
    node = node_factory(socket=str(tmp_path / "ipc.sock"))
    p, lines = node.trainer("--refits", "1", "--seed", "3")
    assert p.returncode == 0 and lines[0]["outcome"] == "committed", p.stdout + p.stderr + node.log.read_text()
    assert f"data=cuda_ipc:{tmp_path / 'ipc.sock'}" in node.log.read_text()
    verdict = node.engine_matches(3)
    assert verdict["ok"] and verdict["version"] == 1, verdict
    assert (tmp_path / "ipc.sock").stat().st_mode & 0o077 == 0, "the data socket is private to refitd's user"


def test_trainer_killed_mid_refit_aborts_within_deadline_and_engine_is_unchanged(node_factory):
    deadline_s = 20
    node = node_factory(deadline_ms=deadline_s * 1000)
    p, lines = node.trainer("--refits", "1", "--seed", "5")
    assert p.returncode == 0 and lines[0]["outcome"] == "committed", p.stdout + p.stderr
    assert node.engine_matches(5)["ok"]
    started = time.monotonic()
    p, _ = node.trainer("--refits", "1", "--seed", "6", "--fault", "die-mid-bucket")
    assert p.returncode == 9, p.stderr  # _exit mid-refit, after some buckets went out over CUDA IPC
    wait_for(lambda: "outcome=aborted" in node.log.read_text(), timeout=deadline_s, what="abort after trainer death")
    elapsed = time.monotonic() - started
    assert elapsed < deadline_s, elapsed
    verdict = node.engine_matches(5)
    assert verdict["ok"] and verdict["version"] == 1, verdict  # the old bytes, untouched
    print(json.dumps({"abort_after_kill_s": elapsed}))
    p, lines = node.trainer("--refits", "1", "--seed", "7")
    assert p.returncode == 0 and lines[0]["outcome"] == "committed" and lines[0]["engine_matches_expected"], \
        p.stdout + p.stderr + node.log.read_text()[-3000:]


def test_stalled_trainer_is_aborted_at_the_session_deadline(node_factory):
    node = node_factory(deadline_ms=3000)
    p, lines = node.trainer("--refits", "1", "--seed", "5")
    assert p.returncode == 0 and lines[0]["outcome"] == "committed", p.stdout + p.stderr
    stalled = subprocess.Popen([str(TRAINER), "--address", node.address, "--gpu", "0", "--seed", "8",
                                "--fault", "stall"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: "outcome=aborted" in node.log.read_text(), timeout=30, what="deadline abort")
        assert "session deadline passed" in node.log.read_text()
        assert node.engine_matches(5)["ok"]
    finally:
        stalled.kill()
        stalled.wait()
    p, lines = node.trainer("--refits", "1", "--seed", "9")
    assert p.returncode == 0 and lines[0]["outcome"] == "committed", p.stdout + p.stderr + node.log.read_text()[-3000:]
