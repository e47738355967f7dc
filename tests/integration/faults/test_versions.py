"""Trainer version tags and verify-after-commit (docs/versions.md, docs/reliability.md "Verify
after commit") with real processes: refitd, the example engine (its bytes read from its shm) and
example trainers. The corrupted copy comes from the corrupt_copy failpoint."""
import json
import re
import subprocess

from conftest import BIN, wait_for

REFITCTL = BIN / "tools/refitctl"
VERIFY = "engine:\n  verify_after_commit: true\n"


def status(node):
    p = subprocess.run([str(REFITCTL), "status", "--address", node.address, "--json"], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 0, (p.stdout, p.stderr)
    return json.loads(p.stdout)


def metric(node, name, labels=""):
    """The value of one series on /metrics (None when absent)."""
    code, body = node.admin("/metrics")
    assert code == 200, body
    m = re.search(rf"^{re.escape(name + labels)} (\S+)$", body, re.M)
    return None if m is None else float(m.group(1))


def series(node, name):
    code, body = node.admin("/metrics")
    assert code == 200, body
    return [l for l in body.splitlines() if l.startswith(name + "{") or l.startswith(name + " ")]


def test_tags_reach_the_report_status_metrics_log_and_engine(fault_node):
    node = fault_node()
    p, lines = node.trainer("--refits", "1", "--tag", "step-7")
    assert p.returncode == 0 and lines[-1]["outcome"] == "committed", (p.stdout, p.stderr)
    assert lines[-1]["tag"] == "step-7" and lines[-1]["version"] == 1
    assert lines[-1]["engine_matches_expected"] is True
    assert node.resumed_versions() == [1] and node.resumed_tags() == ["step-7"]
    s = status(node)
    assert s["version"] == 1 and s["tag"] == "step-7", s
    assert s["last_refit"]["tag"] == "step-7", s
    assert series(node, "refit_committed_version_info") == ['refit_committed_version_info{tag="step-7"} 1'], \
        series(node, "refit_committed_version_info")
    assert metric(node, "refit_committed_version") == 1
    log = node.log()
    assert re.search(r"event=session_begin .*tag=step-7", log), log
    assert re.search(r"event=refit .*outcome=committed .*version=1 tag=step-7", log), log

    # Several refits: T-0, T-1; the info metric keeps one series, the current tag's.
    p, lines = node.trainer("--refits", "2", "--tag", "run3:step")
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert [l["tag"] for l in lines] == ["run3:step-0", "run3:step-1"] and lines[-1]["version"] == 3
    assert node.resumed_tags() == ["step-7", "run3:step-0", "run3:step-1"]
    assert status(node)["tag"] == "run3:step-1"
    assert series(node, "refit_committed_version_info") == ['refit_committed_version_info{tag="run3:step-1"} 1']

    # refitd restarts: the engine registers again with its version and tag.
    node.daemon.kill()
    node.daemon.wait()
    node.start_daemon()
    node.wait_registered()
    wait_for(lambda: status(node)["engine_registered"], what="the engine re-registering")
    s = status(node)
    assert s["version"] == 3 and s["tag"] == "run3:step-1", s
    assert re.search(r"event=engine_registered .*version=3 dirty=false tag=run3:step-1", node.log()), node.log()


def test_an_invalid_tag_is_refused_before_anything_is_touched(fault_node):
    node = fault_node()
    before = node.shm_digest()
    for bad in ["step 7", "a/b", "x" * 129]:
        p, lines = node.trainer("--refits", "1", "--tag", bad)
        assert p.returncode != 0, (bad, p.stdout)
        assert "manifest tag" in p.stdout + p.stderr, (bad, p.stdout, p.stderr)
    assert node.shm_digest() == before
    assert node.resumed_versions() == []
    p, lines = node.trainer("--refits", "1", "--tag", "x" * 128)
    assert p.returncode == 0 and lines[-1]["tag"] == "x" * 128, (p.stdout, p.stderr)


def test_verify_after_commit_catches_a_corrupted_copy(fault_node):
    # Expected: the copy lands with one flipped bit; the check inside the window sees it, the
    # refit fails with cause verify_mismatch (DATA_LOSS to the trainer), the mismatch is counted,
    # the engine is never resumed with the bad bytes (paused, dirty) and the next full refit
    # (the failpoint fires once) lands and matches the offline conversion.
    node = fault_node(config=VERIFY, failpoints="corrupt_copy=error@1")
    before = node.shm_digest()
    p, lines = node.trainer("--refits", "1", "--tag", "step-1")
    assert p.returncode != 0 and lines and lines[-1]["outcome"] != "committed", (p.stdout, p.stderr)
    assert lines[-1]["code"] == "DATA_LOSS", lines
    assert "differ from the staged bytes" in lines[-1]["error"], lines
    log = node.log()
    assert "outcome=failed cause=verify_mismatch" in log, log
    assert node.shm_digest() != before  # the copy happened, with the flipped bit
    assert node.resumed_versions() == []
    s = status(node)
    assert s["verify_after_commit"] is True and s["verify_mismatches"] == 1, s
    assert s["engine_dirty"] is True and s["version"] == 0 and s["tag"] == "", s
    assert s["last_refit"]["cause"] == "verify_mismatch" and s["last_refit"]["tag"] == "step-1", s
    assert metric(node, "refit_verify_mismatches_total") == 1
    assert metric(node, "refit_sessions_total", '{outcome="failed",reason="verify_mismatch"}') == 1
    code, body = node.admin("/readyz")
    assert code == 503 and "dirty" in body, body

    p, lines = node.trainer("--refits", "1", "--tag", "step-2")
    assert p.returncode == 0 and lines[-1]["outcome"] == "committed", (p.stdout, p.stderr, node.log())
    assert lines[-1]["engine_matches_expected"] is True and lines[-1]["version"] == 1
    assert node.resumed_tags() == ["step-2"]
    s = status(node)
    assert s["engine_dirty"] is False and s["verify_mismatches"] == 1 and s["tag"] == "step-2", s
    assert re.search(r"event=refit .*outcome=committed .*verify_ms=", node.log()), node.log()


def test_without_verify_the_corrupted_copy_is_served(fault_node):
    # The same failpoint with the check off: the refit commits and the engine serves the flipped
    # bit (the trainer's read-back finds it). This is what the option exists to catch.
    node = fault_node(failpoints="corrupt_copy=error@1")
    p, lines = node.trainer("--refits", "1")
    assert lines and lines[-1]["outcome"] == "committed", (p.stdout, p.stderr)
    assert lines[-1]["engine_matches_expected"] is False, lines
    assert status(node)["verify_mismatches"] == 0
    assert metric(node, "refit_verify_mismatches_total") == 0


# ---- held versions (hold: K) ----

def refitctl(node, *args, check=True):
    p = subprocess.run([str(REFITCTL), *args, "--address", node.address, "--json"], capture_output=True, text=True,
                       timeout=60)
    out = json.loads(p.stdout.splitlines()[-1]) if p.stdout.strip() else {}
    if check:
        assert p.returncode == 0 and out.get("ok"), (p.returncode, p.stdout, p.stderr)
    return p.returncode, out


def commit_direct(node, seed, tag=""):
    """A whole refit of the demo weights of `seed`, committed and checked by the trainer against the
    offline conversion; returns the engine's shm digest."""
    p, lines = node.trainer("--refits", "1", "--seed", str(seed), *(["--tag", tag] if tag else []))
    assert p.returncode == 0 and lines[-1]["outcome"] == "committed", (p.stdout, p.stderr)
    assert lines[-1]["engine_matches_expected"] is True, lines
    return node.shm_digest()


def stage(node, seed, tag):
    p, lines = node.trainer("--refits", "1", "--seed", str(seed), "--tag", tag, "--stage-only")
    assert p.returncode == 0 and lines[-1]["outcome"] == "staged" and lines[-1]["tag"] == tag, (p.stdout, p.stderr)
    return lines[-1]


def held(node):
    return [(v["state"], v["tag"]) for v in refitctl(node, "versions")[1]["versions"]]


def test_held_versions_are_committed_out_of_order(fault_node):
    node = fault_node(config="hold: 3\n")
    # The bytes each seed's conversion gives the engine, committed directly first.
    digest = {seed: commit_direct(node, seed) for seed in (5, 6, 7)}
    assert len(set(digest.values())) == 3
    for seed in (5, 6, 7):
        stage(node, seed, f"s{seed}")
    assert node.shm_digest() == digest[7]  # staging only: the engine is untouched
    _, listing = refitctl(node, "versions")
    assert listing["hold"] == 3
    held_versions = [v for v in listing["versions"] if v["state"] == "held"]
    assert [v["tag"] for v in held_versions] == ["s5", "s6", "s7"], listing
    assert all(v["bytes"] > 0 and v["version"] == 0 for v in held_versions), listing
    assert len({v["checksum"] for v in held_versions}) == 3, listing
    assert metric(node, "refit_sessions_total", '{outcome="staged",reason="none"}') == 3
    assert metric(node, "refit_kept_versions", '{state="held"}') == 3
    assert metric(node, "refit_kept_versions", '{state="current"}') == 1

    # A new refit is received and committed while three versions are held.
    assert commit_direct(node, 8) not in digest.values()
    assert held(node)[:3] == [("held", "s5"), ("held", "s6"), ("held", "s7")]

    for seed, version in ((6, 5), (5, 6), (7, 7)):
        _, report = refitctl(node, "commit", f"s{seed}")
        assert report["outcome"] == "committed" and report["version"] == version, report
        assert report["tag"] == f"s{seed}", report
        assert node.shm_digest() == digest[seed], f"s{seed}"
    assert node.resumed_tags()[-3:] == ["s6", "s5", "s7"]
    assert held(node) == [("current", "s7"), ("previous", "s5")]
    assert metric(node, "refit_kept_versions", '{state="held"}') == 0
    assert metric(node, "refit_kept_versions", '{state="previous"}') == 1
    s = status(node)
    assert s["version"] == 7 and s["tag"] == "s7", s
    code, out = refitctl(node, "commit", "s6", check=False)
    assert code == 3 and "no held version is tagged 's6'" in out["error"], out
    # The engine served throughout: every request saw one version, whole.
    exit_report = node.stop()
    assert exit_report["mixed"] == 0 and exit_report["requests"] > 0, exit_report


def test_rollback_restores_the_earlier_versions_bytes(fault_node):
    node = fault_node(config="hold: 1\n")
    code, out = refitctl(node, "rollback", check=False)
    assert code == 3 and "nothing to roll back to" in out["error"], out
    d5 = commit_direct(node, 5, "step-5")
    d6 = commit_direct(node, 6, "step-6")
    assert d5 != d6
    assert held(node) == [("current", "step-6"), ("previous", "step-5")]
    _, report = refitctl(node, "rollback")
    assert report["outcome"] == "committed" and report["version"] == 3 and report["tag"] == "step-5", report
    # Equal to what the trainer checked against the offline conversion of seed 5.
    assert node.shm_digest() == d5
    assert status(node)["tag"] == "step-5"
    assert held(node) == [("current", "step-5"), ("previous", "step-6")]
    _, report = refitctl(node, "rollback")
    assert report["version"] == 4 and node.shm_digest() == d6
    assert node.resumed_versions() == [1, 2, 3, 4] and node.resumed_tags() == ["step-5", "step-6", "step-5", "step-6"]
    assert re.search(r"event=refit .*outcome=committed .*version=3 tag=step-5", node.log()), node.log()
    exit_report = node.stop()
    assert exit_report["mixed"] == 0 and exit_report["requests"] > 0, exit_report


def test_staging_that_cannot_hold_another_version_refuses_it(fault_node):
    node = fault_node()
    engine_bytes = status(node)["engine_bytes"]
    # Room for one version and a half.
    node.config.write_text(node.config.read_text() + f"hold: 3\nlimits:\n  staging_bytes: {engine_bytes * 3 // 2}\n")
    node.daemon.kill()
    node.daemon.wait()
    node.start_daemon()
    node.wait_registered()
    before = node.shm_digest()
    stage(node, 5, "a")
    p, lines = node.trainer("--refits", "1", "--seed", "6", "--tag", "b", "--stage-only")
    assert p.returncode != 0, p.stdout
    assert "staging cannot hold another version" in p.stdout + p.stderr, (p.stdout, p.stderr)
    assert "a " in p.stdout + p.stderr  # it names what is held
    assert held(node) == [("held", "a")]
    assert node.shm_digest() == before
    # Committing the held version makes it the current one, which gives way to the next refit.
    refitctl(node, "commit", "a")
    stage(node, 6, "b")
    assert held(node) == [("held", "b")]
    # hold: K also bounds the count.
    _, listing = refitctl(node, "versions")
    assert listing["staging_limit_bytes"] == engine_bytes * 3 // 2


def test_a_refit_received_while_a_held_version_commits_lands_after_it(fault_node):
    # The engine's pause takes 1.5 s: a trainer sends a whole refit meanwhile; its commit waits for
    # the held version's and lands next.
    node = fault_node(config="hold: 2\n", engine_args=["--pause-ms", "1500"])
    stage(node, 5, "a")
    c = subprocess.Popen([str(REFITCTL), "commit", "a", "--address", node.address, "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: node.events("pausing"), what="the held version's commit pausing the engine")
        p, lines = node.trainer("--refits", "1", "--seed", "6", "--tag", "b")
        assert p.returncode == 0 and lines[-1]["outcome"] == "committed", (p.stdout, p.stderr, node.log())
        assert lines[-1]["version"] == 2 and lines[-1]["engine_matches_expected"] is True, lines
    finally:
        out, err = c.communicate(timeout=60)
    report = json.loads(out.splitlines()[-1])
    assert c.returncode == 0 and report["version"] == 1 and report["tag"] == "a", (out, err)
    assert node.resumed_tags() == ["a", "b"]
    assert held(node) == [("current", "b"), ("previous", "a")]
    exit_report = node.stop()
    assert exit_report["mixed"] == 0 and exit_report["requests"] > 0, exit_report
