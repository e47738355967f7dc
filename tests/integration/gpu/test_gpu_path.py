"""The GPU path end to end: refitd writes into an engine's GPU memory through CUDA IPC, with
host staging (CPU converter, H2D commit) and device staging (GPU kernels, D2D commit). Three
refits each, compared byte for byte with the offline conversion. Skips, saying why, where no
CUDA device is present."""
import json
import signal
import subprocess

import pytest

from conftest import ENGINE, REFITD, TRAINER, wait_for


@pytest.mark.parametrize("staging,verify", [("host", False), ("device", False), ("host", True), ("device", True)])
def test_three_gpu_refits_match_offline_conversion(require_gpu, tmp_path, staging, verify):
    # verify: engine.verify_after_commit checksums the engine's GPU memory after each copy (on
    # the GPU) against the staged bytes; every commit must pass it.
    sock = tmp_path / "refitd.sock"
    cfg = tmp_path / "refitd.yaml"
    cfg.write_text(f"listen: unix:{sock}\nstaging: {staging}\n" +
                   ("engine:\n  verify_after_commit: true\n" if verify else ""))
    log = tmp_path / "refitd.log"
    daemon = subprocess.Popen([str(REFITD), "--config", str(cfg)], stdout=open(log, "w"), stderr=subprocess.STDOUT)
    engine_log = tmp_path / "engine.log"
    engine = None
    try:
        wait_for(lambda: "event=listening" in log.read_text() or daemon.poll() is not None, what="refitd listening")
        assert daemon.poll() is None, log.read_text()
        engine = subprocess.Popen([str(ENGINE), "--address", f"unix:{sock}", "--gpu", "0"],
                                  stdout=open(engine_log, "w"), stderr=subprocess.STDOUT)
        wait_for(lambda: "registered" in engine_log.read_text() or engine.poll() is not None, what="registration")
        assert engine.poll() is None, engine_log.read_text() + log.read_text()
        p = subprocess.run([str(TRAINER), "--address", f"unix:{sock}", "--refits", "3"], capture_output=True,
                           text=True, timeout=120)
        lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
        assert p.returncode == 0, p.stdout + p.stderr + log.read_text()
        assert [l["outcome"] for l in lines] == ["committed"] * 3
        assert all(l["engine_matches_expected"] for l in lines), lines
        refits = [l for l in log.read_text().splitlines() if "event=refit " in l]
        assert len(refits) == 3 and all(("verify_ms=" in l) == verify for l in refits), refits
        engine.send_signal(signal.SIGTERM)
        engine.wait(timeout=30)
        exit_report = json.loads(engine_log.read_text().splitlines()[-1])
        assert exit_report["mixed"] == 0
        print(json.dumps(lines))
    finally:
        for proc in (engine, daemon):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
