"""A real Prometheus server scrapes a live refitd during refits and answers a query for the
refit counter (issue: operations). Skips, saying why, when no `prometheus` binary is installed."""
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "prometheus"))
from prometheus_scrape_test import DEADLINE_S, api, query_until, start_prometheus, stop  # noqa: E402

from conftest import TRAINER  # noqa: E402


def query_nonempty(prom_port, query, deadline):
    """Polls an instant query (a comparison filter) until it returns one series."""
    last = None
    while time.monotonic() < deadline:
        last = api(prom_port, "/api/v1/query", query=query)
        if len(last.get("data", {}).get("result", [])) == 1:
            return
        time.sleep(0.1)
    pytest.fail(f"query {query!r} returned no series within {DEADLINE_S}s; last: {last}")


def test_prometheus_scrapes_refitd_during_refits(node_factory, tmp_path):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("no 'prometheus' binary on PATH (tools/setup installs the Debian package 'prometheus')")
    node = node_factory()
    admin_port = int(re.search(r"admin_port=(\d+)", node.daemon_log.read_text()).group(1))
    prom, prom_port, log = start_prometheus(binary, tmp_path, admin_port)
    try:
        # Refits run while Prometheus scrapes every second.
        trainer = subprocess.Popen([str(TRAINER), "--address", node.address, "--refits", "2"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = trainer.communicate(timeout=120)
        assert trainer.returncode == 0, out + err
        deadline = time.monotonic() + DEADLINE_S
        series = query_until(prom_port, 'refit_sessions_total{outcome="committed",reason="none"}', "2", deadline)
        assert series["metric"]["job"] == "refit_fixture"
        query_until(prom_port, "refit_committed_version", "2", deadline)
        query_until(prom_port, "refit_engine_registered", "1", deadline)
        # Prometheus read the process_* families and the byte counters as it reads any client's.
        for q in ["process_resident_memory_bytes > 1e6", "process_open_fds > 0", "process_max_fds > 0",
                  "process_virtual_memory_bytes > 0", "process_start_time_seconds > 1.6e9",
                  "process_cpu_seconds_total > 0", 'refit_received_bytes_total{transport="ucx"} > 0',
                  'sum(refit_converted_bytes_total) > 0']:
            query_nonempty(prom_port, q, deadline)
        targets = api(prom_port, "/api/v1/targets")["data"]["activeTargets"]
        assert [(t["health"], t["lastError"]) for t in targets] == [("up", "")]
    except BaseException:
        log.seek(0)
        print(f"prometheus log:\n{log.read()}")
        raise
    finally:
        stop(prom)
        log.close()


def test_prometheus_sees_a_refit_in_progress(node_factory, tmp_path):
    """Prometheus scrapes refitd while a refit is in progress (the trainer pushed half the model
    and stalls): the staging gauge and the byte counters already show it, before it ends."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("no 'prometheus' binary on PATH (tools/setup installs the Debian package 'prometheus')")
    node = node_factory()
    admin_port = int(re.search(r"admin_port=(\d+)", node.daemon_log.read_text()).group(1))
    prom, prom_port, log = start_prometheus(binary, tmp_path, admin_port)
    trainer = subprocess.Popen([str(TRAINER), "--address", node.address, "--fault", "stall"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + DEADLINE_S
        # One scrape shows the session active, nothing committed, and its bytes moving.
        query_nonempty(prom_port, "refit_active_sessions == 1 and on() refit_staging_bytes > 0 and on() "
                       'refit_received_bytes_total{transport="ucx"} > 0 and on() sum(refit_converted_bytes_total) > 0 '
                       'and on() refit_sessions_total{outcome="committed",reason="none"} == 0', deadline)
        assert trainer.poll() is None, "the trainer was to stall mid-refit"
    except BaseException:
        log.seek(0)
        print(f"prometheus log:\n{log.read()}")
        raise
    finally:
        trainer.kill()
        trainer.wait()
        stop(prom)
        log.close()
