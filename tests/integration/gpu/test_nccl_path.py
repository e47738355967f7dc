"""The NCCL data plane end to end: the example trainer on GPU 0 pushes device tensors over NCCL to
refitd, whose bucket ring, GPU converter, staging and engine (CUDA IPC) are on GPU 1; with one GPU
both share it, each process with its own NCCL_HOSTID (NCCL's socket transport over loopback:
correctness only, conftest.nccl_placement). Three refits compared byte for byte with the offline
conversion; a trainer killed mid-refit, and one that stalls, end in an abort within the session
deadline with the engine's bytes unchanged, and the next refit lands. Skips, saying why, without a
CUDA device or without NCCL."""
import json
import os
import signal
import subprocess
import time

import pytest

from conftest import TRAINER, node_fixture, wait_for

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")


@pytest.fixture
def node_factory(tmp_path, nccl_placement):
    yield from node_fixture(tmp_path, transport="nccl", **nccl_placement)


def test_three_nccl_refits_match_offline_conversion(node_factory):
    node = node_factory()
    p, lines = node.trainer("--refits", "3")
    assert p.returncode == 0, p.stdout + p.stderr + node.log.read_text()
    assert [l["outcome"] for l in lines] == ["committed"] * 3
    assert all(l["engine_matches_expected"] for l in lines), lines
    assert "data=nccl:" in node.log.read_text()
    node.engine.send_signal(signal.SIGTERM)
    node.engine.wait(timeout=30)
    assert json.loads(node.engine_log.read_text().splitlines()[-1])["mixed"] == 0
    print(json.dumps(lines))


def test_trainer_killed_mid_refit_aborts_within_deadline_and_engine_is_unchanged(node_factory):
    deadline_s = 20
    node = node_factory(deadline_ms=deadline_s * 1000)
    p, lines = node.trainer("--refits", "1", "--seed", "5")
    assert p.returncode == 0 and lines[0]["outcome"] == "committed", p.stdout + p.stderr
    assert node.engine_matches(5)["ok"]
    started = time.monotonic()
    p, _ = node.trainer("--refits", "1", "--seed", "6", "--fault", "die-mid-bucket")
    assert p.returncode == 9, p.stderr  # _exit mid-refit, after some buckets went out over NCCL
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


def test_fanout_broadcast_refits_match_offline_conversion(node_factory):
    """The fan-out path (FanoutClient, one NCCL broadcast per bucket) with the one daemon two GPUs
    allow (the daemons of a fan-out need a GPU each, none shared with the trainer); a
    point-to-point refit into the same daemon afterwards still lands (both kinds of peer on one
    receiver), and a fan-out trainer killed mid-refit is aborted with the engine unchanged."""
    node = node_factory(deadline_ms=20000)
    p, lines = node.trainer("--fanout", "--refits", "3", "--seed", "11")
    assert p.returncode == 0, p.stdout + p.stderr + node.log.read_text()[-3000:]
    assert [l["outcome"] for l in lines] == ["committed"] * 3
    assert all(l["engine_matches_expected"] for l in lines), lines
    p, lines = node.trainer("--refits", "1", "--seed", "12")
    assert p.returncode == 0 and lines[0]["engine_matches_expected"], p.stdout + p.stderr
    started = time.monotonic()
    p, _ = node.trainer("--fanout", "--refits", "1", "--seed", "13", "--fault", "die-mid-bucket")
    assert p.returncode == 9, p.stderr
    wait_for(lambda: node.log.read_text().count("outcome=aborted") >= 1, timeout=20, what="abort after fan-out death")
    assert node.engine_matches(12)["ok"]
    p, lines = node.trainer("--fanout", "--refits", "1", "--seed", "14")
    assert p.returncode == 0 and lines[0]["engine_matches_expected"], p.stdout + p.stderr + node.log.read_text()[-3000:]
    print(json.dumps({"fanout_abort_after_kill_s": time.monotonic() - started}))


def test_a_trainer_of_another_nccl_version_is_refused_with_both_versions_named(node_factory, nccl_placement):
    """refitd loads another libnccl.so.2 than the trainer (as the package's bundled copy and a
    trainer's PyTorch wheel may differ): the session fails at the rendezvous with both versions
    named, nothing is committed, and the engine keeps its bytes. REFIT_OTHER_NCCL_DIR names a
    directory with a libnccl.so.2 of another version than the trainer's."""
    other = os.environ.get("REFIT_OTHER_NCCL_DIR", "")
    if not other or not os.path.exists(os.path.join(other, "libnccl.so.2")):
        pytest.skip("REFIT_OTHER_NCCL_DIR (a libnccl.so.2 of another version than the trainer's) is not set")
    env = dict(nccl_placement["env"] or {})
    env["LD_LIBRARY_PATH"] = other + ":" + os.environ.get("LD_LIBRARY_PATH", "")
    node = node_factory(env=env)
    p, lines = node.trainer("--refits", "1")
    assert p.returncode != 0, p.stdout
    out = p.stdout + p.stderr
    assert "NCCL version mismatch with refitd at nccl:" in out, out
    assert "this process runs NCCL 2." in out and "the peer runs NCCL 2." in out, out
    assert "invalid usage" not in out, out  # refused before NCCL's own check
    wait_for(lambda: "outcome=aborted" in node.log.read_text(), timeout=30, what="the session's abort")
    assert "NCCL version mismatch" in node.log.read_text()
    assert node.engine_matches(0)["version"] == 0
