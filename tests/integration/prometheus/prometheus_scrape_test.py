"""A real Prometheus server scrapes metrics_fixture's /metrics every second; the test waits,
polling Prometheus' HTTP API against a deadline, until a query for the fixture's counter returns
the fixture's value, and checks that Prometheus' own (strict) parser read labels and escapes as
written.

Skips, printing why, when no `prometheus` binary is on PATH; tools/setup installs the Debian
package. Run by ctest (test prometheus_scrape), which sets METRICS_FIXTURE.
"""
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

DEADLINE_S = 15.0
POLL_S = 0.1


def free_port():
    # Prometheus reports no port when told to bind port 0, so pick one here; a lost race shows
    # as Prometheus exiting at startup, and the caller retries.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def fixture_port():
    binary = os.environ.get("METRICS_FIXTURE")
    assert binary, "METRICS_FIXTURE must name the metrics_fixture program (ctest sets it)"
    proc = subprocess.Popen([binary, "--exit-on-stdin-eof"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("port="), f"unexpected first line from metrics_fixture: {line!r}"
        yield int(line[5:])
    finally:
        proc.stdin.close()
        stop(proc)


def api(prom_port, path, **params):
    url = f"http://127.0.0.1:{prom_port}{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read().decode("utf-8"))


def start_prometheus(binary, tmp_path, target_port):
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n"
        "  scrape_interval: 1s\n"
        "  scrape_timeout: 1s\n"
        "  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: refit_fixture\n"
        "    static_configs:\n"
        f"      - targets: ['127.0.0.1:{target_port}']\n")
    for attempt in range(3):
        port = free_port()
        log = open(tmp_path / f"prometheus-{attempt}.log", "w+")
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return proc, port, log
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(POLL_S)
        stop(proc)
        log.seek(0)
        output = log.read()
        if "address already in use" not in output:
            pytest.fail(f"prometheus did not become ready:\n{output}")
    pytest.fail("prometheus could not bind a free port in 3 attempts")


def query_until(prom_port, query, want, deadline):
    """Polls an instant query until it returns exactly one series with value `want`."""
    last = None
    while time.monotonic() < deadline:
        last = api(prom_port, "/api/v1/query", query=query)
        result = last.get("data", {}).get("result", [])
        if len(result) == 1 and result[0]["value"][1] == want:
            return result[0]
        time.sleep(POLL_S)
    pytest.fail(f"query {query!r} did not return {want!r} within {DEADLINE_S}s; last: {last}")


def test_prometheus_scrapes_fixture(fixture_port, tmp_path):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("no 'prometheus' binary on PATH (tools/setup installs the Debian package "
                    "'prometheus')")
    started = time.monotonic()
    prom, prom_port, log = start_prometheus(binary, tmp_path, fixture_port)
    try:
        deadline = time.monotonic() + DEADLINE_S
        series = query_until(
            prom_port, 'refit_sessions_total{outcome="committed",reason="none"}', "3", deadline)
        assert series["metric"]["job"] == "refit_fixture"

        # The same scrape carried everything else; Prometheus parsed it as written.
        targets = api(prom_port, "/api/v1/targets")["data"]["activeTargets"]
        assert [(t["health"], t["lastError"]) for t in targets] == [("up", "")]
        query_until(prom_port, 'refit_phase_duration_seconds_count{phase="convert"}', "2",
                    deadline)
        query_until(prom_port, 'refit_phase_duration_seconds_bucket{phase="convert",le="0.025"}',
                    "1", deadline)
        query_until(prom_port, "refit_committed_version_timestamp_seconds", "1700000000.5",
                    deadline)
        escaped = query_until(prom_port, "fixture_escapes_total", "1", deadline)
        assert escaped["metric"]["value"] == 'quote" backslash\\ newline\n end'
        query_until(prom_port, 'fixture_special{kind="inf"}', "+Inf", deadline)
        query_until(prom_port, 'fixture_special{kind="nan"}', "NaN", deadline)
    except BaseException:
        log.seek(0)
        print(f"prometheus log:\n{log.read()}")
        raise
    finally:
        stop(prom)
        log.close()
    assert prom.returncode is not None
    elapsed = time.monotonic() - started
    print(f"prometheus scraped the fixture and answered in {elapsed:.1f}s")
