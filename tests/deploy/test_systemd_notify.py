"""refitd speaks systemd's notify protocol (deploy/systemd/refitd.service is Type=notify with
WatchdogSec=): with NOTIFY_SOCKET pointing at a datagram socket this test binds, READY=1 arrives
only once the control socket accepts connections, WATCHDOG=1 pings arrive every half of
WATCHDOG_USEC, and STOPPING=1 when SIGTERM stops it. A real refitd, no systemd needed."""
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import need_refitd


class NotifyListener:
    def __init__(self, path: Path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.path = path

    def receive(self, timeout: float) -> str | None:
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(4096).decode()
        except socket.timeout:
            return None

    def close(self):
        self.sock.close()


@pytest.fixture
def notify(tmp_path):
    listener = NotifyListener(tmp_path / "notify.sock")
    yield listener
    listener.close()


def start_refitd(tmp_path: Path, env_extra: dict) -> tuple[subprocess.Popen, Path]:
    control = tmp_path / "refitd.sock"
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}
    env.update(env_extra)
    proc = subprocess.Popen([str(need_refitd()), "--listen", f"unix:{control}"], env=env,
                            stdout=open(tmp_path / "refitd.log", "w"), stderr=subprocess.STDOUT)
    return proc, control


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def connects(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(path))
            return True
        except OSError:
            return False


def test_ready_once_listening_and_stopping_on_sigterm(tmp_path, notify):
    proc, control = start_refitd(tmp_path, {"NOTIFY_SOCKET": str(notify.path)})
    try:
        message = notify.receive(timeout=60)
        assert message is not None, (tmp_path / "refitd.log").read_text()
        # The moment READY=1 arrives, a client can connect (nothing was waited for before this).
        assert connects(control), "READY=1 before the control socket accepts connections"
        assert message.split("\n") == ["READY=1"], message
        # Without WATCHDOG_USEC: no pings.
        assert notify.receive(timeout=1.0) is None
        assert stop(proc) == 0
        assert notify.receive(timeout=5) == "STOPPING=1"
    finally:
        stop(proc)


def test_watchdog_pings_at_half_the_interval(tmp_path, notify):
    interval_usec = 400_000
    proc, _ = start_refitd(tmp_path, {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": str(interval_usec)})
    try:
        assert notify.receive(timeout=60) == "READY=1", (tmp_path / "refitd.log").read_text()
        times = []
        while len(times) < 4:
            m = notify.receive(timeout=5)
            assert m == "WATCHDOG=1", m
            times.append(time.monotonic())
        gaps = [b - a for a, b in zip(times, times[1:])]
        # Every 0.2 s; generous bounds for a loaded machine, but pings must come well within 0.4 s
        # on average.
        assert 0.1 < sum(gaps) / len(gaps) < 0.4, gaps
    finally:
        stop(proc)


def test_watchdog_for_another_pid_is_ignored(tmp_path, notify):
    proc, _ = start_refitd(tmp_path, {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "200000",
                                      "WATCHDOG_PID": "1"})
    try:
        assert notify.receive(timeout=60) == "READY=1"
        assert notify.receive(timeout=1.0) is None
    finally:
        stop(proc)


def test_abstract_notify_socket(tmp_path):
    name = f"refitd-test-{os.getpid()}-{time.monotonic_ns()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    proc, _ = start_refitd(tmp_path, {"NOTIFY_SOCKET": "@" + name})
    try:
        sock.settimeout(60)
        assert sock.recv(4096) == b"READY=1"
    finally:
        stop(proc)
        sock.close()


def test_unusable_notify_socket_fails_loudly(tmp_path):
    proc, _ = start_refitd(tmp_path, {"NOTIFY_SOCKET": "relative/path"})
    assert proc.wait(timeout=60) == 1
    assert "NOTIFY_SOCKET" in (tmp_path / "refitd.log").read_text()
