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
