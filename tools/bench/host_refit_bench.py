#!/usr/bin/env python3
"""The control plane of a refit, on the host path (no GPU): refitd, the example engine (shared
memory) and the example trainer as three processes on a temporary Unix socket, the demo model
with Llama-8B's 291 tensor names and small shapes, so that what is measured is mostly the
control plane (begin, pause, validation, commit), not the conversion.

  python3 tools/bench/host_refit_bench.py --build build [--config "staging: direct"] [--refits 12]
      [--spec deploy/models/llama3_fp8.yaml]

--spec: a model spec file instead of the embedded demo spec (its tensor_parallel set to size 1:
one engine holds the whole model), with shapes that fit the shipped specs' block sizes.

Prints the median of each of the trainer's per-refit numbers over the steady refits (all but
the first two), one "name value" line each, then the daemon's `early=` flags (staging: direct).
"""
import argparse
import json
import re
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

SHAPES = ["--layers", "32", "--hidden", "64", "--intermediate", "128", "--kv-hidden", "32", "--vocab", "512"]
# For a spec file: every dimension a multiple of 128 (FP8 block-128 shards whole blocks).
SPEC_SHAPES = ["--layers", "32", "--hidden", "256", "--intermediate", "512", "--kv-hidden", "128", "--vocab", "512"]
KEYS = ["push_commit_ms", "ready_commit_ms", "trainer_begin_ms", "trainer_push_ms", "trainer_commit_ms", "plan_ms", "validate_ms",
        "finish_ms", "prepare_ms", "commit_ms", "pause_ms", "total_ms", "tensors", "buckets"]


def wait_for(pred, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise SystemExit(f"timed out waiting for {what}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--config", default="", help="extra refitd config lines (YAML)")
    ap.add_argument("--refits", type=int, default=12)
    ap.add_argument("--spec", default="", help="model spec file (default: the embedded demo spec)")
    ap.add_argument("--begin-ahead-ms", type=int, default=0,
                    help="the trainer begins each refit this long before it pushes (ready_commit_ms from then)")
    args = ap.parse_args()
    build = Path(args.build).resolve()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        address = f"unix:{tmp / 'refitd.sock'}"
        config = tmp / "refitd.yaml"
        shapes, spec_flag, spec_line = SHAPES, [], ""
        if args.spec:
            spec = tmp / "spec.yaml"
            spec.write_text(re.sub(r"^tensor_parallel:.*$", "tensor_parallel: {size: 1}",
                                   Path(args.spec).read_text(), flags=re.M))
            shapes, spec_flag, spec_line = SPEC_SHAPES, ["--spec", str(spec)], f"model_spec: {spec}\n"
        config.write_text(f"listen: {address}\n" + spec_line + args.config.replace("\\n", "\n") + "\n")
        log = tmp / "refitd.log"
        daemon = subprocess.Popen([str(build / "src/server/refitd"), "--config", str(config)],
                                  stdout=open(log, "w"), stderr=subprocess.STDOUT)
        engine = None
        try:
            wait_for(lambda: "event=listening" in log.read_text() or daemon.poll() is not None, "refitd")
            if daemon.poll() is not None:
                raise SystemExit(log.read_text())
            engine_log = tmp / "engine.log"
            engine = subprocess.Popen([str(build / "tools/examples/example_engine"), "--address", address,
                                       "--shm", f"/refit-bench-{uuid.uuid4().hex[:12]}", *spec_flag, *shapes],
                                      stdout=open(engine_log, "w"), stderr=subprocess.STDOUT)
            wait_for(lambda: "event=engine_registered" in log.read_text() or engine.poll() is not None, "engine")
            if engine.poll() is not None:
                raise SystemExit(engine_log.read_text())
            p = subprocess.run([str(build / "tools/examples/example_trainer"), "--address", address,
                                "--refits", str(args.refits), "--begin-ahead-ms", str(args.begin_ahead_ms), *spec_flag,
                                *shapes], capture_output=True, text=True, timeout=600)
            lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
            if p.returncode != 0 or len(lines) != args.refits:
                raise SystemExit(f"trainer failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
            steady = lines[2:] if len(lines) > 2 else lines
            for k in KEYS:
                if k in steady[0]:
                    print(k, round(statistics.median(float(l[k]) for l in steady), 3))
            print("early", " ".join(re.findall(r"early=(\w+)", log.read_text())))
        finally:
            for proc in (engine, daemon):
                if proc is not None and proc.poll() is None:
                    proc.terminate()
                    proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
