"""Soak of an engine group (docs/architecture.md "Engine groups"): at least 200 group refits
(REFIT_GROUP_SOAK_REFITS, default 200) in batches of one trainer process each, with a random
fault between batches — a member killed at a random phase (failpoints), a member failing one copy
or stalling one resume, the trainer dying while it prepares or between the phases, a member
restarted idle — while
the engine's ranks step in lockstep. Asserted: no forward step ever mixed versions, every trainer
finished within its bound (none waited on a member past the deadlines), and the group ends
consistent on the last version. REFIT_GROUP_SOAK_SEED picks the faults (printed on failure)."""
import os
import random

from group_lockstep import EngineGroup, wait_for

BATCH = 10
CRASHES = ["after_receive=crash", "mid_commit=crash", "group_copied=crash", "group_resume=crash"]


def test_group_soak(tmp_path):
    refits = int(os.environ.get("REFIT_GROUP_SOAK_REFITS", "200"))
    seed = int(os.environ.get("REFIT_GROUP_SOAK_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    g = EngineGroup(tmp_path / "group", members=2, decision_ms=1000)
    history = []
    outcomes = {}
    try:
        done = 0
        batch = 0
        while done < refits:
            batch += 1
            fault = rng.choice(["none", "none", "crash", "copy-error", "resume-stall", "trainer-exit", "trainer-dies",
                                "restart"])
            member = rng.randrange(g.size)
            history.append((batch, fault, member))
            extra = []
            if fault == "crash":
                g.restart(member, rng.choice(CRASHES))
            elif fault == "copy-error":
                g.restart(member, f"group_copied=error@{rng.randint(1, BATCH)}")
            elif fault == "resume-stall":
                g.restart(member, f"group_resume=delay:1500@{rng.randint(1, BATCH)}")
            elif fault == "restart":
                g.restart(member)
            elif fault == "trainer-exit":
                extra = ["--group-fault", "exit-after-copy"]
            elif fault == "trainer-dies":
                extra = ["--fault", "die-mid-bucket"]  # dies preparing its first group version
            # Each trainer is bounded: a member that made it wait past the deadlines fails the soak.
            _, lines = g.refit(*extra, refits=BATCH, tag=f"b{batch}", check=False, timeout=90, timeout_ms=1200)
            for l in lines:
                outcomes[l["group"]] = outcomes.get(l["group"], 0) + 1
            done += sum(1 for l in lines if l["group"] in ("committed", "aborted", "dirty"))
            if fault in ("trainer-exit", "trainer-dies"):
                done += 1
            # A member the fault killed comes back without failpoints; one armed and alive too.
            if fault in ("crash", "copy-error", "resume-stall"):
                g.restart(member)
            # No member stays paused with a group version past its deadline (plus its restore).
            settled = lambda: all(g.status(i)["group"]["phase"] in ("idle", "joining") for i in range(g.size))  # noqa: E731
            wait_for(settled, timeout=g.decision_ms / 1000 + 5, what=f"seed {seed}: every member settled after {history[-1]}")
            mixed = g.mixed_steps()
            assert mixed == [], f"seed {seed}: mixed steps {mixed[:5]} after {history[-3:]}"
        # The group ends consistent: a last clean group refit lands on every rank.
        _, lines = g.refit(tag="final", timeout=60)
        assert lines[0]["group"] == "committed", lines
        g.wait_steps_with("final-0", timeout=30)
        assert g.mixed_steps() == [], f"seed {seed}"
        assert g.members_status()["consistent"]
        assert outcomes.get("committed", 0) >= refits // 2, (seed, outcomes)
        print(f"group soak: seed {seed}, {done} group refits, outcomes {outcomes}, steps {g.step_count()}")
    finally:
        g.close()
