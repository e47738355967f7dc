"""Engine groups with real processes (docs/architecture.md "Engine groups"): an engine whose ranks
are served by three refitd daemons, its ranks stepping in lockstep and logging each step's tag
(group_lockstep.py), the trainer committing each version on the group in two phases. Every
scenario counts the forward steps that mixed versions across ranks: none is allowed. A member
killed (or stalled) at each phase by failpoints, the trainer killed between the phases, a member
restarted: each ends with the group consistent again by the next group refit, and nothing hangs
past the members' deadlines."""
import shutil
import signal
import subprocess
import time

import pytest

from group_lockstep import EngineGroup, elapsed_ms, h, wait_for


@pytest.fixture
def engine_group(tmp_path):
    groups = []

    def make(**kw):
        g = EngineGroup(tmp_path / f"group{len(groups)}", **kw)
        groups.append(g)
        return g

    yield make
    for g in groups:
        g.close()


@pytest.mark.parametrize("members,ranks", [(3, 1), (2, 2)], ids=["3x1", "2x2"])
def test_group_refits_switch_every_rank_together(engine_group, members, ranks):
    g = engine_group(members=members, ranks_per_member=ranks)
    g.wait_steps_with("-")  # fresh engines: every rank steps with no tag
    _, lines = g.refit(refits=4, tag="step")
    assert [l["group"] for l in lines] == ["committed"] * 4, lines
    for n in g.nodes:
        assert n.resumed_tags() == ["step-0", "step-1", "step-2", "step-3"]
    g.wait_steps_with("step-3")
    assert g.mixed_steps() == []
    status = g.members_status()
    assert status["consistent"], status
    assert [m["group"]["member"] for m in status["members"]] == list(range(members))
    assert {m["group"]["tag"] for m in status["members"]} == {"step-3"}
    s = g.status(1)
    assert s["group"]["name"] == "engine-a" and s["group"]["phase"] == "idle" and s["group"]["commits"] == 4
    assert len(s["ranks"]) == (ranks if ranks > 1 else 0)
    assert all(r["tag"] == "step-3" for r in s["ranks"])
    # Prometheus shows the member, its phase and the group's versions.
    _, text = g.nodes[1].admin("/metrics")
    assert f'refit_group_member_info{{group="engine-a",member="1",members="{members}"}} 1' in text
    assert 'refit_group_phase{phase="idle"} 1' in text
    assert 'refit_group_versions{outcome="committed"} 4' in text


def test_the_checker_sees_the_mix_of_independent_commits(engine_group):
    """The checker's control: the same daemons outside a group, fed by a plain fan-out (each
    commits on its own), let steps run with one rank's new weights and another's old ones."""
    g = engine_group(members=3, grouped=False)
    g.wait_steps_with("-")
    for attempt in range(10):
        p, lines = g.fanout_refit(refits=5)
        assert p.returncode == 0 and {l["outcome"] for l in lines} == {"committed"}, p.stdout + p.stderr
        if g.mixed_steps():
            break
    assert g.mixed_steps(), "ten rounds of independent commits never mixed a step: the checker sees nothing"


def test_a_member_refuses_refits_of_its_own(engine_group):
    g = engine_group(members=2)
    p, _ = g.nodes[0].trainer("--refits", "1", "--no-verify")
    assert p.returncode != 0 and "refits are stage-only" in p.stderr, p.stdout + p.stderr
    # Before any group version a member is joining: not ready.
    code, body = g.nodes[0].admin("/readyz")
    assert code == 503 and "joining" in body, body
    g.refit()
    code, _ = g.nodes[0].admin("/readyz")
    assert code == 200


def test_a_member_that_cannot_copy_aborts_the_version_everywhere(engine_group):
    # Member 1 fails its second group copy: the others restore what they held.
    g = engine_group(members=3, failpoints={1: "group_copied=error@2"})
    _, lines = g.refit(refits=3, tag="v", check=False)
    assert [l["group"] for l in lines] == ["committed", "aborted", "committed"], lines
    assert "group_copied" in lines[1]["error"]
    for n in g.nodes:
        # v-1 was copied (or not) and then taken back: nobody resumed with it.
        assert "v-1" not in n.resumed_tags(), n.resumed_tags()
        assert n.resumed_tags()[-1] == "v-2"
    g.wait_steps_with("v-2")
    assert g.mixed_steps() == []


@pytest.mark.parametrize("failpoint,outcome,ranks", [
    ("after_receive=crash", "aborted", 1),  # prepare: dies receiving
    ("mid_commit=crash", "aborted", 1),     # commit: dies with its engine paused, copy not started
    ("group_copied=crash", "aborted", 1),   # commit: copied, dies before answering
    ("group_resume=crash", "dirty", 1),     # resume: dies with the resume in hand
    ("group_copied=crash", "aborted", 2),   # the same with two engine ranks on every member
    ("group_resume=crash", "dirty", 2),
])
def test_a_member_killed_at_each_phase(engine_group, failpoint, outcome, ranks):
    g = engine_group(members=3 if ranks == 1 else 2, ranks_per_member=ranks)
    g.refit(tag="base")
    g.wait_steps_with("base-0")
    g.restart(1, failpoint)
    _, lines = g.refit(tag="next", check=False, timeout_ms=4000)
    assert lines[-1]["group"] == outcome, lines
    assert g.nodes[1].wait_daemon_dead() == -signal.SIGKILL
    # Whatever was lost, no forward step mixed versions meanwhile.
    time.sleep(0.5)
    assert g.mixed_steps() == []
    # The member comes back joining; the trainer's next group refit brings every rank to it.
    g.restart(1)
    assert g.status(1)["group"]["phase"] == "joining"
    _, lines = g.refit(tag="after")
    assert lines[-1]["group"] == "committed", lines
    g.wait_steps_with("after-0")
    assert g.mixed_steps() == []
    assert g.members_status()["consistent"]


def test_trainer_killed_while_preparing_leaves_every_rank_on_its_version(engine_group):
    g = engine_group(members=3)
    g.refit(tag="kept")
    g.wait_steps_with("kept-0")
    p, _ = g.refit("--fault", "die-mid-bucket", tag="half", check=False)
    assert p.returncode != 0
    # Every member aborts the session when its trainer goes; nothing was paused.
    for n in g.nodes:
        wait_for(lambda n=n: "outcome=aborted" in n.log(), what="the half-sent session aborted")
        assert n.resumed_tags()[-1] == "kept-0"
    g.wait_steps_with("kept-0")
    _, lines = g.refit(tag="next")
    assert lines[0]["group"] == "committed"
    g.wait_steps_with("next-0")
    assert g.mixed_steps() == []


def test_a_member_stalled_with_the_resume_in_hand_ends_consistent(engine_group):
    # Member 2 stalls 2.5 s on the resume (its loop blocked, as a SIGSTOP would): the trainer's
    # bound passes and it reports the group dirty, but the member then resumes the same version.
    g = engine_group(members=3, decision_ms=1500, failpoints={2: "group_resume=delay:2500"})
    _, lines = g.refit(tag="slow", check=False, timeout_ms=1000)
    assert lines[0]["group"] == "dirty", lines
    g.wait_steps_with("slow-0")
    assert g.mixed_steps() == []


def test_trainer_killed_between_the_phases_members_restore_at_their_deadline(engine_group):
    g = engine_group(members=3, decision_ms=1200)
    g.refit(tag="good")
    g.wait_steps_with("good-0")
    t0 = time.monotonic()
    p, lines = g.refit("--group-fault", "exit-after-copy", tag="lost", check=False)
    assert p.returncode == 5 and lines[-1]["group"] == "copied", p.stdout + p.stderr
    # Every member is paused holding lost-0; at its deadline each restores good-0 and resumes.
    g.wait_steps_with("good-0", timeout=10)
    assert elapsed_ms(t0) < 1200 + 5000, "the ranks stayed paused long past the members' deadline"
    assert g.mixed_steps() == []
    for i in range(3):
        s = g.status(i)["group"]
        assert s["dirty"] and "deadline" in s["reason"] and s["deadline_expiries"] == 1, s
        assert "lost-0" not in g.nodes[i].resumed_tags()
    assert not g.members_status()["consistent"]
    # The next group version cleans the group.
    _, lines = g.refit(tag="clean")
    assert lines[0]["group"] == "committed"
    g.wait_steps_with("clean-0")
    assert g.members_status()["consistent"]


def test_a_member_sigstopped_past_its_deadline_restores_when_continued(engine_group):
    g = engine_group(members=2, decision_ms=1000)
    g.refit(tag="base")
    g.wait_steps_with("base-0")
    p, lines = g.refit("--group-fault", "exit-after-copy", tag="cut", check=False)
    assert lines[-1]["group"] == "copied"
    g.nodes[1].daemon.send_signal(signal.SIGSTOP)
    try:
        time.sleep(2.0)  # member 0 restores at its deadline; member 1 is stopped, its rank paused
        assert g.mixed_steps() == []
        assert g.status(0)["group"]["dirty"]
    finally:
        g.nodes[1].daemon.send_signal(signal.SIGCONT)
    g.wait_steps_with("base-0", timeout=10)
    assert g.mixed_steps() == []


def test_a_restarted_member_joins_until_a_group_version_lands(engine_group):
    g = engine_group(members=2)
    g.refit(tag="v")
    g.wait_steps_with("v-0")
    g.restart(0)  # killed idle: its engine keeps serving v-0 and registers again, clean
    s = g.status(0)
    assert s["group"]["phase"] == "joining" and s["tag"] == "v-0", s
    code, body = g.nodes[0].admin("/readyz")
    assert code == 503 and "joining" in body
    assert not g.members_status()["consistent"]
    _, lines = g.refit(tag="w")
    assert lines[0]["group"] == "committed"
    g.wait_steps_with("w-0")
    assert g.members_status()["consistent"]
    assert g.mixed_steps() == []


def _steps_after(g, i, before):
    """The tags of member i's ranks' steps numbered past `before` ({rank: last step number})."""
    return {t for (m, r), rows in g.steps().items() if m == i for n, t in rows.items() if n > before[r]}


@pytest.mark.parametrize("ranks,daemon", [(1, True), (2, True), (1, False)],
                         ids=["1rank", "2ranks", "engine-only"])
def test_a_member_restarted_with_fresh_engine_ranks_is_held_until_the_next_group_version(engine_group, ranks, daemon):
    """Late join: member 0's node restarts (refitd and its engine ranks, which come back with their
    initial weights; or only the engine, under its running refitd) while the group is at v-0. Its
    peers tell it the group's version; its ranks, holding another, are paused before they serve a
    step, and the group's next refit brings them in. No step mixes versions."""
    g = engine_group(members=2, ranks_per_member=ranks, peers=True)
    g.refit(tag="v")
    g.wait_steps_with("v-0")
    before = {r: max(rows) for (m, r), rows in g.steps().items() if m == 0}
    g.restart_with_fresh_engine(0, daemon=daemon)
    s = g.status(0)
    assert s["group"]["phase"] == "joining", s
    assert s["group"]["group_version"] == "v-0", s
    assert "group engine-a is at version 'v-0'" in s["group"]["reason"], s
    assert "kept paused" in s["group"]["reason"], s
    code, body = g.nodes[0].admin("/readyz")
    assert code == 503 and "engine-a" in body and "v-0" in body, body
    assert "event=group_join_hold" in g.nodes[0].log()
    _, metrics = g.nodes[0].admin("/metrics")
    assert 'refit_group_phase{phase="joining"} 1' in metrics
    # Held: the fresh ranks run no step (and with them, in lockstep, no rank does).
    count = g.step_count()
    time.sleep(1.0)
    assert g.step_count() == count
    assert g.mixed_steps() == []
    assert not g.members_status()["consistent"]
    # The trainer's next group refit lands on every member, the held one included.
    _, lines = g.refit(tag="w")
    assert lines[0]["group"] == "committed", lines
    g.wait_steps_with("w-0")
    s = g.status(0)
    assert s["group"]["phase"] == "idle" and s["group"]["tag"] == "w-0" and not s["engine_dirty"], s
    assert g.members_status()["consistent"]
    assert g.mixed_steps() == []
    # The restarted ranks ran no step before w-0 landed on them.
    assert _steps_after(g, 0, before) <= {"v-0", "w-0"}
    assert "-" not in _steps_after(g, 0, before)


def test_without_peers_a_fresh_engine_of_a_restarted_member_mixes_steps(engine_group):
    """The control of the test above: without group.addresses the restarted member cannot know the
    group's version, and its fresh engine serves its initial weights next to v-0."""
    g = engine_group(members=2)
    g.refit(tag="v")
    g.wait_steps_with("v-0")
    g.restart_with_fresh_engine(0)
    wait_for(lambda: g.mixed_steps(), what="a step mixing the fresh engine's weights with v-0")
    assert g.status(0)["group"]["group_version"] == ""


def test_a_restarted_member_whose_engine_holds_the_group_version_serves_at_once(engine_group):
    """Late join: member 0's refitd restarts while its engine keeps v-0 (idle, clean); its peer
    says the group is at v-0, so it joins without a refit."""
    g = engine_group(members=2, peers=True)
    g.refit(tag="v")
    g.wait_steps_with("v-0")
    g.restart(0)
    wait_for(lambda: g.status(0)["group"]["phase"] == "idle", what="member 0 joined at v-0")
    s = g.status(0)
    assert s["group"]["tag"] == "v-0" and s["group"]["group_version"] == "v-0" and not s["engine_dirty"], s
    code, _ = g.nodes[0].admin("/readyz")
    assert code == 200
    assert g.members_status()["consistent"]
    assert "event=group_joined" in g.nodes[0].log()
    g.wait_steps_with("v-0")  # never paused
    _, lines = g.refit(tag="w")
    assert lines[0]["group"] == "committed", lines
    g.wait_steps_with("w-0")
    assert g.mixed_steps() == []


def test_a_member_started_while_its_peers_are_unreachable_asks_again(engine_group):
    """Late join with group.peers_unreachable: serve: member 0's node restarts fresh while its
    peer's refitd is stopped (SIGSTOP): no peer answers, so nothing is known and its engine is not
    held at first (serve: its steps may mix). It asks again every second; once the peer answers it
    learns the group's version and holds its engine until the group's next version lands."""
    g = engine_group(members=2, peers=True, peers_unreachable="serve")
    g.refit(tag="v")
    g.wait_steps_with("v-0")
    g.nodes[1].daemon.send_signal(signal.SIGSTOP)
    try:
        g.restart_with_fresh_engine(0)
        assert g.status(0)["group"]["group_version"] == ""
    finally:
        g.nodes[1].daemon.send_signal(signal.SIGCONT)
    wait_for(lambda: "event=group_join_hold" in g.nodes[0].log(), timeout=30,
             what="member 0 holding its fresh engine once its peer answered")
    s = g.status(0)
    assert s["group"]["group_version"] == "v-0" and s["group"]["phase"] == "joining", s
    assert "kept paused" in s["group"]["reason"], s
    _, lines = g.refit(tag="w")
    assert lines[0]["group"] == "committed", lines
    g.wait_steps_with("w-0")
    assert g.members_status()["consistent"]


@pytest.mark.parametrize("ranks", [1, 2], ids=["1rank", "2ranks"])
def test_a_member_started_while_its_peers_are_unreachable_holds_its_ranks_until_one_answers(engine_group, ranks):
    """Late join with the default group.peers_unreachable: hold: member 0's node restarts fresh
    while its peer's refitd is stopped (SIGSTOP). No peer answers, so the group's version is
    unknown: its fresh ranks are paused before they serve a step. Once the peer answers (v-0) they
    stay paused, now for the group's next version, which brings them in. No step mixes versions."""
    g = engine_group(members=2, ranks_per_member=ranks, peers=True)
    g.refit(tag="v")
    g.wait_steps_with("v-0")
    before = {r: max(rows) for (m, r), rows in g.steps().items() if m == 0}
    g.nodes[1].daemon.send_signal(signal.SIGSTOP)
    try:
        g.restart_with_fresh_engine(0)
        s = g.status(0)
        assert s["group"]["phase"] == "joining" and s["group"]["group_version"] == "", s
        assert "no peer of group engine-a answered" in s["group"]["reason"], s
        assert "event=group_join_hold" in g.nodes[0].log()
        code, body = g.nodes[0].admin("/readyz")
        assert code == 503 and "no peer of group engine-a answered" in body, body
        # Held: the fresh ranks run no step (and with them, in lockstep, no rank does).
        count = g.step_count()
        time.sleep(1.0)
        assert g.step_count() == count
        assert g.mixed_steps() == []
    finally:
        g.nodes[1].daemon.send_signal(signal.SIGCONT)
    wait_for(lambda: g.status(0)["group"]["group_version"] == "v-0", timeout=30,
             what="member 0 learning the group's version once its peer answered")
    s = g.status(0)
    assert s["group"]["phase"] == "joining" and "kept paused" in s["group"]["reason"], s
    assert "event=group_join_release" not in g.nodes[0].log()  # fresh ranks: they stay held
    assert g.mixed_steps() == []
    _, lines = g.refit(tag="w")
    assert lines[0]["group"] == "committed", lines
    g.wait_steps_with("w-0")
    assert g.members_status()["consistent"]
    assert g.mixed_steps() == []
    assert "-" not in _steps_after(g, 0, before)


def test_a_registration_is_answered_once_the_start_up_ask_held_its_engine(engine_group):
    """Late join, two asks at once: member 0 restarts fresh while its peer's refitd is stopped
    (SIGSTOP), so the ask it starts with is still waiting for the peer when its engine registers and
    asks too. The start-up ask ends first and holds the engine, its pause slowed down
    (group_join_hold); the registration's own ask finds the engine held already, and the
    registration is answered only once that pause was: the fresh engine runs no step."""
    g = engine_group(members=2, peers=True)
    g.refit(tag="v")
    g.wait_steps_with("v-0")
    before = {r: max(rows) for (m, r), rows in g.steps().items() if m == 0}
    g.nodes[1].daemon.send_signal(signal.SIGSTOP)
    try:
        g.restart_with_fresh_engine(0, failpoints="group_join_hold=delay:1500")
        # Registered: the start-up ask's pause (1.5 s late) was answered first.
        assert 'event=group_join_hold engine="the engine" paused=true' in g.nodes[0].log()
        count = g.step_count()
        time.sleep(1.0)
        assert g.step_count() == count
        assert g.mixed_steps() == []
    finally:
        g.nodes[1].daemon.send_signal(signal.SIGCONT)
    wait_for(lambda: g.status(0)["group"]["group_version"] == "v-0", timeout=30,
             what="member 0 learning the group's version once its peer answered")
    _, lines = g.refit(tag="w")
    assert lines[0]["group"] == "committed", lines
    g.wait_steps_with("w-0")
    assert g.mixed_steps() == []
    assert "-" not in _steps_after(g, 0, before)


def test_a_member_held_while_its_peer_is_down_runs_once_the_restarted_peer_knows_nothing(engine_group):
    """The whole group restarts (hold, the default): member 0 comes back while member 1 is down and
    holds its fresh engine; member 1 comes back fresh too and answers that it knows no group
    version (joining), so member 0 releases its engine: both run their initial weights, as a group
    that starts, until the trainer's first group refit."""
    g = engine_group(members=2, peers=True)
    g.refit(tag="v")
    g.wait_steps_with("v-0")
    g.nodes[1].daemon.kill()
    g.nodes[1].daemon.wait()
    g.restart_with_fresh_engine(0)
    assert "no peer of group engine-a answered" in g.status(0)["group"]["reason"]
    assert "event=group_join_hold" in g.nodes[0].log()
    g.restart_with_fresh_engine(1)
    wait_for(lambda: "event=group_join_release" in g.nodes[0].log(), timeout=30,
             what="member 0 releasing its engine once its restarted peer answered")
    g.wait_steps_with("-")
    s = g.status(0)
    assert s["group"]["phase"] == "joining" and "know none either" in s["group"]["reason"], s
    _, lines = g.refit(tag="w")
    assert lines[0]["group"] == "committed", lines
    g.wait_steps_with("w-0")
    assert g.members_status()["consistent"]
    assert g.mixed_steps() == []


@pytest.fixture
def nccl_group(monkeypatch):
    """Where the NCCL variant puts the members and the trainer (refit_harness.nccl_placement: GPU 1
    and GPU 0 with two GPUs; with one, all on GPU 0, each process with its own NCCL_HOSTID, and
    each member's refitd its own again, group_lockstep.py). Skips without a GPU or without NCCL in
    the build."""
    smi = shutil.which("nvidia-smi")
    gpus = 0
    if smi is not None:
        p = subprocess.run([smi, "-L"], capture_output=True, text=True)
        gpus = sum(1 for line in p.stdout.splitlines() if line.startswith("GPU "))
    if gpus == 0:
        pytest.skip("no CUDA device" + ("" if smi else ": nvidia-smi not found"))
    cache = h.BIN / "CMakeCache.txt"
    if "REFIT_NCCL_LIBRARY:FILEPATH=/" not in (cache.read_text() if cache.exists() else ""):
        pytest.skip("refitd was built without NCCL")
    return h.nccl_placement(gpus, monkeypatch)


@pytest.mark.parametrize("members,ranks", [(3, 1), (2, 2)], ids=["3x1", "2x2"])
def test_group_refits_over_nccl_switch_every_rank_together(engine_group, nccl_group, members, ranks):
    """The GPU variant: every member stages on the GPU and receives over NCCL (one broadcast per
    bucket from the trainer's GPU to every member), its engine ranks' parameters in GPU memory; a
    member that cannot copy aborts the version everywhere; no step mixes versions."""
    fp = {1: "group_copied=error@3"}
    g = engine_group(members=members, ranks_per_member=ranks, gpu=nccl_group, failpoints=fp)
    for n in g.nodes:
        assert "data=nccl:" in n.log(), n.log()[-2000:]
    g.wait_steps_with("-")
    _, lines = g.refit(refits=4, tag="n", check=False, timeout=300)
    assert [l["group"] for l in lines] == ["committed", "committed", "aborted", "committed"], lines
    for n in g.nodes:
        assert "n-2" not in n.resumed_tags(), n.resumed_tags()
        assert n.resumed_tags()[-1] == "n-3"
    g.wait_steps_with("n-3")
    assert g.mixed_steps() == []
    assert g.members_status()["consistent"]
