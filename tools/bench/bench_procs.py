"""refitd and an example engine started for a benchmark, and stopped after it (the shared part of
gpu_refit_bench.py and ucx_host_bench.py)."""
import signal
import subprocess
import time
from pathlib import Path


def start_node(build: Path, tmp: Path, config: str, engine_args: list, engine_wait_s: float = 60.0):
    """refitd with `config` (written to tmp/refitd.yaml; it listens on unix:tmp/refitd.sock), then the
    example engine with `engine_args` once the socket exists; returns (daemon, engine) once the engine
    registered (or exited: its log says why). Logs: tmp/refitd.log, tmp/engine.log."""
    sock = tmp / "refitd.sock"
    (tmp / "refitd.yaml").write_text(config)
    daemon = subprocess.Popen([str(build / "src/server/refitd"), "--config", str(tmp / "refitd.yaml")],
                              stdout=open(tmp / "refitd.log", "w"), stderr=subprocess.STDOUT)
    engine = None
    try:
        for _ in range(400):
            if sock.exists():
                break
            time.sleep(0.05)
        engine = subprocess.Popen([str(build / "tools/examples/example_engine"), "--address", f"unix:{sock}",
                                   *engine_args], stdout=open(tmp / "engine.log", "w"), stderr=subprocess.STDOUT)
        for _ in range(int(engine_wait_s / 0.05)):
            if "registered" in (tmp / "engine.log").read_text() or engine.poll() is not None:
                break
            time.sleep(0.05)
    except BaseException:
        stop(engine, daemon)
        raise
    return daemon, engine


def stop(*procs):
    """SIGTERM (refitd writes what it was asked to at exit, e.g. REFIT_CPU_PROFILE), then SIGKILL after 30 s."""
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
