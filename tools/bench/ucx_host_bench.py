#!/usr/bin/env python3
"""The host data plane against UCX's own ceiling on the same machine: `ucx_perftest` (tag_bw, one
message per bucket, the same UCX_TLS) next to refitd host refits of the same bytes, in one run.

A refit here is refitd (`staging: host`, or `direct` with --staging direct; the UCX data plane as shipped: `ucx_tls` tcp,sm,self),
an idle example engine in shared memory, and the example trainer pushing BF16 over loopback. The
spec passes every tensor through (`format: passthrough`), so the bytes the trainer sends are the
bytes the engine holds and no conversion competes with the transport; the model is the demo
Llama's tensor names at --layers/--hidden/... (about --gib GiB).

  python3 tools/bench/ucx_host_bench.py --build build [--layers 8] [--bucket-mib 256] [--refits 4]

Prints one JSON object, then a table: perftest GB/s; per refit receive GB/s (bytes in over the
session's receive phase) and end-to-end GB/s (bytes in over the trainer's begin-to-commit time),
each with its ratio to perftest (the #45 goal: end to end >= 0.80).
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench_procs import start_node, stop

PASSTHROUGH_SPEC = """model: demo-llama
defaults:
  format: passthrough
"""


# The refit's phases printed beside the rates (the trainer's report line).
PHASES = ["trainer_begin_ms", "trainer_push_ms", "trainer_commit_ms", "convert_ms", "validate_ms", "commit_ms",
          "pause_ms"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def perftest(tls: str, bucket: int, total: int) -> dict:
    """ucx_perftest tag_bw over loopback: the client sends `total` bytes as messages of `bucket`."""
    exe = shutil.which("ucx_perftest")
    if exe is None:
        raise SystemExit("ucx_perftest not found (Debian: ucx-utils)")
    env = dict(os.environ, UCX_TLS=tls)
    port = free_port()
    server = subprocess.Popen([exe, "-p", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        iters = max(2, total // bucket)
        p = subprocess.run([exe, "127.0.0.1", "-p", str(port), "-t", "tag_bw", "-s", str(bucket), "-n", str(iters),
                            "-w", "1"], env=env, capture_output=True, text=True, timeout=600)
        final = [l for l in p.stdout.splitlines() if l.startswith("Final:")]
        if p.returncode != 0 or not final:
            raise SystemExit(f"ucx_perftest failed: {p.stdout[-2000:]} {p.stderr[-2000:]}")
        # Final: iterations, overhead 50%/avg/overall (us), bandwidth avg/overall (MB/s = 2^20 B/s), ...
        cols = final[0].split()[1:]
        overall_mib_s = float(cols[5])
        return {"tls": tls, "bucket_bytes": bucket, "iterations": iters, "gb_s": overall_mib_s * 2**20 / 1e9}
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()


def refits(build: Path, shape: list, bucket: int, count: int, tmp: Path, staging: str = "host") -> list:
    address = f"unix:{tmp / 'refitd.sock'}"
    spec = tmp / "spec.yaml"
    spec.write_text(PASSTHROUGH_SPEC)
    shm = f"/refit-ucxbench-{uuid.uuid4().hex[:8]}"
    daemon, engine = start_node(
        build, tmp, f"listen: {address}\nstaging: {staging}\nmodel_spec: {spec}\n"
        f"limits:\n  bucket_bytes: {bucket}\n  bucket_slots: 2\n  session_deadline_ms: 600000\n",
        ["--shm", shm, "--spec", str(spec), "--idle", *shape], engine_wait_s=120)
    try:
        p = subprocess.run([str(build / "tools/examples/example_trainer"), "--address", address, "--spec", str(spec),
                            "--refits", str(count), "--no-verify", *shape],
                           capture_output=True, text=True, timeout=3000)
        if p.returncode != 0:
            raise SystemExit(p.stdout + p.stderr + (tmp / "refitd.log").read_text()[-3000:])
        data = re.search(r"data=(\S+)", (tmp / "refitd.log").read_text())
        reports = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
        for r in reports:
            if r.get("outcome") != "committed":
                raise SystemExit(f"refit {r.get('refit')} {r.get('outcome')}: {r.get('error', '')} "
                                 "(a tensor larger than --bucket-mib needs a larger bucket)")
            r["data_plane"] = data.group(1) if data else ""
        return reports
    finally:
        stop(engine, daemon)
        Path("/dev/shm" + shm).unlink(missing_ok=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--intermediate", type=int, default=14336)
    ap.add_argument("--kv-hidden", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--bucket-mib", type=int, default=256, help="bucket size; every tensor must fit one")
    ap.add_argument("--refits", type=int, default=4)
    ap.add_argument("--staging", choices=["host", "direct"], default="host",
                    help="refitd's staging: host (a staged commit copies into the engine in its pause) or direct "
                         "(the buckets are converted into the paused engine's memory; no commit copy)")
    ap.add_argument("--tls", default="tcp", help="UCX_TLS for ucx_perftest (refitd's lanes: tcp, see docs/transports.md)")
    a = ap.parse_args()
    build = Path(a.build).resolve()
    shape = ["--layers", str(a.layers), "--hidden", str(a.hidden), "--intermediate", str(a.intermediate),
             "--kv-hidden", str(a.kv_hidden), "--vocab", str(a.vocab)]
    bucket = a.bucket_mib << 20
    with tempfile.TemporaryDirectory() as d:
        reports = refits(build, shape, bucket, a.refits, Path(d), a.staging)
    total = reports[-1]["bytes_in"]
    pt = perftest(a.tls, bucket, total)
    rows = []
    for r in reports:
        recv = r["bytes_in"] / (r["receive_ms"] / 1e3) / 1e9
        e2e = r["bytes_in"] / (r["push_commit_ms"] / 1e3) / 1e9
        rows.append({"refit": r["refit"], "bytes_in": r["bytes_in"], "receive_ms": r["receive_ms"],
                     "push_commit_ms": r["push_commit_ms"], "receive_gb_s": recv, "e2e_gb_s": e2e,
                     "receive_ratio": recv / pt["gb_s"], "e2e_ratio": e2e / pt["gb_s"],
                     **{k: r.get(k, 0.0) for k in PHASES}})
    steady = rows[1:] or rows
    out = {"perftest": pt, "staging": a.staging, "data_plane": reports[-1]["data_plane"], "refits": rows,
           "median_e2e_ratio": statistics.median(r["e2e_ratio"] for r in steady),
           "median_receive_ratio": statistics.median(r["receive_ratio"] for r in steady)}
    print(json.dumps(out))
    print(f"ucx_perftest tag_bw {pt['tls']}, {bucket >> 20} MiB messages: {pt['gb_s']:.2f} GB/s")
    print(f"{'refit':>5} {'GB in':>7} {'recv ms':>9} {'e2e ms':>9} {'recv GB/s':>10} {'e2e GB/s':>9} "
          f"{'recv/pt':>8} {'e2e/pt':>7} " + " ".join(f"{k.removesuffix('_ms'):>13}" for k in PHASES))
    for r in rows:
        print(f"{r['refit']:>5} {r['bytes_in']/1e9:>7.2f} {r['receive_ms']:>9.1f} {r['push_commit_ms']:>9.1f} "
              f"{r['receive_gb_s']:>10.2f} {r['e2e_gb_s']:>9.2f} {r['receive_ratio']:>8.2f} {r['e2e_ratio']:>7.2f} "
              + " ".join(f"{r[k]:>13.1f}" for k in PHASES))
    print(f"median over refits 2..{len(rows)}: end to end {out['median_e2e_ratio']:.2f} of ucx_perftest, "
          f"receive {out['median_receive_ratio']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
