"""The engine going away, being replaced or stopping to answer while a commit is in flight
(docs/reliability.md, "The engine during a commit"). Each was a crash or a hang of refitd before
engine records were shared and pause/resume had deadlines; each is now one defined outcome, and
refitd serves the next refit."""
import signal
import subprocess
import time

from conftest import ENGINE, wait_for

SLOW_COPY = "mid_commit=delay:1500"


def alive(node):
    return node.daemon.poll() is None


def test_engine_killed_inside_the_commit_window(fault_node):
    # Expected: the commit ends failed with cause engine_error, refitd stays up, and a new
    # engine's refit lands.
    node = fault_node(failpoints=SLOW_COPY)
    t = node.trainer_async("--refits", "1")
    wait_for(lambda: "phase=copying" in node.log(), what="commit window")
    node.engine.send_signal(signal.SIGKILL)
    node.engine.wait()
    out, err = t.communicate(timeout=60)
    assert '"outcome":"committed"' not in out, out
    wait_for(lambda: "outcome=failed cause=engine_error" in node.log(), what="the commit's outcome")
    assert alive(node), node.log()
    node.start_engine()
    _, lines = node.trainer("--refits", "1")
    assert lines and lines[-1]["outcome"] == "committed", (lines, node.log())
    assert alive(node)


def test_engine_killed_right_after_the_pause(fault_node):
    # The race the crash needed: the engine dies just as the pause reaches it, repeatedly.
    node = fault_node()
    for round in range(1, 4):
        t = node.trainer_async("--refits", "1")
        wait_for(lambda: node.log().count("phase=pausing") >= round, what="pause")
        node.engine.send_signal(signal.SIGKILL)
        node.engine.wait()
        t.communicate(timeout=60)
        assert alive(node), node.log()
        wait_for(lambda: node.log().count("event=engine_unregistered") >= round, what="unregistration")
        node.start_engine()
    _, lines = node.trainer("--refits", "1")
    assert lines and lines[-1]["outcome"] == "committed", (lines, node.log())


def test_second_engine_registering_mid_commit_is_refused(fault_node, tmp_path):
    # Expected: while an engine is registered, another registration is refused (unavailable,
    # "already registered"); the commit in flight lands; refitd stays up.
    node = fault_node(failpoints=SLOW_COPY)
    t = node.trainer_async("--refits", "1")
    wait_for(lambda: "phase=copying" in node.log(), what="commit window")
    intruder = subprocess.run([str(ENGINE), "--address", node.address, "--shm", "/refit-intruder-" + str(time.time_ns())],
                              capture_output=True, text=True, timeout=30)
    assert intruder.returncode != 0
    assert "already registered" in intruder.stdout + intruder.stderr, intruder
    out, _ = t.communicate(timeout=60)
    assert '"outcome":"committed"' in out, (out, node.log())
    assert alive(node)
    assert node.resumed_versions() == [1]


def test_engine_stopped_before_the_pause_times_out(fault_node):
    # Expected: with the engine stopped (SIGSTOP), the pause times out after
    # engine.pause_timeout_ms; the session ends failed naming the pause, the engine's bytes are
    # untouched, /readyz says unready and the next begin is refused until the engine answers;
    # once it runs again it answers the late pause and resume(0), and the next refit lands.
    node = fault_node(config="engine:\n  pause_timeout_ms: 500\n  resume_timeout_ms: 500\n")
    before = node.shm_digest()
    node.engine.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        p, _ = node.trainer("--refits", "1", timeout=60)
        assert p.returncode != 0
        assert time.monotonic() - started < 20
        log = node.log()
        assert "outcome=failed cause=engine_error" in log and "did not pause within" in log, log
        status, body = node.admin("/readyz")
        assert status == 503 and "did not answer" in body, body
        p, _ = node.trainer("--refits", "1", timeout=60)
        assert p.returncode != 0 and "did not answer" in p.stderr + p.stdout, (p.stdout, p.stderr)
    finally:
        node.engine.send_signal(signal.SIGCONT)
    assert node.shm_digest() == before
    wait_for(lambda: node.admin("/readyz")[0] == 200, what="the engine answering again")
    _, lines = node.trainer("--refits", "1")
    assert lines and lines[-1]["outcome"] == "committed" and lines[-1]["version"] == 1, (lines, node.log())
    # The late pause was followed by the resume refitd queued behind it: version 0, untouched.
    assert node.resumed_versions() == [0, 1]


def test_engine_stopped_inside_its_pause_times_out(fault_node):
    # Expected: the engine has started pausing (its pause takes 800 ms) when it is stopped; the
    # pause times out, the engine's bytes are untouched and the next begin is refused; once it
    # runs again it finishes the pause, answers the queued resume(0) and serves version 0
    # unchanged, and the next refit lands.
    node = fault_node(config="engine:\n  pause_timeout_ms: 2500\n  resume_timeout_ms: 2500\n",
                      engine_args=["--pause-ms", "800"])
    before = node.shm_digest()
    t = node.trainer_async("--refits", "1")
    wait_for(lambda: node.events("pausing"), what="the engine pausing")
    node.engine.send_signal(signal.SIGSTOP)
    try:
        out, err = t.communicate(timeout=60)
        assert t.returncode != 0 and '"outcome":"committed"' not in out, (out, err)
        log = node.log()
        assert "outcome=failed cause=engine_error" in log and "did not pause within" in log, log
        status, body = node.admin("/readyz")
        assert status == 503 and "did not answer" in body, body
        p, _ = node.trainer("--refits", "1", timeout=60)
        assert p.returncode != 0 and "did not answer" in p.stderr + p.stdout, (p.stdout, p.stderr)
        assert node.resumed_versions() == []
    finally:
        node.engine.send_signal(signal.SIGCONT)
    wait_for(lambda: node.resumed_versions() == [0], what="the late pause and its queued resume")
    assert node.shm_digest() == before
    wait_for(lambda: node.admin("/readyz")[0] == 200, what="the engine answering again")
    _, lines = node.trainer("--refits", "1")
    assert lines and lines[-1]["outcome"] == "committed" and lines[-1]["version"] == 1, (lines, node.log())
    assert node.resumed_versions() == [0, 1]


def test_engine_stopped_during_the_copy_times_out_its_resume(fault_node):
    # Expected: the copy lands whole, the resume times out; the outcome says the engine's memory
    # holds the new version; when the engine runs again it resumes with that version.
    node = fault_node(config="engine:\n  pause_timeout_ms: 2000\n  resume_timeout_ms: 500\n",
                      failpoints=SLOW_COPY)
    t = node.trainer_async("--refits", "1")
    wait_for(lambda: "phase=copying" in node.log(), what="commit window")
    node.engine.send_signal(signal.SIGSTOP)
    try:
        out, _ = t.communicate(timeout=60)
        assert '"outcome":"committed"' not in out
        log = node.log()
        assert "did not answer resume(1)" in log and "holds version 1" in log, log
    finally:
        node.engine.send_signal(signal.SIGCONT)
    wait_for(lambda: node.resumed_versions() == [1], what="the late resume")
    wait_for(lambda: node.admin("/readyz")[0] == 200, what="the engine answering again")
    _, lines = node.trainer("--refits", "1")
    assert lines and lines[-1]["outcome"] == "committed" and lines[-1]["version"] == 2, (lines, node.log())


def test_sigterm_with_the_engine_stopped_logs_the_outcome(fault_node):
    # Expected: SIGTERM during a pause that will not be answered: refitd waits at most the pause
    # timeout, logs the session's outcome, and exits 0.
    node = fault_node(config="engine:\n  pause_timeout_ms: 1000\n")
    node.engine.send_signal(signal.SIGSTOP)
    try:
        t = node.trainer_async("--refits", "1")
        wait_for(lambda: "phase=pausing" in node.log(), what="pause")
        node.daemon.send_signal(signal.SIGTERM)
        assert node.daemon.wait(timeout=20) == 0, node.log()[-4000:]
        assert "event=refit" in node.log() and "did not pause within" in node.log(), node.log()
        t.kill()
        t.wait()
    finally:
        node.engine.send_signal(signal.SIGCONT)
