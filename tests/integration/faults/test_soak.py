"""Soak: many consecutive refits, each with one fault injected at random, from every side:
the trainer (corrupt, abort, die, duplicate, strand a group member, stall past the session
deadline), refitd (killed at a random failpoint or at a random moment, SIGTERM at a random
moment, then restarted) and the engine (killed or stopped with SIGTERM at a random moment and
replaced, stopped with SIGSTOP past the pause deadline and continued).

Ground truth is the engine: its resumed versions, its shm bytes and its count of requests that
saw a mix of versions. After each refit the node must settle (trainer exited, no session open,
engine registered and ready) within the deadlines; a refit landed exactly when the engine's
version advanced, and then its bytes changed; otherwise they did not, unless the engine is
dirty (refitd died inside the commit window), which only a full refit clears.

REFIT_SOAK_REFITS (default 40) and REFIT_SOAK_SECONDS (default 600: no refit starts after it)
bound the run; REFIT_SOAK_SEED picks the faults. The counts go to
$REFIT_BINARY_DIR/faults_soak.json (docs/reliability.md quotes the last long run)."""
import json
import os
import random
import re
import signal
import subprocess
import time

from conftest import BIN, wait_for

TRAINER_FAULTS = ["bit-flip", "garbage", "abort", "die-mid-bucket", "duplicate", "strand-gate", "stall"]
FAILPOINTS = ["after_receive", "after_convert", "before_commit", "mid_commit", "after_copy", "after_commit"]
INSIDE_WINDOW = {"mid_commit", "after_copy"}
# kind -> weight
KINDS = {"none": 34, "trainer": 22, "failpoint": 10, "refitd-kill": 8, "refitd-term": 5, "engine-kill": 6,
         "engine-term": 5, "engine-stop": 10}
DEADLINE_MS = 5000
PAUSE_TIMEOUT_MS = 500
SETTLE_S = 30  # beyond the deadlines: a node not settled by then counts as a hang


def metric(node, name):
    status, body = node.admin("/metrics")
    if status != 200:
        return None
    m = re.search(rf"^{name} (\S+)$", body, re.M)
    return float(m.group(1)) if m else None


def test_soak_random_faults(fault_node):
    refits = int(os.environ.get("REFIT_SOAK_REFITS", "40"))
    budget_s = float(os.environ.get("REFIT_SOAK_SECONDS", "600"))
    seed = int(os.environ.get("REFIT_SOAK_SEED", "20240601"))
    rng = random.Random(seed)
    node = fault_node(config=f"limits:\n  bucket_bytes: 1048576\n  session_deadline_ms: {DEADLINE_MS}\n"
                             f"engine:\n  pause_timeout_ms: {PAUSE_TIMEOUT_MS}\n  resume_timeout_ms: {PAUSE_TIMEOUT_MS}\n")
    counts = {"attempted": 0, "committed": 0, "not_committed": 0, "refitd_kills": 0, "refitd_crashes": 0,
              "engines_replaced": 0, "dirty_recoveries": 0, "hangs": 0, "mixed_version_requests": 0,
              "engine_requests": 0, "seed": seed, "by_fault": {}, "landed_by_fault": {}}
    hangs = []
    started = time.monotonic()

    def engine_report():
        for l in node.engine_log.read_text().splitlines():
            if '"exit"' in l:
                return json.loads(l)
        return None

    def add_report(report):
        assert report is not None, node.engine_log.read_text()[-2000:]
        counts["mixed_version_requests"] += report["mixed"]
        counts["engine_requests"] += report["requests"]

    def registrations():
        return node.log().count("event=engine_registered")

    def restart_daemon(failpoints=""):
        events = len(node.events("reregistered"))
        node.start_daemon(failpoints=failpoints)
        node.wait_registered()
        wait_for(lambda: len(node.events("reregistered")) > events, what="the engine registering again")
        return node.events("reregistered")[-1]["dirty"]

    def replace_engine(sig):
        unregistered, before = node.log().count("event=engine_unregistered"), registrations()
        node.engine.send_signal(sig)
        node.engine.wait(timeout=30)
        if sig == signal.SIGTERM:
            add_report(engine_report())
        wait_for(lambda: node.log().count("event=engine_unregistered") > unregistered, what="the engine's unregistration")
        node.start_engine()
        wait_for(lambda: registrations() > before, what="the new engine's registration")
        counts["engines_replaced"] += 1

    def settle(what):
        try:
            wait_for(lambda: node.daemon.poll() is not None or metric(node, "refit_active_sessions") == 0,
                     timeout=SETTLE_S, what=f"no open session after {what}")
        except AssertionError:
            hangs.append(("session", what))

    dirty = False
    last_version = 0
    digest = node.shm_digest()
    i = 0
    while i < refits and time.monotonic() - started < budget_s:
        kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        fault = {"trainer": lambda: rng.choice(TRAINER_FAULTS), "failpoint": lambda: rng.choice(FAILPOINTS)}.get(
            kind, lambda: kind)()
        counts["attempted"] += 1
        counts["by_fault"][fault] = counts["by_fault"].get(fault, 0) + 1
        was_dirty = dirty
        args = ["--refits", "1", "--seed", str(100 + i)]
        new_engine = False
        if kind == "failpoint":
            node.daemon.send_signal(signal.SIGTERM)
            assert node.daemon.wait(timeout=30) == 0, node.log()[-2000:]
            restart_daemon(failpoints=f"{fault}=crash")
            p, _ = node.trainer(*args, timeout=DEADLINE_MS / 1000 + SETTLE_S)
            assert node.wait_daemon_dead() == -signal.SIGKILL, node.log()[-2000:]
            counts["refitd_kills"] += 1
            reported_dirty = restart_daemon()
            dirty = False if fault == "after_commit" else (was_dirty or fault in INSIDE_WINDOW)
            assert reported_dirty == dirty, (i, fault, reported_dirty, dirty)
        else:
            ended = node.log().count("event=refit ")
            t = node.trainer_async(*args, *(["--fault", fault] if kind == "trainer" else []))
            delay = rng.uniform(0.0, 0.4)
            if kind in ("refitd-kill", "refitd-term", "engine-kill", "engine-term", "engine-stop"):
                time.sleep(delay)
            if kind == "refitd-kill":
                node.daemon.send_signal(signal.SIGKILL)
                node.daemon.wait(timeout=30)
                counts["refitd_kills"] += 1
            elif kind == "refitd-term":
                node.daemon.send_signal(signal.SIGTERM)
                try:
                    if node.daemon.wait(timeout=PAUSE_TIMEOUT_MS / 1000 * 2 + SETTLE_S) != 0:
                        counts["refitd_crashes"] += 1
                except subprocess.TimeoutExpired:
                    hangs.append(("sigterm", i))
                    node.daemon.kill()
                    node.daemon.wait()
            elif kind in ("engine-kill", "engine-term"):
                replace_engine(signal.SIGKILL if kind == "engine-kill" else signal.SIGTERM)
                new_engine = True
            elif kind == "engine-stop":
                node.engine.send_signal(signal.SIGSTOP)
                time.sleep(rng.uniform(0.2, 1.5))
                node.engine.send_signal(signal.SIGCONT)
            if fault == "stall":  # the session deadline ends it; the stalled process is then let go
                wait_for(lambda: node.log().count("event=refit ") > ended, timeout=DEADLINE_MS / 1000 + SETTLE_S,
                         what="the stalled session's deadline")
                t.kill()
            try:
                out, err = t.communicate(timeout=DEADLINE_MS / 1000 + SETTLE_S)
            except subprocess.TimeoutExpired:
                hangs.append(("trainer", i, fault))
                t.kill()
                out, err = t.communicate()
            if kind in ("refitd-kill", "refitd-term"):
                dirty = restart_daemon()  # the engine says whether refitd died inside the commit window
            elif node.daemon.poll() is not None:
                counts["refitd_crashes"] += 1  # nobody killed it
                dirty = restart_daemon()
            lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
            if fault == "none":
                assert lines and lines[0]["outcome"] == "committed" and lines[0]["engine_matches_expected"], (i, lines, err)
        settle(fault)
        if kind == "engine-stop" or kind.startswith("refitd"):
            try:  # the engine answers again (a late pause or resume is answered; readiness follows)
                wait_for(lambda: dirty or node.admin("/readyz")[0] == 200, timeout=SETTLE_S, what="readiness")
            except AssertionError:
                hangs.append(("ready", i, fault))
        versions = node.resumed_versions()
        if new_engine:  # the refit in flight may or may not land on the new engine: both are defined
            digest, dirty = node.shm_digest(), False
            last_version = versions[-1] if versions else 0
            landed = False
        else:
            if not dirty and node.shm_digest() != digest:
                # Bytes copied whose resume was late (engine stopped): the version follows.
                try:
                    wait_for(lambda: (node.resumed_versions() or [0])[-1] > last_version, timeout=SETTLE_S,
                             what="the resume of the copied version")
                except AssertionError:
                    hangs.append(("resume", i, fault))
                versions = node.resumed_versions()
            landed = bool(versions) and versions[-1] > last_version
        # Never backwards; a version repeats when a late pause is answered by the resume refitd
        # queued behind it (the engine goes on with the version it has).
        assert versions == sorted(versions), (i, fault, versions)
        if landed:
            assert kind != "trainer", (i, fault, "a faulty trainer's refit landed")
            last_version = versions[-1]
            counts["committed"] += 1
            counts["landed_by_fault"][fault] = counts["landed_by_fault"].get(fault, 0) + 1
            if was_dirty or dirty:
                counts["dirty_recoveries"] += 1
            dirty = False
            new_digest = node.shm_digest()
            assert new_digest != digest, (i, fault)
            digest = new_digest
        else:
            counts["not_committed"] += 1
            if not dirty:
                assert node.shm_digest() == digest, (i, fault)
            else:
                digest = node.shm_digest()  # paused: the engine serves nothing until a full refit
        i += 1
    if dirty:
        _, lines = node.trainer("--refits", "1", "--seed", "999")
        assert lines[0]["outcome"] == "committed"
        counts["attempted"] += 1
        counts["committed"] += 1
        counts["dirty_recoveries"] += 1
    node.engine.send_signal(signal.SIGTERM)
    node.engine.wait(timeout=30)
    add_report(engine_report())
    node.daemon.send_signal(signal.SIGTERM)
    assert node.daemon.wait(timeout=30) == 0, node.log()[-4000:]
    counts["hangs"] = len(hangs)
    counts["hang_details"] = hangs
    counts["seconds"] = round(time.monotonic() - started, 1)
    (BIN / "faults_soak.json").write_text(json.dumps(counts, indent=1, sort_keys=True) + "\n")
    print(json.dumps(counts, sort_keys=True))
    assert counts["mixed_version_requests"] == 0
    assert counts["refitd_crashes"] == 0 and not hangs, counts
    assert counts["committed"] + counts["not_committed"] == counts["attempted"]
