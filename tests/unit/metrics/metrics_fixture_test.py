"""Reads metrics_fixture's admin endpoint over HTTP and parses /metrics with prometheus_client's
own text parser, checking names, types, labels and values; also /healthz, /readyz, /version,
404 and 405.

Run by ctest (test metrics_fixture_http), which sets METRICS_FIXTURE to the built program.
"""
import json
import math
import os
import subprocess
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families


@pytest.fixture
def server(tmp_path):
    binary = os.environ.get("METRICS_FIXTURE")
    assert binary, "METRICS_FIXTURE must name the metrics_fixture program (ctest sets it)"
    ready_file = tmp_path / "ready"
    proc = subprocess.Popen(
        [binary, f"--ready-file={ready_file}", "--exit-on-stdin-eof"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("port="), f"unexpected first line from metrics_fixture: {line!r}"
        yield f"http://127.0.0.1:{int(line[5:])}", ready_file
    finally:
        proc.stdin.close()  # the fixture exits when its stdin closes
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0


def get(url, method="GET"):
    """Returns (status, headers, body); HTTP error statuses are returned, not raised."""
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read().decode("utf-8")
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read().decode("utf-8")


def families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample_values(family):
    """{(sample name, sorted labels): value}."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}


def test_metrics_parse_with_prometheus_client(server):
    base, _ = server
    status, headers, body = get(base + "/metrics")
    assert status == 200
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    fams = families(body)

    # The parser names counter families without "_total"; their samples keep it.
    expected_types = {
        "refit_sessions": "counter",
        "refit_received_bytes": "counter",
        "refit_converted_bytes": "counter",
        "refit_phase_duration_seconds": "histogram",
        "refit_commit_pause_seconds": "histogram",
        "refit_committed_version": "gauge",
        "refit_committed_version_timestamp_seconds": "gauge",
        "refit_committed_version_info": "gauge",
        "refit_verify_mismatches": "counter",
        "refit_converted_in_place_bytes": "counter",
        "refit_kept_versions": "gauge",
        "refit_staging_bytes": "gauge",
        "refit_active_sessions": "gauge",
        "refit_engine_registered": "gauge",
        "refit_group_member_info": "gauge",
        "refit_group_phase": "gauge",
        "refit_group_dirty": "gauge",
        "refit_group_versions": "gauge",
        "refit_group_deadline_expiries": "gauge",
        "refit_build_info": "gauge",
        "fixture_escapes": "counter",
        "fixture_temperature_celsius": "gauge",
        "fixture_big_bytes": "gauge",
        "fixture_special": "gauge",
    }
    assert {name: f.type for name, f in fams.items()} == expected_types

    assert sample_values(fams["refit_sessions"]) == {
        ("refit_sessions_total", (("outcome", "committed"), ("reason", "none"))): 3.0,
        ("refit_sessions_total", (("outcome", "failed"), ("reason", "incomplete"))): 1.0,
    }
    assert sample_values(fams["refit_received_bytes"]) == {
        ("refit_received_bytes_total", (("transport", "ucx"),)): 1048576.0}
    assert sample_values(fams["refit_converted_bytes"]) == {
        ("refit_converted_bytes_total", (("format", "nvfp4"),)): 262144.0}
    assert sample_values(fams["refit_committed_version"]) == {
        ("refit_committed_version", ()): 7.0}
    assert sample_values(fams["refit_committed_version_timestamp_seconds"]) == {
        ("refit_committed_version_timestamp_seconds", ()): 1700000000.5}
    assert sample_values(fams["refit_committed_version_info"]) == {
        ("refit_committed_version_info", (("tag", "step-7"),)): 1.0}
    assert sample_values(fams["refit_verify_mismatches"]) == {("refit_verify_mismatches_total", ()): 0.0}
    assert sample_values(fams["refit_converted_in_place_bytes"]) == {
        ("refit_converted_in_place_bytes_total", ()): 131072.0}
    assert sample_values(fams["refit_staging_bytes"]) == {("refit_staging_bytes", ()): 4096.0}
    assert sample_values(fams["refit_active_sessions"]) == {("refit_active_sessions", ()): 1.0}
    assert sample_values(fams["refit_engine_registered"]) == {
        ("refit_engine_registered", ()): 1.0}
    [build] = fams["refit_build_info"].samples
    assert build.labels == {"version": "0.1.0", "git_commit": "fixture",
                            "build_type": "RelWithDebInfo", "cuda": "false"}
    assert build.value == 1.0

    assert fams["fixture_temperature_celsius"].samples[0].value == -12.5
    assert fams["fixture_big_bytes"].samples[0].value == 123456789012345.0
    special = {s.labels["kind"]: s.value for s in fams["fixture_special"].samples}
    assert special["inf"] == math.inf
    assert special["minus_inf"] == -math.inf
    assert math.isnan(special["nan"])


def test_escaping_round_trips(server):
    base, _ = server
    fams = families(get(base + "/metrics")[2])
    escapes = fams["fixture_escapes"]
    assert escapes.documentation == "Help with a backslash \\ and\na newline."
    [sample] = escapes.samples
    assert sample.labels == {"value": 'quote" backslash\\ newline\n end'}
    assert sample.value == 1.0


def test_histograms_are_cumulative(server):
    base, _ = server
    fams = families(get(base + "/metrics")[2])
    phase = fams["refit_phase_duration_seconds"]
    by_phase = {}
    for s in phase.samples:
        by_phase.setdefault(s.labels["phase"], []).append(s)
    assert set(by_phase) == {"receive", "convert", "validate", "commit"}

    convert = by_phase["convert"]
    buckets = [(s.labels["le"], s.value) for s in convert if s.name.endswith("_bucket")]
    bounds = [float(le) for le, _ in buckets]
    assert bounds == sorted(bounds) and bounds[-1] == math.inf
    assert buckets[-1][0] == "+Inf"
    counts = [v for _, v in buckets]
    assert counts == sorted(counts), "bucket counts must be cumulative"
    # Observations 0.02 s and 0.3 s.
    assert dict(buckets)["0.01"] == 0
    assert dict(buckets)["0.025"] == 1
    assert dict(buckets)["0.25"] == 1
    assert dict(buckets)["0.5"] == 2
    totals = {s.name: s.value for s in convert if not s.name.endswith("_bucket")}
    assert totals["refit_phase_duration_seconds_count"] == 2
    assert totals["refit_phase_duration_seconds_sum"] == pytest.approx(0.32)
    for s in by_phase["receive"]:
        assert s.value == 0

    pause = fams["refit_commit_pause_seconds"].samples
    pause_buckets = {s.labels["le"]: s.value for s in pause if s.name.endswith("_bucket")}
    assert pause_buckets["0.0005"] == 0  # 0.8 ms observed
    assert pause_buckets["0.001"] == 1
    assert pause_buckets["+Inf"] == 1


def test_healthz(server):
    base, _ = server
    status, headers, body = get(base + "/healthz")
    assert (status, body) == (200, "ok\n")


def test_readyz_follows_readiness(server):
    base, ready_file = server
    status, _, body = get(base + "/readyz")
    assert status == 503
    assert body == f"not ready: ready file {ready_file} does not exist\n"
    ready_file.write_text("")
    status, _, body = get(base + "/readyz")
    assert (status, body) == (200, "ready\n")


def test_version_is_json(server):
    base, _ = server
    status, headers, body = get(base + "/version")
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"name": "refitd", "version": "0.1.0", "git_commit": "fixture",
                                "build_type": "RelWithDebInfo", "cuda": False}


def test_unknown_path_is_404(server):
    base, _ = server
    assert get(base + "/nope")[0] == 404
    assert get(base + "/metrics/x")[0] == 404


def test_non_get_is_405(server):
    base, _ = server
    status, headers, _ = get(base + "/metrics", method="POST")
    assert status == 405
    assert headers["Allow"] == "GET"
    assert get(base + "/healthz", method="PUT")[0] == 405
