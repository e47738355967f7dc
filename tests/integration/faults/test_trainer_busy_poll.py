"""The trainer's side of busy polling (src/client/trainer_client.cc, docs/operations.md "Busy
polling"): a trainer that busy polls (REFIT_BUSY_POLL=1, or 8 or more CPUs) checks for its
commit's answer without sleeping, for at most 2 s per commit; one that does not sleeps through
the wait. refitd holds each answer back with a failpoint, so the wait is long enough to see on the
trainer's CPU time."""
import resource

from conftest import finish

HOLD_S = 0.5  # after_commit=delay: the engine resumed, the trainer's answer held this long


def trainer_cpu_seconds(node, busy_poll: str, refits: int):
    env = dict(node.env, REFIT_BUSY_POLL=busy_poll)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p, lines = node.trainer("--refits", str(refits), env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert p.returncode == 0, p.stderr
    assert [l["outcome"] for l in lines] == ["committed"] * refits, lines
    assert all(l["engine_matches_expected"] for l in lines), lines
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def test_a_busy_polling_trainer_spins_for_its_commit_answer_and_lands_the_same(fault_node):
    node = fault_node(failpoints=f"after_commit=delay:{int(HOLD_S * 1000)}")
    asleep = trainer_cpu_seconds(node, "0", 2)
    spinning = trainer_cpu_seconds(node, "1", 2)
    # Two answers held 0.5 s each: a spinning trainer burns up to that on the CPU (less when other
    # processes share the CPUs: 0.6 s of the 1 s with two busy loops on two cores), a sleeping one
    # only its own work (the same in both runs, about 0.06 s).
    assert spinning - asleep > 2 * HOLD_S * 0.2, (asleep, spinning)
    assert asleep < spinning / 2, (asleep, spinning)
    finish(node, [1, 2, 3, 4])
