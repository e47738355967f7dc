"""Soak: many consecutive refits with faults injected at random (trainer faults and refitd
crashes at random failpoints). Ground truth is the engine: its resumed versions, its shm bytes,
and its count of requests that saw a mix of versions. Writes the counts to
$REFIT_BINARY_DIR/faults_soak.json (docs/reliability.md quotes them)."""
import json
import os
import random
import signal
import subprocess

from conftest import BIN, wait_for

TRAINER_FAULTS = ["bit-flip", "garbage", "abort", "die-mid-bucket", "duplicate", "strand-gate"]
FAILPOINTS = ["after_receive", "after_convert", "before_commit", "mid_commit", "after_copy", "after_commit"]
INSIDE_WINDOW = {"mid_commit", "after_copy"}


def test_soak_random_faults(fault_node):
    refits = int(os.environ.get("REFIT_SOAK_REFITS", "40"))
    seed = int(os.environ.get("REFIT_SOAK_SEED", "20240601"))
    rng = random.Random(seed)
    node = fault_node(config="limits:\n  bucket_bytes: 1048576\n")
    counts = {"attempted": 0, "committed": 0, "aborted": 0, "refitd_crashes": 0, "dirty_recoveries": 0,
              "mixed_version_requests": 0, "stuck_trainers": 0, "seed": seed, "by_fault": {}}
    version = 0
    digest = node.shm_digest()
    dirty = False
    for i in range(refits):
        kind = rng.choice(["none"] * 4 + ["trainer"] * 3 + ["crash"] * 3)
        fault = "none" if kind == "none" else rng.choice(TRAINER_FAULTS if kind == "trainer" else FAILPOINTS)
        counts["attempted"] += 1
        counts["by_fault"][fault] = counts["by_fault"].get(fault, 0) + 1
        was_dirty = dirty
        if kind == "crash":
            node.daemon.send_signal(signal.SIGTERM)
            assert node.daemon.wait(timeout=30) == 0
            node.start_daemon(failpoints=f"{fault}=crash")
            node.wait_registered()
            node.trainer("--refits", "1", "--seed", str(100 + i))
            assert node.wait_daemon_dead() == -signal.SIGKILL
            counts["refitd_crashes"] += 1
            node.start_daemon()
            node.wait_registered()
            dirty = False if fault == "after_commit" else (was_dirty or fault in INSIDE_WINDOW)
            assert f"dirty={'true' if dirty else 'false'}" in node.log()
            landed = fault == "after_commit"
        else:
            t = node.trainer_async("--refits", "1", "--seed", str(100 + i),
                                   *([] if fault == "none" else ["--fault", fault]))
            try:
                out, err = t.communicate(timeout=60 if fault == "none" else 20)
            except subprocess.TimeoutExpired:
                # Known issue (docs/reliability.md): a corrupted bucket in flight when refitd drops
                # the session can leave the trainer's UCX send waiting; refitd is unaffected.
                assert fault in ("bit-flip", "garbage"), (i, fault)
                t.kill()
                out, err = t.communicate()
                counts["stuck_trainers"] += 1
            lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
            landed = bool(lines) and lines[0]["outcome"] == "committed"
            if fault == "none":
                assert landed and lines[0]["engine_matches_expected"], (i, lines, err)
                dirty = False
            else:
                assert not landed, (i, fault, lines)
        if landed:
            version += 1
            counts["committed"] += 1
            if was_dirty:
                counts["dirty_recoveries"] += 1
            wait_for(lambda: node.resumed_versions()[-1:] == [version], what=f"resume of {version}")
            assert node.shm_digest() != digest
            digest = node.shm_digest()
        else:
            counts["aborted"] += 1
            if not dirty:
                assert node.shm_digest() == digest, (i, fault)
            else:
                digest = node.shm_digest()  # paused: the engine serves nothing until a full refit
        assert node.resumed_versions() == list(range(1, version + 1)), (i, fault)
    if dirty:
        _, lines = node.trainer("--refits", "1", "--seed", "999")
        assert lines[0]["outcome"] == "committed"
        counts["attempted"] += 1
        counts["committed"] += 1
        counts["dirty_recoveries"] += 1
        version += 1
    report = node.stop()
    counts["mixed_version_requests"] = report["mixed"]
    counts["engine_requests"] = report["requests"]
    counts["final_version"] = version
    (BIN / "faults_soak.json").write_text(json.dumps(counts, indent=1, sort_keys=True) + "\n")
    print(json.dumps(counts, sort_keys=True))
    assert report["mixed"] == 0 and report["dirty"] is False
    assert counts["committed"] + counts["aborted"] == counts["attempted"]
