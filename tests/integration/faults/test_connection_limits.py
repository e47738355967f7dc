"""Connections refitd did not survive before (issue 22, findings 2 and 4): file-descriptor
exhaustion through the control socket and the admin port, idle connections, and Cap'n Proto
messages declared huge and streamed into refitd's memory. Each test ends with a real refit that
must commit (docs/security.md, "Connections")."""
import os
import re
import resource
import socket
import struct
import time
import urllib.error
import urllib.request

import pytest

from conftest import BIN, sanitized_build, wait_for

ADMIN_TOKEN = "admin-token-for-tests-0123456789"


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_bytes(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def admin_port(node):
    return int(re.search(r"admin_port=(\d+)", node.log()).group(1))


def connect_unix(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(path))
    return s


def closed_by_peer(s, timeout=10.0):
    """True when the peer closes `s` (EOF or reset) within `timeout`; what it sends before
    (refitd's Cap'n Proto Abort message) is read and dropped."""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            if s.recv(65536) == b"":
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        pass
    return False


def metric(node, name, **labels):
    _, body = node.admin("/metrics")
    for line in body.splitlines():
        if line.startswith(name + ("{" if labels else " ")):
            if not labels or all(f'{k}="{v}"' in line for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def refit_commits(node, version):
    _, lines = node.trainer("--refits", "1")
    assert lines and lines[0]["outcome"] == "committed", lines
    assert node.resumed_versions()[-1] == version


# UBSAN's vptr check probes memory through a pipe(2); with no descriptor left that fails and it
# reports "invalid vptr" on a sound object (and -fno-sanitize-recover ends refitd). The caps and
# drops below, which keep refitd short of EMFILE, run under the sanitizers too.
@pytest.mark.skipif(sanitized_build(), reason="UBSAN's vptr check cannot run out of file descriptors")
def test_control_socket_fd_exhaustion_does_not_kill_refitd(fault_node):
    """accept() failing with EMFILE used to throw out of the listener: refitd aborted."""
    node = fault_node(config="limits:\n  max_connections: 100000\n  max_connections_per_uid: 100000\n")
    pid = node.daemon.pid
    before = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (open_fds(pid) + 16, before[1]))
    flood = []
    try:
        for _ in range(80):  # the kernel queues what refitd cannot accept
            flood.append(connect_unix(node.sock))
        wait_for(lambda: "event=accept_failed" in node.log() or node.daemon.poll() is not None,
                 what="refitd to run out of descriptors")
        time.sleep(0.5)  # several backoff rounds while still out of descriptors
        assert node.daemon.poll() is None, node.log()[-2000:]
    finally:
        for s in flood:
            s.close()
        if node.daemon.poll() is None:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, before)
    assert "listener=control" in node.log() and "backoff_ms=100" in node.log()
    assert metric(node, "refit_accept_errors_total", listener="control") >= 1
    refit_commits(node, 1)
    assert node.stop()["mixed"] == 0


def test_control_connection_caps_and_idle_timeout(fault_node):
    """Connections beyond limits.max_connections_per_uid are closed at accept; connections that
    never send a message are dropped after limits.idle_timeout_ms; a refit still commits."""
    node = fault_node(config="limits:\n  max_connections: 64\n  max_connections_per_uid: 8\n  idle_timeout_ms: 1500\n")
    # The engine holds one place of this uid.
    held = [connect_unix(node.sock) for _ in range(7)]
    time.sleep(0.2)
    over = [connect_unix(node.sock) for _ in range(5)]
    assert all(closed_by_peer(s, timeout=5) for s in over), "connections over the cap stay open"
    wait_for(lambda: "max_connections_per_uid (8) reached" in node.log(), what="cap refusal logged")
    assert metric(node, "refit_connections_refused_total", listener="control", reason="max_connections_per_uid") >= 5
    # Held connections that send nothing are dropped by the idle timeout.
    assert all(closed_by_peer(s, timeout=10) for s in held), "idle connections were not dropped"
    wait_for(lambda: "reason=idle_timeout" in node.log(), what="idle drop logged")
    # A connection stalled inside a message is dropped too.
    stalled = connect_unix(node.sock)
    stalled.sendall(struct.pack("<II", 0, 16) + b"\0" * 8)  # 1 segment of 16 words, 8 bytes sent
    assert closed_by_peer(stalled, timeout=10)
    for s in held + over + [stalled]:
        s.close()
    # The engine's connection, idle between messages, is not timed out.
    refit_commits(node, 1)
    assert node.stop()["mixed"] == 0


def test_idle_admin_connections_beyond_the_fd_limit(fault_node):
    """Idle admin connections used to exhaust descriptors: the admin listener stopped for good,
    then the next control connection aborted refitd."""
    node = fault_node()
    pid = node.daemon.pid
    before = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (open_fds(pid) + 40, before[1]))
    port = admin_port(node)
    idle = []
    try:
        for _ in range(120):
            idle.append(socket.create_connection(("127.0.0.1", port)))
        wait_for(lambda: "listener=admin" in node.log() or node.daemon.poll() is not None,
                 what="admin cap reached")
        assert node.daemon.poll() is None, node.log()[-2000:]
        assert "admin.max_connections (16) reached" in node.log()
        # The control plane is unaffected: a refit commits while the idle connections are open.
        refit_commits(node, 1)
    finally:
        for s in idle:
            s.close()
        if node.daemon.poll() is None:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, before)
    # And the admin endpoint still answers once they are gone.
    wait_for(lambda: node.admin("/healthz")[0] == 200, what="admin endpoint serving again")
    assert metric(node, "refit_connections_refused_total", listener="admin", reason="max_connections") >= 100
    assert node.stop()["mixed"] == 0


def test_admin_token(fault_node, tmp_path):
    token_file = tmp_path / "admin-token"
    token_file.write_text(ADMIN_TOKEN + "\n")
    token_file.chmod(0o600)
    node = fault_node(config=f"admin:\n  token_file: {token_file}\n")
    port = admin_port(node)

    def get(path, token=None):
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read().decode(), r.headers
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(), e.headers

    for path in ("/metrics", "/healthz", "/readyz", "/version"):
        code, body, headers = get(path)
        assert code == 401 and "admin.token_file" in body, (path, code, body)
        assert headers["WWW-Authenticate"].startswith("Bearer")
        assert get(path, "wrong-token-wrong-token-wrong")[0] == 401
        assert get(path, ADMIN_TOKEN)[0] == 200, path
    assert "refit_build_info" in get("/metrics", ADMIN_TOKEN)[1]
    node.stop()


def test_admin_listens_on_localhost_by_default(fault_node):
    node = fault_node()
    port = admin_port(node)
    listening = open("/proc/net/tcp").read()
    assert f"0100007F:{port:04X}" in listening, "admin endpoint is not bound to 127.0.0.1"
    node.stop()


def test_huge_declared_messages_do_not_grow_refitd(fault_node):
    """A message declared at the 64 Mi-word limit and streamed slowly used to be buffered in
    full, on any number of connections: refitd's memory grew by what peers chose to send."""
    mib = 1 << 20
    node = fault_node(config="limits:\n  connection_buffer_bytes: 67108864\n  buffered_message_bytes: 104857600\n")
    pid = node.daemon.pid
    rss_before = rss_bytes(pid)
    conns = []
    # One message at the traversal limit (64 Mi words = 512 MiB): over the per-connection cap.
    big = connect_unix(node.sock)
    big.sendall(struct.pack("<II", 0, 64 << 20))
    assert closed_by_peer(big, timeout=10), "a message over limits.connection_buffer_bytes was accepted"
    big.close()
    # Eight messages of 48 MiB each (under the per-connection cap), streamed in 1 MiB pieces: the
    # 100 MiB budget holds two of them; the others are dropped when their table arrives.
    accepted = 0
    for _ in range(8):
        s = connect_unix(node.sock)
        conns.append(s)
        try:
            s.sendall(struct.pack("<II", 0, (48 * mib) // 8))
            for _ in range(40):
                s.sendall(b"\x01" * mib)
            accepted += 1
        except (BrokenPipeError, ConnectionResetError):
            pass
    grown = rss_bytes(pid) - rss_before
    assert node.daemon.poll() is None, node.log()[-2000:]
    assert accepted <= 2, f"{accepted} connections of 48 MiB each were buffered"
    assert grown < 160 * mib, f"refitd grew by {grown // mib} MiB"
    assert "reason=buffer_budget" in node.log() and "reason=message_too_large" in node.log()
    assert metric(node, "refit_connections_dropped_total", listener="control", reason="buffer_budget") >= 6
    for s in conns:
        s.close()
    wait_for(lambda: metric(node, "refit_control_buffered_bytes") == 0, what="budget released")
    refit_commits(node, 1)
    assert node.stop()["mixed"] == 0
