#!/usr/bin/env python3
"""End-to-end GPU refit benchmark on one GPU (host data plane): refitd with device staging, an
idle example engine holding a Llama-3-8B-shaped model on GPU 0 (FP8 block-128 projections, BF16
embeddings), and the example trainer pushing 16 GB of BF16 over UCX. Reports each refit's
phases and the engine pause next to a plain device-to-device copy of the same bytes measured in
the same run (goal: pause <= copy + 1 ms).

  python3 tools/bench/gpu_refit_bench.py --build build [--refits 3] [--staging device|host]
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_procs import start_node, stop

LLAMA8B = ["--layers", "32", "--hidden", "4096", "--intermediate", "14336", "--kv-hidden", "1024", "--vocab", "128256"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--refits", type=int, default=3)
    ap.add_argument("--staging", default="device")
    ap.add_argument("--bucket-bytes", type=int, default=1200 << 20)
    ap.add_argument("--shape", nargs="*", default=LLAMA8B)
    a = ap.parse_args()
    build = Path(a.build)
    tmp = Path(tempfile.mkdtemp())
    daemon, engine = start_node(
        build, tmp, f"listen: unix:{tmp / 'refitd.sock'}\nstaging: {a.staging}\nlimits:\n"
        f"  bucket_bytes: {a.bucket_bytes}\n  bucket_slots: 2\n  session_deadline_ms: 600000\n",
        ["--gpu", "0", "--idle", *a.shape])
    sock = tmp / "refitd.sock"
    try:
        reg = json.loads((tmp / "engine.log").read_text().splitlines()[0])
        t0 = time.time()
        p = subprocess.run([str(build / "tools/examples/example_trainer"), "--address", f"unix:{sock}",
                            "--refits", str(a.refits), "--no-verify", *a.shape],
                           capture_output=True, text=True, timeout=1500)
        wall = time.time() - t0
        if p.returncode != 0:
            print(p.stdout, p.stderr, (tmp / "refitd.log").read_text()[-3000:], file=sys.stderr)
            return 1
        reports = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
        committed_bytes = reports[-1]["bytes_out"]
        copy = json.loads(subprocess.run([str(build / "tools/bench/copy_bench"), str(committed_bytes)],
                                         capture_output=True, text=True, check=True).stdout)
        out = {"engine_bytes": reg["bytes"], "staging": a.staging, "copy": copy, "refits": reports,
               "trainer_wall_s": wall}
        print(json.dumps(out))
        print(f"{'refit':>5} {'bytes_in':>12} {'bytes_out':>12} {'recv_ms':>9} {'conv_ms':>9} {'valid_ms':>8} "
              f"{'copy_ms':>8} {'pause_ms':>9} {'total_ms':>9}")
        for r in reports:
            print(f"{r['refit']:>5} {r['bytes_in']:>12} {r['bytes_out']:>12} {r['receive_ms']:>9.1f} "
                  f"{r['convert_ms']:>9.1f} {r['validate_ms']:>8.2f} {r['commit_ms']:>8.2f} {r['pause_ms']:>9.2f} "
              f"{r['total_ms']:>9.1f}")
        pauses = sorted(r["pause_ms"] for r in reports)
        print(f"commit of {committed_bytes/1e9:.2f} GB: pause median {pauses[len(pauses)//2]:.2f} ms; plain D2D copy "
              f"{copy['d2d_ms']:.2f} ms, H2D pinned {copy['h2d_ms']:.2f} ms; pause - copy = "
              f"{pauses[len(pauses)//2] - (copy['d2d_ms'] if a.staging == 'device' else copy['h2d_ms']):.2f} ms")
        return 0
    finally:
        stop(engine, daemon)


if __name__ == "__main__":
    sys.exit(main())
