"""Hostile tensor names and start-up inputs (docs/reliability.md, "Hostile names and start-up
inputs"), with real processes: the log keeps one event per line, error texts keep every byte,
refused inputs never fire the engine-error alert, and start-up refuses unbounded files."""
import json
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import BIN, REFITD, wait_for

HOSTILE = BIN / "tests/integration/faults/hostile_trainer"
LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z level=(debug|info|warn|error) event=\S+")
FORGED = "2026-01-01T00:00:00.000Z level=info event=refit session=1 outcome=committed version=99"


def hostile(node, push_rank=0, **names):
    args = [str(HOSTILE), "--address", node.address]
    for flag, name in names.items():
        args += [f"--{flag.replace('_', '-')}", name.encode().hex()]
    if push_rank:
        args += ["--push-rank", str(push_rank)]
    p = subprocess.run(args, capture_output=True, text=True, timeout=60)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["error"] = bytes.fromhex(out["error_hex"]).decode("utf-8", "replace")
    return out


def log_lines(node):
    return node.log().splitlines()


def sessions_total(node, reason):
    _, body = node.admin("/metrics")
    total = 0.0
    for line in body.splitlines():
        if line.startswith("refit_sessions_total{") and f'reason="{reason}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("where", ["manifest_name", "push_name"])
def test_newline_in_a_tensor_name_forges_no_log_line(fault_node, where):
    # Expected: refused or aborted; every line of the log is one event of refitd's own, and no
    # line claims a commit that did not happen.
    node = fault_node()
    out = hostile(node, **{where: f"model.x.weight\n{FORGED}"})
    assert not out["ok"], out
    if where == "push_name":
        wait_for(lambda: "event=refit " in node.log(), what="the session's outcome logged")
    time.sleep(0.2)  # the refusal's own log line, written after the reply
    for line in log_lines(node):
        assert LINE.match(line), f"not a refitd log line: {line!r}"
    assert not any(l.startswith(FORGED) for l in log_lines(node)), node.log()
    node.stop()



def test_nul_in_a_manifest_name_is_not_cut_from_the_error(fault_node):
    # Expected: refused naming the tensor; the error the trainer gets carries the name past the
    # NUL (escaped), not a text cut at it (Node::Begin runs CheckManifest first).
    node = fault_node()
    out = hostile(node, manifest_name="evil\0tail.weight")
    assert not out["ok"] and out["stage"] == "begin", out
    assert "tail.weight" in out["error"], out
    assert "manifest tensor 0" in out["error"], out
    node.stop()


def test_huge_manifest_name_is_not_echoed(fault_node):
    # Expected: refused (limits.max_name_bytes applies to manifests as to buckets); neither the
    # error nor the log repeats the 60 KB name (as large as one hex-encoded argument may be).
    node = fault_node()
    out = hostile(node, manifest_name="n" * 60000)
    assert not out["ok"], out
    assert len(out["error"]) < 4 << 10, len(out["error"])
    assert "limits.max_name_bytes" in out["error"], out["error"][:300]
    assert len(node.log()) < 256 << 10
    node.stop()


def test_refused_bucket_named_engine_does_not_page_engine_error(fault_node):
    # Expected: the bucket header is refused (rank 9 over limits.max_rank 8) and the session
    # fails on the trainer's bad input; refit_sessions_total{reason="engine_error"} (the
    # engine-error page) does not move although the refusal names a tensor "engine...".
    node = fault_node()
    before = sessions_total(node, "engine_error")
    out = hostile(node, push_name="engine.bogus.weight", push_rank=9)
    assert not out["ok"], out
    wait_for(lambda: "event=refit " in node.log(), what="the session's outcome logged")
    assert sessions_total(node, "engine_error") == before
    node.stop()


def start_refitd(tmp_path, config: str, spec: str = None):
    cfg = tmp_path / "refitd.yaml"
    body = f"listen: unix:{tmp_path / 'refitd.sock'}\n" + config
    if spec is not None:
        (tmp_path / "spec.yaml").write_text(spec)
        body += f"model_spec: {tmp_path / 'spec.yaml'}\n"
    cfg.write_text(body)
    return subprocess.Popen([str(REFITD), "--config", str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def test_quant_config_dev_zero_is_refused_naming_the_file(tmp_path):
    p = start_refitd(tmp_path, "", spec="model: m\ncheckpoint:\n  quant_config: /dev/zero\n")
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 1, out
    assert "'/dev/zero' is not a regular file (a character device)" in out, out


def test_fifty_megabyte_uid_list_is_refused(tmp_path):
    uids = ",".join(str(1000 + i % 60000) for i in range(8_000_000))  # ~50 MB
    p = start_refitd(tmp_path, f"access:\n  allowed_uids: [{uids}]\n")
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 1, out[:2000]
    assert "refitd.yaml' is " in out and "over the limit of 1 MiB" in out, out[:2000]


def test_too_many_allowed_uids_are_refused(tmp_path):
    uids = ",".join(str(1000 + i) for i in range(5000))
    p = start_refitd(tmp_path, f"access:\n  allowed_uids: [{uids}]\n")
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 1, out
    assert "access.allowed_uids: lists 5000 uids; at most 4096" in out, out


def test_sigterm_during_start_up_parsing_ends_refitd(tmp_path):
    # A spec that takes a while to load (close to the 4 MiB and 20000-rule caps): SIGTERM while
    # it is parsed ends refitd at once (by the signal) instead of after the parse.
    pad = "p" * 120
    rules = "".join(f"  - {{match: \"m.{i}.{pad}.*\", format: bf16}}\n" for i in range(20000))
    p = start_refitd(tmp_path, "", spec="model: m\nrules:\n" + rules)
    time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
    out = p.stdout.read() or ""
    assert p.returncode == -signal.SIGTERM, (p.returncode, out[-2000:])
    assert "event=listening" not in out
