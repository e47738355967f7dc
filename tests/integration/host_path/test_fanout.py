"""Fan-out: one trainer feeding several refitd daemons at once (FanoutClient), over UCX on loopback.
Every daemon's engine must hold the offline conversion after each refit; a daemon dying mid-refit
fails the trainer's refit with an error naming it, leaves the other engine's bytes unchanged, and
the next fan-out refit (to the daemons still alive) lands."""
import json
import signal
import subprocess

from conftest import TRAINER, wait_for


def fanout_trainer(nodes, *args, timeout=90):
    cmd = [str(TRAINER)]
    for n in nodes:
        cmd += ["--address", n.address]
    p = subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout)
    return p, [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]


def test_fanout_three_daemons_every_engine_matches(node_factory):
    nodes = [node_factory() for _ in range(3)]
    before = [n.shm_digest() for n in nodes]
    p, lines = fanout_trainer(nodes, "--refits", "2", "--seed", "21")
    assert p.returncode == 0, p.stdout + p.stderr
    assert [l["outcome"] for l in lines] == ["committed", "committed"], lines
    # engine_matches_expected covers every daemon's engine (read back through each refitd).
    assert all(l["engine_matches_expected"] for l in lines), lines
    after = [n.shm_digest() for n in nodes]
    assert len(set(after)) == 1, "the engines differ after the same fan-out refit"
    assert after[0] != before[0]
    for n in nodes:
        assert [r["version"] for r in n.resumed()] == [1, 2]


def test_fanout_single_daemon_uses_group_path(node_factory):
    node = node_factory()
    _, lines = fanout_trainer([node], "--fanout", "--refits", "1")
    assert lines[0]["outcome"] == "committed" and lines[0]["engine_matches_expected"], lines


def test_fanout_refused_on_every_daemon(node_factory):
    nodes = [node_factory() for _ in range(2)]
    before = [n.shm_digest() for n in nodes]
    p, lines = fanout_trainer(nodes, "--refits", "1", "--fault", "strand-gate")
    assert p.returncode == 0, p.stdout + p.stderr
    assert lines[0]["outcome"] == "refused"
    # Both daemons refuse, each named, and neither engine changed.
    for n in nodes:
        assert n.address.split(":", 1)[1] in lines[0]["error"], lines[0]["error"]
    assert "incomplete group" in lines[0]["error"] or "missing" in lines[0]["error"], lines[0]["error"]
    assert [n.shm_digest() for n in nodes] == before


def test_fanout_daemon_killed_mid_refit(node_factory, monkeypatch):
    small = "limits:\n  bucket_bytes: 1048576\n"
    alive = node_factory(config=small)
    monkeypatch.setenv("REFIT_FAILPOINTS", "after_receive=crash@2")  # dies on its second bucket
    dying = node_factory(config=small)
    monkeypatch.delenv("REFIT_FAILPOINTS")
    before = alive.shm_digest()
    p, lines = fanout_trainer([alive, dying], "--refits", "1")
    assert dying.daemon.wait(timeout=30) == -signal.SIGKILL
    assert p.returncode == 4 and lines[0]["outcome"] == "refused", p.stdout + p.stderr
    assert dying.address.split(":", 1)[1] in lines[0]["error"] or "UCX" in lines[0]["error"], lines[0]["error"]
    # The trainer aborted the refit on the surviving daemon, whose engine is unchanged.
    wait_for(lambda: "outcome=aborted" in alive.daemon_log.read_text(), timeout=30, what="abort on the survivor")
    assert alive.shm_digest() == before
    # The next refit to the surviving daemon lands.
    _, lines = alive.trainer("--refits", "1", check_rc=0)
    assert lines[0]["outcome"] == "committed" and lines[0]["engine_matches_expected"]
