"""refitctl's operations commands and refitd's /metrics against a live daemon and engine.
The metrics text is parsed with the official Prometheus Python parser."""
import json
import re
import subprocess
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from conftest import BIN, TRAINER

REFITCTL = BIN / "tools/refitctl"


def refitctl(node, *args):
    p = subprocess.run([str(REFITCTL), *args, "--address", node.address], capture_output=True, text=True,
                       timeout=60)
    return p.returncode, p.stdout, p.stderr


def metrics(node):
    port = re.search(r"admin_port=(\d+)", node.daemon_log.read_text()).group(1)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_refit_verify_status_abort_and_metrics(node_factory, tmp_path):
    node = node_factory()
    subprocess.run([str(TRAINER), "--dump", str(tmp_path), "--seed", "7"], check=True, timeout=60)

    rc, out, err = refitctl(node, "status", "--json")
    assert rc == 0, err
    s = json.loads(out)
    assert s["model"] == "demo-llama" and s["engine_registered"] and s["version"] == 0
    assert s["last_refit"] is None

    # Before any refit the engine does not hold the converted checkpoint.
    rc, out, _ = refitctl(node, "verify", "--json", str(tmp_path / "converted.safetensors"))
    assert rc == 3 and json.loads(out)["mismatched"]

    rc, out, err = refitctl(node, "refit", "--json", str(tmp_path / "model.safetensors"))
    assert rc == 0, out + err
    r = json.loads(out)
    assert r["outcome"] == "committed" and r["version"] == 1 and r["bytes_in"] > 0

    rc, out, err = refitctl(node, "verify", "--json", str(tmp_path / "converted.safetensors"))
    v = json.loads(out)
    assert rc == 0, out + err
    assert v["ok"] and v["version"] == 1 and v["matched"] == 35 and not v["mismatched"]

    rc, out, _ = refitctl(node, "abort", "--json")
    assert rc == 4 and json.loads(out) == {"ok": True, "aborted": False}

    rc, out, _ = refitctl(node, "status")
    assert rc == 0 and "version:  1" in out and "1 committed" in out

    # A refused refit: a checkpoint missing tensors.
    rc, out, err = refitctl(node, "refit", "--json", str(tmp_path / "converted.safetensors"))
    assert rc == 3, out + err
    assert "manifest refused" in json.loads(out)["error"]

    m = metrics(node)
    assert m[("refit_sessions_total", (("outcome", "committed"), ("reason", "none")))] == 1
    assert m[("refit_committed_version", ())] == 1
    assert m[("refit_engine_registered", ())] == 1
    assert m[("refit_active_sessions", ())] == 0
    assert m[("refit_converted_bytes_total", (("format", "fp8_block128"),))] > 0
    assert m[("refit_received_bytes_total", (("transport", "ucx"),))] == r["bytes_in"]
    assert m[("refit_commit_pause_seconds_count", ())] == 1


def test_usage_errors_exit_2(node_factory):
    p = subprocess.run([str(REFITCTL), "refit"], capture_output=True, text=True)
    assert p.returncode == 2
    p = subprocess.run([str(REFITCTL), "status", "--bogus"], capture_output=True, text=True)
    assert p.returncode == 2
    p = subprocess.run([str(REFITCTL), "status", "--address", "unix:/nonexistent/sock"], capture_output=True,
                       text=True)
    assert p.returncode == 1 and "cannot connect" in p.stderr


def wait_metrics(node, pred, what, timeout=30.0):
    import time
    deadline = time.monotonic() + timeout
    m = metrics(node)
    while not pred(m):
        assert time.monotonic() < deadline, f"timed out waiting for {what}; last scrape: {m}"
        time.sleep(0.05)
        m = metrics(node)
    return m


RECEIVED = ("refit_received_bytes_total", (("transport", "ucx"),))
STAGING = ("refit_staging_bytes", ())
ACTIVE = ("refit_active_sessions", ())


def converted(m):
    return sum(v for (name, _), v in m.items() if name == "refit_converted_bytes_total")


def test_byte_counters_and_staging_move_during_a_refit(node_factory):
    """docs/metrics.md: the byte counters move per bucket and the staging gauge reads the bytes
    staged now, so a scrape in the middle of a refit sees its progress. The trainer pushes half
    the model, flushes and stalls; the session stays active while we scrape."""
    node = node_factory()
    m = metrics(node)
    assert m.get(RECEIVED, 0) == 0 and m[STAGING] == 0 and converted(m) == 0
    trainer = subprocess.Popen([str(TRAINER), "--address", node.address, "--fault", "stall"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        mid = wait_metrics(node, lambda m: m[ACTIVE] == 1 and m.get(RECEIVED, 0) > 0 and m[STAGING] > 0
                           and converted(m) > 0, "bytes and staging to move mid-refit")
        # Still mid-refit: nothing committed, the session is live, and staging holds what the
        # converted bytes are (this refit stages exactly what it converts).
        assert mid[("refit_sessions_total", (("outcome", "committed"), ("reason", "none")))] == 0
        assert mid[STAGING] == converted(mid)
        rc, out, err = refitctl(node, "status", "--json")
        assert rc == 0 and json.loads(out)["staging_bytes"] == mid[STAGING]
    finally:
        trainer.kill()
        trainer.wait()
    end = wait_metrics(node, lambda m: m[ACTIVE] == 0, "the stalled session to end")
    # The session's end adds nothing more (bytes were counted as buckets arrived) and releases
    # staging.
    assert end[RECEIVED] == mid[RECEIVED] and converted(end) == converted(mid)
    assert end[STAGING] == 0
    assert end[("refit_sessions_total", (("outcome", "aborted"), ("reason", "disconnected")))] == 1

    # Committed refits add exactly their bytes_in and bytes_out.
    p = subprocess.run([str(TRAINER), "--address", node.address, "--refits", "2"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    reports = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    assert len(reports) == 2 and all(r["outcome"] == "committed" for r in reports), reports
    after = metrics(node)
    assert after[RECEIVED] == end[RECEIVED] + sum(r["bytes_in"] for r in reports)
    assert converted(after) == converted(end) + sum(r["bytes_out"] for r in reports)
    assert after[STAGING] == 0


def test_process_metrics(node_factory):
    """process_* as the Prometheus clients export them, read from /proc/self at scrape time."""
    import os
    import time
    before = time.time()
    node = node_factory()
    pid = node.daemon.pid
    m = metrics(node)
    rss = m[("process_resident_memory_bytes", ())]
    vsz = m[("process_virtual_memory_bytes", ())]
    assert 1 << 20 < rss <= vsz
    status = dict(l.split(":", 1) for l in open(f"/proc/{pid}/status").read().splitlines() if ":" in l)
    vmrss = int(status["VmRSS"].split()[0]) * 1024
    assert abs(rss - vmrss) < max(vmrss // 2, 8 << 20), (rss, vmrss)
    assert m[("process_cpu_seconds_total", ())] >= 0
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    assert abs(m[("process_open_fds", ())] - fds) <= 4, (m[("process_open_fds", ())], fds)
    limits = [l for l in open(f"/proc/{pid}/limits").read().splitlines() if l.startswith("Max open files")]
    assert m[("process_max_fds", ())] == int(limits[0].split()[3])
    # btime is whole seconds: allow for its rounding.
    assert before - 2 <= m[("process_start_time_seconds", ())] <= time.time() + 1
    # CPU time only goes up, and moves when the daemon works.
    cpu0 = m[("process_cpu_seconds_total", ())]
    p = subprocess.run([str(TRAINER), "--address", node.address, "--refits", "2"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert metrics(node)[("process_cpu_seconds_total", ())] > cpu0


def test_spec_init_from_the_registered_engine(node_factory, tmp_path):
    """spec init --engine names the engine's parameters through the daemon's control plane; with
    the trainer's checkpoint as well, the rules come from the checkpoint and the engine
    parameters it does not name are listed for a target: rule."""
    node = node_factory()
    subprocess.run([str(TRAINER), "--dump", str(tmp_path), "--seed", "3"], check=True, timeout=60)
    spec = tmp_path / "engine.yaml"
    rc, out, err = refitctl(node, "spec", "init", "--engine", "--output", str(spec))
    assert rc == 0, err
    text = spec.read_text()
    assert 'model: "demo-llama"' in text and "parameters of the engine at unix:" in text
    # The engine holds the FP8 projections with their scales.
    assert '"model.layers.{L}.self_attn.{k_proj,o_proj,q_proj,v_proj}.{weight,weight_scale_inv}"' in text, text
    p = subprocess.run([str(REFITCTL), "spec", "lint", str(spec), "--json"], capture_output=True, text=True)
    assert p.returncode == 0 and json.loads(p.stdout)["ok"], p.stdout + p.stderr
    both = tmp_path / "both.yaml"
    rc, out, err = refitctl(node, "spec", "init", "--engine", "--checkpoint", str(tmp_path / "model.safetensors"),
                            "--output", str(both))
    assert rc == 0, err
    text = both.read_text()
    # The scales are the engine's only: listed for the user, no rule made for them.
    assert "# 14 engine parameters no checkpoint tensor names" in text, text
    assert "#   model.layers.0.mlp.down_proj.weight_scale_inv\n" in text
    assert '"model.layers.{L}.self_attn.{k_proj,o_proj,q_proj,v_proj}.weight"' in text
    p = subprocess.run([str(REFITCTL), "spec", "lint", str(both), "--checkpoint", str(tmp_path / "model.safetensors"),
                        "--json"], capture_output=True, text=True)
    assert p.returncode == 0 and json.loads(p.stdout)["ok"], p.stdout + p.stderr
