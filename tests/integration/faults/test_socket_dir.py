"""The control socket's directory (issue 22, finding 5; docs/security.md, "The socket's
directory"): refitd refuses a directory where another user could replace its socket, creates a
missing one, and never removes a file that is not its own socket."""
import os
import socket
import subprocess

import pytest

from conftest import REFITD, wait_for


def start(tmp_path, sock, extra=""):
    cfg = tmp_path / "refitd.yaml"
    cfg.write_text(f"listen: unix:{sock}\n{extra}")
    return subprocess.Popen([str(REFITD), "--config", str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def refused(tmp_path, sock):
    p = start(tmp_path, sock)
    try:
        out, _ = p.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        raise AssertionError(f"refitd started with socket {sock}:\n{out}")
    assert p.returncode == 1, out
    return out


def serves(tmp_path, sock):
    """Starts refitd on `sock`; the socket's stat once refitd gave it its mode (0660, the default:
    until then it is its owner's alone, 0600)."""
    p = start(tmp_path, sock)
    try:
        wait_for(lambda: (sock.is_socket() and os.stat(sock).st_mode & 0o777 == 0o660) or p.poll() is not None,
                 what="refitd socket, mode 0660")
        assert p.poll() is None, p.communicate()[0]
        return os.stat(sock)
    finally:
        p.terminate()
        p.wait(timeout=30)


def test_world_writable_directory_without_sticky_bit_is_refused(tmp_path):
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o777)
    out = refused(tmp_path, d / "refitd.sock")
    assert "is world-writable without the sticky bit (mode 0777)" in out, out
    assert not (d / "refitd.sock").exists()


def test_sticky_world_writable_directory_is_accepted(tmp_path):
    d = tmp_path / "sticky"
    d.mkdir()
    d.chmod(0o1777)
    st = serves(tmp_path, d / "refitd.sock")
    assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == 0o660


def test_missing_directory_is_created_0755(tmp_path):
    d = tmp_path / "run-refitd"
    serves(tmp_path, d / "refitd.sock")
    assert d.is_dir() and d.stat().st_mode & 0o7777 == 0o755 and d.stat().st_uid == os.geteuid()


def test_a_file_that_is_not_a_socket_is_not_removed(tmp_path):
    victim = tmp_path / "precious"
    victim.write_text("keep me")
    out = refused(tmp_path, victim)
    assert "exists and is not a socket" in out, out
    assert victim.read_text() == "keep me"


def test_stale_socket_of_refitd_user_is_replaced(tmp_path):
    sock = tmp_path / "refitd.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    s.close()
    serves(tmp_path, sock)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own a socket as another user")
def test_another_users_socket_in_a_sticky_directory_is_refused(tmp_path):
    d = tmp_path / "sticky"
    d.mkdir()
    d.chmod(0o1777)
    sock = d / "refitd.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    os.chown(sock, 65534, 65534)
    out = refused(tmp_path, sock)
    assert "belongs to uid 65534" in out, out
    assert sock.exists()
    s.close()


def test_default_address_is_in_run_refitd():
    p = subprocess.run([str(REFITD), "--print-config"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "listen: unix:/run/refitd/refitd.sock" in p.stdout
