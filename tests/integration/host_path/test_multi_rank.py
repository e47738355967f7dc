"""Several trainer ranks push one refit (Daemon.join): rank 0 begins and commits, the others join,
push their share and detach. Split by tensor (pipeline/expert-parallel style) and by slice (each
rank its tensor-parallel shard of every matrix); the engine must hold the offline conversion of
the whole model. A joined rank that dies before detaching aborts the session, engine untouched."""
import json
import subprocess

from conftest import TRAINER


def run_ranks(node, tmp_path, ranks, *extra, faults=None):
    session_file = tmp_path / f"session-{len(list(tmp_path.iterdir()))}"
    procs = []
    for r in range(ranks):
        fault = (faults or {}).get(r, "none")
        procs.append(subprocess.Popen([str(TRAINER), "--address", node.address, "--refits", "1", "--ranks", str(ranks),
                                       "--rank", str(r), "--session-file", str(session_file), "--fault", fault,
                                       *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        out.append((p.returncode, [json.loads(l) for l in stdout.splitlines() if l.startswith("{")], stderr))
    return out


def test_ranks_split_by_tensor_commit_one_refit(node_factory, tmp_path):
    node = node_factory()
    out = run_ranks(node, tmp_path, 3, "--seed", "11")
    assert [rc for rc, _, _ in out] == [0, 0, 0], out
    leader = out[0][1][0]
    assert leader["outcome"] == "committed" and leader["engine_matches_expected"], leader
    assert [o[1][0]["outcome"] for o in out[1:]] == ["detached", "detached"]
    assert "event=session_join" in node.daemon_log.read_text()


def test_tensor_parallel_ranks_push_their_shards(node_factory, tmp_path):
    node = node_factory()
    out = run_ranks(node, tmp_path, 2, "--slices", "2", "--seed", "12")
    assert [rc for rc, _, _ in out] == [0, 0], out
    assert out[0][1][0]["outcome"] == "committed" and out[0][1][0]["engine_matches_expected"], out[0]


def test_joined_rank_dying_aborts_the_session(node_factory, tmp_path):
    node = node_factory()
    node.trainer("--refits", "1", check_rc=0)
    before = node.shm_digest()
    out = run_ranks(node, tmp_path, 2, "--seed", "13", faults={1: "die-mid-bucket"})
    assert out[1][0] == 9, out[1]
    assert out[0][1][0]["outcome"] == "refused", out[0]  # the leader's commit finds the session aborted
    assert "a joined trainer rank disconnected before detaching" in node.daemon_log.read_text()
    assert node.shm_digest() == before
    node.trainer("--refits", "1", "--seed", "14", check_rc=0)
