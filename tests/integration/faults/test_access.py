"""Access control (docs/security.md): Unix-socket peers by uid, TCP peers by shared secret."""
import os
import re
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import BIN, REFITD, TRAINER, wait_for

TOKEN = "s3cret-token-for-tests-0123456789"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


OTHER_UID = 65534  # nobody


def others_can_traverse(path: Path) -> bool:
    """True when a uid that neither owns `path` nor shares its group can reach what is inside:
    `path` and every directory above it carry the others-execute bit."""
    path = path.resolve()
    return all(p.stat().st_mode & 0o001 for p in [path, *path.parents])


def dir_for_other_uid(prefix: str) -> Path:
    """A fresh directory (0755) that OTHER_UID can traverse, in the first temp location it can
    reach; skips, saying why, when there is none (every candidate is in a 0700 directory)."""
    candidates = [Path(tempfile.gettempdir()), Path("/tmp"), Path("/var/tmp"), Path("/dev/shm")]
    for base in candidates:
        if base.is_dir() and os.access(base, os.W_OK) and others_can_traverse(base):
            d = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
            d.chmod(0o755)
            return d
    pytest.skip(f"no directory uid {OTHER_UID} can traverse among {[str(c) for c in candidates]}")


def stage_for_other_uid(binary: Path, into: Path) -> tuple[Path, dict]:
    """A copy of `binary` that OTHER_UID can execute, and the environment it needs: the build
    tree may sit in a directory other users cannot traverse (a 0700 home or temp directory).
    Shared libraries the build tree made (ldd) are copied next to it, on LD_LIBRARY_PATH."""
    staged = into / binary.name
    shutil.copy2(binary, staged)
    staged.chmod(0o755)
    env = {}
    ldd = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    build = BIN.resolve()
    own = [Path(m) for m in re.findall(r"=> (/\S+)", ldd) if Path(m).resolve().is_relative_to(build)]
    for lib in own:
        shutil.copy2(lib, into / lib.name)
        (into / lib.name).chmod(0o755)
    if own:
        env["LD_LIBRARY_PATH"] = str(into)
    return staged, env


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client under another uid")
def test_unix_peer_uid_not_allowed_is_refused(fault_node):
    # The socket (in a directory anyone may traverse) is world-writable here on purpose, so only
    # refitd's uid check stands in the way.
    sock_dir = dir_for_other_uid("refit-access-")
    stage_dir = dir_for_other_uid("refit-access-bin-")
    try:
        trainer, extra_env = stage_for_other_uid(TRAINER, stage_dir)
        node = fault_node(config='socket_mode: "0666"\n', listen=f"unix:{sock_dir / 'refitd.sock'}")
        env = dict(node.env, **extra_env)
        p = subprocess.run([str(trainer), "--address", node.address, "--refits", "1"], capture_output=True, text=True,
                           timeout=120, env=env, cwd=stage_dir, preexec_fn=lambda: os.setuid(OTHER_UID))
        assert p.returncode != 0
        wait_for(lambda: "event=connection_refused" in node.log(), what="refusal logged")
        assert f'reason="uid {OTHER_UID}' in node.log(), p.stdout + p.stderr
        assert node.resumed_versions() == []
        # refitd's own uid is allowed.
        _, lines = node.trainer("--refits", "1")
        assert lines[0]["outcome"] == "committed"
        node.stop()
    finally:
        shutil.rmtree(sock_dir, ignore_errors=True)
        shutil.rmtree(stage_dir, ignore_errors=True)


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
