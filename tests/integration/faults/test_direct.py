"""staging: direct (docs/architecture.md): refitd converts every tensor it can place straight into
the engine's memory, the engine paused from the session's begin to its commit's resume. Each
scenario states its expected outcome: a clean refit serves only whole versions; a session that
ends after writing in place leaves the engine paused and dirty (not ready, partial refits
refused) until a full refit lands; one that ends before writing anything resumes the engine
untouched; refitd dying mid-session leaves the engine dirty for the next refitd."""
import json
import signal
import subprocess
import sys
import time

from conftest import SRC, committed_ok, finish, silent_trainer_aborted_at_deadline, wait_for

DIRECT = "staging: direct\nlimits:\n  bucket_bytes: 1048576\n"


def test_direct_refits_are_converted_in_place_and_serve_whole_versions(fault_node):
    # Expected: three refits commit with the engine's bytes equal to the offline conversion,
    # every output byte converted in place (nothing staged: the demo spec lays nothing out). The
    # first pauses the engine after planning; the next two, with the same manifest, while their
    # manifest is planned (the early pause). A begin with that manifest that is refused (a bad
    # tag) undoes its early pause: the engine resumes at the version it holds, untouched.
    node = fault_node(config=DIRECT)
    _, lines = node.trainer("--refits", "3")
    assert [l["outcome"] for l in lines] == ["committed"] * 3, lines
    assert all(l["engine_matches_expected"] for l in lines), lines
    assert all(l["bytes_in_place"] == l["bytes_out"] > 0 for l in lines), lines
    paused = [l for l in node.log().splitlines() if "event=engine_paused_for_direct" in l]
    assert len(paused) == 3 and "early=false" in paused[0], paused
    assert all("early=true" in l for l in paused[1:]), paused
    before = node.shm_digest()
    p, _ = node.trainer("--refits", "1", "--tag", "bad tag!")
    assert p.returncode != 0 and "tag" in p.stderr + p.stdout, (p.stdout, p.stderr)
    wait_for(lambda: "event=early_pause_undone" in node.log(), what="the early pause undone")
    assert node.shm_digest() == before and node.admin("/readyz")[0] == 200
    # The metric counts every byte converted in place.
    status, body = node.admin("/metrics")
    assert status == 200
    counted = [float(l.split()[-1]) for l in body.splitlines() if l.startswith("refit_converted_in_place_bytes_total")]
    assert counted == [sum(l["bytes_in_place"] for l in lines)], counted
    finish(node, [1, 2, 3, 3])


def test_direct_early_pause_that_times_out_leaves_the_engine_untouched(fault_node):
    # Expected: after a refit placed its manifest, the engine is stopped (SIGSTOP): the next begin
    # with that manifest sends its early pause, which times out after engine.pause_timeout_ms;
    # the begin fails naming the pause, nothing is written and the next begin is refused until the
    # engine answers. Running again, the engine answers the late pause and the resume queued
    # behind it (the version it holds, 1); the next refit lands as version 2.
    node = fault_node(config=DIRECT + "engine:\n  pause_timeout_ms: 500\n  resume_timeout_ms: 500\n")
    _, lines = node.trainer("--refits", "1", "--seed", "1")
    assert committed_ok(lines, 1), lines
    before = node.shm_digest()
    node.engine.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        p, _ = node.trainer("--refits", "1", "--seed", "2", timeout=60)
        assert p.returncode != 0 and "did not pause" in p.stderr + p.stdout, (p.stdout, p.stderr)
        assert time.monotonic() - started < 20
        assert "did not answer pause within 500ms" in node.log(), node.log()
        p, _ = node.trainer("--refits", "1", timeout=60)
        assert p.returncode != 0 and "did not answer" in p.stderr + p.stdout, (p.stdout, p.stderr)
    finally:
        node.engine.send_signal(signal.SIGCONT)
    wait_for(lambda: node.resumed_versions() == [1, 1], what="the late pause and its queued resume")
    assert node.shm_digest() == before
    wait_for(lambda: node.admin("/readyz")[0] == 200, what="the engine answering again")
    _, lines = node.trainer("--refits", "1", "--seed", "3")
    assert committed_ok(lines, 2), lines
    paused = [l for l in node.log().splitlines() if "event=engine_paused_for_direct" in l]
    assert "early=true" in paused[1] and "status=ok" not in paused[1], paused
    finish(node, [1, 1, 2])


def test_direct_refits_traced_by_every_process_into_one_timeline(fault_node, tmp_path):
    # Expected: with REFIT_TRACE_FILE set for the trainer, refitd and the engine, the file holds
    # each refit's steps from all three processes, and tools/trace_timeline.py orders them as a
    # refit runs: begin, plan, the engine's pause, buckets, validation, resume, the answer.
    trace = tmp_path / "refit.trace"
    node = fault_node(config=DIRECT, env={"REFIT_TRACE_FILE": str(trace)})
    _, lines = node.trainer("--refits", "4")
    assert [l["outcome"] for l in lines] == ["committed"] * 4, lines
    node.stop()
    pids = {int(l.split()[0]) for l in trace.read_text().splitlines()}
    assert len(pids) == 3, pids
    out = subprocess.run([sys.executable, str(SRC / "tools/trace_timeline.py"), str(trace), "--json"],
                         capture_output=True, text=True, check=True).stdout
    timeline = json.loads(out)
    assert timeline["refits"] == 2, timeline  # refits 3-4 (two skipped)
    steps = timeline["steps_ms"]
    order = ["trainer.begin_sent", "daemon.begin_received", "daemon.pause_sent", "engine.pause_received",
             "engine.paused", "daemon.engine_paused", "trainer.begin_answered", "trainer.bucket_announced.first",
             "daemon.bucket_received.first", "daemon.bucket_issued.first", "daemon.bucket_converted.last",
             "daemon.drained", "daemon.prepared", "daemon.resume_sent",
             "engine.resume_received", "daemon.resumed", "daemon.commit_answered", "trainer.commit_answered"]
    assert all(k in steps for k in order), sorted(steps)
    times = [steps[k] for k in order]
    assert times == sorted(times), list(zip(order, times))
    assert steps["daemon.planned"] < steps["daemon.engine_paused"]
    assert steps["daemon.bucket_issued.last"] < steps["daemon.validated"] < steps["daemon.drained"], steps
    assert steps["daemon.bucket_converted.count"] == steps["trainer.bucket_announced.count"] > 1, steps
    # The pipeline's shape is the same steps taken apart: it adds up to the refit's answer.
    shape = timeline["pipeline_ms"]
    assert shape["before_first_kernel"] == steps["daemon.bucket_issued.first"], shape
    assert shape["conversion_span"] > 0 and shape["after_last_kernel"] > 0 and shape["bucket_issue"] >= 0, shape
    total = shape["before_first_kernel"] + shape["conversion_span"] + shape["after_last_kernel"]
    assert abs(total - steps["trainer.commit_answered"]) < 1.0, (shape, steps["trainer.commit_answered"])


def test_direct_trainer_killed_mid_refit_leaves_the_engine_paused_and_dirty(fault_node):
    # Expected: the trainer dies after some buckets were converted into the engine: the session
    # aborts, the engine stays paused and dirty (not ready), a partial refit is refused, and the
    # next full refit lands and resumes it as version 1.
    node = fault_node(config=DIRECT)
    p, _ = node.trainer("--fault", "die-mid-bucket")
    assert p.returncode == 9
    wait_for(lambda: "outcome=aborted" in node.log(), what="abort")
    assert "stays paused and dirty" in node.log()
    status, body = node.admin("/readyz")
    assert status == 503 and "dirty" in body, body
    p, _ = node.trainer("--fault", "partial")
    assert p.returncode == 1 and "partial refit refused" in p.stderr and "dirty" in p.stderr, p.stderr
    _, lines = node.trainer("--refits", "1")
    assert committed_ok(lines, 1), lines
    assert node.admin("/readyz")[0] == 200
    finish(node, [1])


def test_direct_refused_refit_leaves_the_engine_dirty_until_a_full_refit(fault_node):
    # Expected: a refit whose last tensor never comes is refused at commit, naming it, after the
    # rest was converted in place: the engine stays paused and dirty; the next full refit lands.
    # A refit whose manifest names nothing places nothing: refused as with staging, the engine
    # untouched and never paused.
    node = fault_node(config=DIRECT)
    before = node.shm_digest()
    _, lines = node.trainer("--refits", "1", "--fault", "strand-gate")
    assert lines[0]["outcome"] == "refused", lines
    assert "missing: 'model.layers.0.mlp.up_proj.weight'" in lines[0]["error"], lines[0]["error"]
    assert node.shm_digest() == before and node.admin("/readyz")[0] == 200
    _, lines = node.trainer("--refits", "1", "--fault", "withhold")
    assert lines[0]["outcome"] == "refused", lines
    assert "missing: '" in lines[0]["error"], lines[0]["error"]
    assert "stays paused and dirty" in lines[0]["error"], lines[0]["error"]
    assert node.shm_digest() != before
    assert "dirty" in node.admin("/readyz")[1]
    _, lines = node.trainer("--refits", "1", "--seed", "3")
    assert committed_ok(lines, 1), lines
    finish(node, [1])


def test_direct_session_ending_before_any_write_resumes_the_engine(fault_node):
    # Expected: a trainer that begins and sends nothing is aborted at the deadline; nothing was
    # converted in place, so the engine is resumed untouched and stays ready.
    node = fault_node(config="staging: direct\nlimits:\n  session_deadline_ms: 2000\n")
    before = node.shm_digest()
    silent_trainer_aborted_at_deadline(node)
    assert "nothing was written in place: the engine was resumed" in node.log()
    assert node.shm_digest() == before
    assert node.admin("/readyz")[0] == 200
    _, lines = node.trainer("--refits", "1")
    assert committed_ok(lines, 1), lines
    finish(node, [0, 1])  # resumed at version 0 (untouched), then version 1


def test_refitd_killed_mid_direct_session_leaves_the_engine_dirty(fault_node):
    # Expected: refitd dies after a bucket was converted into the engine: the engine (paused)
    # knows its weights are mixed, re-registers dirty with the next refitd, which is not ready
    # until a full refit lands.
    node = fault_node(config=DIRECT)
    _, lines = node.trainer("--refits", "1", "--seed", "1")
    assert committed_ok(lines, 1), lines
    node.daemon.send_signal(signal.SIGTERM)
    assert node.daemon.wait(timeout=30) == 0, node.log()[-4000:]
    node.start_daemon(failpoints="after_convert=crash")
    node.wait_registered()
    p, _ = node.trainer("--refits", "1", "--seed", "2")
    assert node.wait_daemon_dead() == -signal.SIGKILL
    assert p.returncode != 0
    node.start_daemon()
    node.wait_registered()
    assert "version=1 dirty=true" in node.log(), node.log()
    status, body = node.admin("/readyz")
    assert status == 503 and "dirty" in body, body
    _, lines = node.trainer("--refits", "1", "--seed", "3")
    assert committed_ok(lines, 2), lines
    finish(node, [1, 2])
