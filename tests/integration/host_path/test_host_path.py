"""The host path end to end (DESIGN.md invariants 1, 2, 3): real refitd, engine and trainer
processes over UCX on loopback and POSIX shared memory. Every refused or aborted session must
leave the engine's bytes unchanged, checked by hashing the engine's shm directly."""
import signal
import subprocess
import time

from conftest import SRC, TRAINER, wait_for

PREQUANTIZED_SPEC = str(SRC / "tests/integration/host_path/demo_prequantized.yaml")


def test_three_refits_match_offline_conversion(node_factory):
    node = node_factory()
    before = node.shm_digest()
    _, lines = node.trainer("--refits", "3", check_rc=0)
    assert [l["outcome"] for l in lines] == ["committed"] * 3
    assert [l["version"] for l in lines] == [1, 2, 3]
    assert all(l["engine_matches_expected"] for l in lines), lines
    assert all(l["pause_ms"] >= 0 and l["pause_ms"] <= l["total_ms"] for l in lines)
    assert node.shm_digest() != before
    resumed = node.resumed()
    assert [r["version"] for r in resumed] == [1, 2, 3]
    exit_report = node.stop()
    # The engine served throughout and never saw a mix of versions.
    assert exit_report["mixed"] == 0
    assert exit_report["requests"] > 0
    seen = {v: c for v, c in exit_report["versions"]}
    for r in resumed:
        if r["version"] in seen:
            assert seen[r["version"]] == r["checksum"]


def test_a_refit_begun_ahead_of_its_weights_lands(node_factory):
    # A trainer that begins while its step still runs (example_trainer --begin-ahead-ms): with
    # `staging: direct` refitd pauses the engine at the begin, and the refit pushed 200 ms later
    # lands equal to the offline conversion. ready_commit_ms counts from the weights ready, so the
    # 200 ms after the begin are in push_commit_ms only.
    node = node_factory(config="staging: direct\n")
    _, lines = node.trainer("--refits", "2", "--begin-ahead-ms", "200", check_rc=0)
    assert [l["outcome"] for l in lines] == ["committed"] * 2
    assert all(l["engine_matches_expected"] for l in lines), lines
    assert all(l["bytes_in_place"] == l["bytes_out"] > 0 for l in lines), lines  # converted into the engine
    assert all(l["push_commit_ms"] - l["ready_commit_ms"] >= 190 for l in lines), lines
    assert node.stop()["mixed"] == 0


def test_refits_land_with_busy_polling_loops(node_factory, monkeypatch):
    # `busy_poll: on`: refitd's event loop spins from each begin to its commit's answer, and the
    # engine agent's (REFIT_BUSY_POLL=1) while its engine is paused; each refit lands as without,
    # and between refits both loops block again (refitd answers a status call while idle).
    monkeypatch.setenv("REFIT_BUSY_POLL", "1")
    node = node_factory(config="staging: direct\nbusy_poll: on\n")
    assert "busy_poll=true" in node.daemon_log.read_text()
    _, lines = node.trainer("--refits", "3", check_rc=0)
    assert [l["outcome"] for l in lines] == ["committed"] * 3
    assert all(l["engine_matches_expected"] for l in lines), lines
    assert all(l["bytes_in_place"] == l["bytes_out"] > 0 for l in lines), lines
    assert [r["version"] for r in node.resumed()] == [1, 2, 3]
    assert node.stop()["mixed"] == 0


def test_missing_scale_is_refused_and_engine_untouched(node_factory):
    node = node_factory(spec=PREQUANTIZED_SPEC)
    node.trainer("--refits", "1", "--prequantized", check_rc=0)  # a good refit first
    before = node.shm_digest()
    _, lines = node.trainer("--refits", "1", "--prequantized", "--fault", "drop-scale", check_rc=0)
    assert lines[0]["outcome"] == "refused"
    assert "missing: 'model.layers.0.mlp.down_proj.weight_scale_inv'" in lines[0]["error"], lines[0]["error"]
    assert node.shm_digest() == before
    assert [r["version"] for r in node.resumed()] == [1]


def test_stranded_gate_half_is_refused_and_engine_untouched(node_factory):
    node = node_factory()
    before = node.shm_digest()
    _, lines = node.trainer("--refits", "1", "--fault", "strand-gate", check_rc=0)
    err = lines[0]["error"]
    assert lines[0]["outcome"] == "refused"
    assert "missing: 'model.layers.0.mlp.up_proj.weight'" in err, err
    assert "missing: 'model.layers.0.mlp.up_proj.weight_scale_inv'" in err, err
    assert "incomplete group 'gate_up': 'model.layers.0.mlp.gate_proj.weight' arrived without " \
           "'model.layers.0.mlp.up_proj.weight'" in err, err
    assert node.shm_digest() == before
    assert node.resumed() == []


def test_duplicate_tensor_is_refused(node_factory):
    node = node_factory()
    before = node.shm_digest()
    _, lines = node.trainer("--refits", "1", "--fault", "duplicate", check_rc=0)
    assert "duplicate: tensor 'model.embed_tokens.weight' arrived 2 times" in lines[0]["error"], lines[0]["error"]
    assert node.shm_digest() == before


def test_trainer_abort_leaves_engine_untouched(node_factory):
    node = node_factory()
    before = node.shm_digest()
    _, lines = node.trainer("--refits", "1", "--fault", "abort", check_rc=0)
    assert lines[0]["outcome"] == "aborted"
    assert node.shm_digest() == before
    wait_for(lambda: "outcome=aborted" in node.daemon_log.read_text(), what="abort report")
    assert 'reason="trainer aborted: fault injection: trainer abort"' in node.daemon_log.read_text()


def test_trainer_death_mid_refit_aborts_and_next_refit_lands(node_factory):
    node = node_factory()
    before = node.shm_digest()
    p, _ = node.trainer("--refits", "1", "--fault", "die-mid-bucket")
    assert p.returncode == 9
    wait_for(lambda: "outcome=aborted" in node.daemon_log.read_text(), what="abort after trainer death")
    assert node.shm_digest() == before
    _, lines = node.trainer("--refits", "1", check_rc=0)
    assert lines[0]["outcome"] == "committed" and lines[0]["engine_matches_expected"]


def test_session_deadline_aborts_stalled_trainer(node_factory):
    node = node_factory(config="limits:\n  session_deadline_ms: 1500\n")
    before = node.shm_digest()
    trainer = subprocess.Popen([str(TRAINER), "--address", node.address, "--fault", "stall"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: "outcome=aborted" in node.daemon_log.read_text(), timeout=20, what="deadline abort")
        assert "session deadline passed" in node.daemon_log.read_text()
        assert node.shm_digest() == before
    finally:
        trainer.kill()
        trainer.wait()
    _, lines = node.trainer("--refits", "1", check_rc=0)
    assert lines[0]["outcome"] == "committed"


def test_sigterm_shuts_down_cleanly(node_factory):
    node = node_factory()
    node.trainer("--refits", "1", check_rc=0)
    node.daemon.send_signal(signal.SIGTERM)
    assert node.daemon.wait(timeout=20) == 0, node.daemon_log.read_text()[-4000:]
    assert "event=shutdown" in node.daemon_log.read_text()
    assert not node.sock.exists()
