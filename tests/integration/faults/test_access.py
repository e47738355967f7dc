"""Access control (docs/security.md): Unix-socket peers by uid, TCP peers by shared secret."""
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import REFITD, wait_for

TOKEN = "s3cret-token-for-tests-0123456789"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client under another uid")
def test_unix_peer_uid_not_allowed_is_refused(fault_node):
    # The socket (in a directory anyone may traverse) is world-writable here on purpose, so only
    # refitd's uid check stands in the way.
    sock_dir = Path(tempfile.mkdtemp(prefix="refit-access-"))
    sock_dir.chmod(0o755)
    node = fault_node(config='socket_mode: "0666"\n', listen=f"unix:{sock_dir / 'refitd.sock'}")
    p, _ = node.trainer("--refits", "1", preexec_fn=lambda: os.setuid(65534))
    assert p.returncode != 0
    wait_for(lambda: "event=connection_refused" in node.log(), what="refusal logged")
    assert 'reason="uid 65534' in node.log()
    assert node.resumed_versions() == []
    # refitd's own uid is allowed.
    _, lines = node.trainer("--refits", "1")
    assert lines[0]["outcome"] == "committed"
    node.stop()
    shutil.rmtree(sock_dir, ignore_errors=True)


def test_tcp_without_token_does_not_start(tmp_path):
    cfg = tmp_path / "refitd.yaml"
    cfg.write_text(f"listen: 127.0.0.1:{free_port()}\n")
    p = subprocess.run([str(REFITD), "--config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 1
    assert "is TCP: set access.token_file" in p.stderr, p.stderr


def test_tcp_token(fault_node, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    node = fault_node(config=f"access:\n  token_file: {token_file}\n", listen=f"127.0.0.1:{free_port()}",
                      env={"REFITD_TOKEN": TOKEN})
    _, lines = node.trainer("--refits", "1")
    assert lines[0]["outcome"] == "committed" and lines[0]["engine_matches_expected"], lines
    wrong = dict(node.env, REFITD_TOKEN="not-the-token-at-all")
    p, _ = node.trainer("--refits", "1", env=wrong)
    assert p.returncode != 0
    wait_for(lambda: 'reason="wrong authentication token"' in node.log(), what="refusal logged")
    none = dict(node.env)
    none.pop("REFITD_TOKEN")
    p, _ = node.trainer("--refits", "1", env=none)
    assert p.returncode != 0
    assert node.resumed_versions() == [1]
    report = node.stop()
    assert report["mixed"] == 0
