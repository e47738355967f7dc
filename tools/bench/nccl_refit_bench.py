#!/usr/bin/env python3
"""End-to-end GPU refit over NCCL on two GPUs: the example trainer on GPU 0 pushes device tensors
over the NCCL data plane; refitd (device bucket ring, GPU converter, device staging) and an idle
example engine sit on GPU 1. Workloads:

  llama8b  Llama-3-8B shapes (16 GB BF16) -> FP8 block-128 projections, BF16 rest (demo spec)
  moe      Qwen3-30B-A3B shapes (hidden 2048, 128 experts of 768, --moe-layers layers) -> NVFP4
           experts, BF16 rest (tools/bench/moe_nvfp4_spec.yaml)

In the same run it measures raw NCCL send/recv of the same bytes in the same bucket-sized messages
(tools/bench/nccl_bench; ncclBroadcast to every daemon's GPU for fan-out) and, with --baseline, the broadcast + PyTorch-quantize loop of
shared/bench/gpu_baseline.py --nccl. Prints one JSON document (and a table on stderr).

  NCCL_NVLS_ENABLE=0 python3 tools/bench/nccl_refit_bench.py --build build \
      [--workloads llama8b moe] [--modes p2p fanout] [--daemons N] [--refits 3]
      [--baseline PATH/gpu_baseline.py] [--out FILE]

--daemons N (N+1 GPUs) runs N refitd+engine pairs on GPUs 1..N fed by one trainer through
FanoutClient, against NCCL's own broadcast of the same bytes; each refit line then also says
whether every engine holds the same bytes (engines_equal).

--transport cuda_ipc runs the colocated case on one GPU instead: trainer, refitd and engine all on
GPU 0, buckets over CUDA IPC; the raw figure is then tools/bench/cuda_ipc_bench (the same bytes in
the same bucket-sized messages over CUDA IPC, and the device copy rate of those bytes).
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LLAMA8B = ["--layers", "32", "--hidden", "4096", "--intermediate", "14336", "--kv-hidden", "1024",
           "--vocab", "128256"]


def moe_shape(layers):
    return ["--layers", str(layers), "--hidden", "2048", "--kv-hidden", "512", "--vocab", "151936",
            "--experts", "128", "--moe-intermediate", "768"]


def start_node(build, name, k, shape, spec, bucket_bytes, tmp, slots=2, transport="nccl", staging="device",
               engine_args=(), engine_ranks=1, model_config=""):
    """refitd + an idle example engine on GPU k (`engine_ranks` > 1: that many engine rank
    processes, all on GPU k, `spec` stating tensor_parallel size engine_ranks; `model_config`: the
    config.json a spec takes its sizes from); returns (address, [processes], log)."""
    sock = tmp / f"{name}.{k}.sock"
    cfg = tmp / f"{name}.{k}.yaml"
    text = (f"listen: unix:{sock}\nstaging: {staging}\nadmin: {{listen: ''}}\n"
            f"data_plane:\n  transport: {transport}\n  device: {k}\n"
            f"limits:\n  bucket_bytes: {bucket_bytes}\n  bucket_slots: {slots}\n  session_deadline_ms: 600000\n")
    if spec:
        text += f"model_spec: {spec}\n"
    if model_config:
        text += f"model_config: {model_config}\n"
    cfg.write_text(text)
    log = tmp / f"{name}.{k}.refitd.log"
    elog = tmp / f"{name}.{k}.engine.log"
    procs = [subprocess.Popen([str(build / "src/server/refitd"), "--config", str(cfg)],
                              stdout=open(log, "w"), stderr=subprocess.STDOUT)]
    for _ in range(600):
        if sock.exists() or procs[0].poll() is not None:
            break
        time.sleep(0.05)
    if procs[0].poll() is not None:
        raise RuntimeError(f"refitd exited: {log.read_text()[-2000:]}")
    spec_flag = (["--spec", spec] if spec else []) + (["--model-config", model_config] if model_config else [])
    for r in range(engine_ranks):
        rlog = elog if r == 0 else tmp / f"{name}.{k}.engine{r}.log"
        rank = ["--tp-rank", str(r)] if engine_ranks > 1 else []
        procs.append(subprocess.Popen([str(build / "tools/examples/example_engine"), "--address", f"unix:{sock}",
                                       "--gpu", str(k), "--idle", *rank, *engine_args, *spec_flag, *shape],
                                      stdout=open(rlog, "w"), stderr=subprocess.STDOUT))
        for _ in range(6000):
            if "registered" in rlog.read_text() or procs[-1].poll() is not None:
                break
            time.sleep(0.05)
        if procs[-1].poll() is not None:
            raise RuntimeError(f"engine rank {r} exited: {rlog.read_text()[-2000:]}")
    return f"unix:{sock}", procs, log


def run_workload(build, name, shape, spec, refits, bucket_bytes, tmp, daemons=1, fanout=False, slots=2,
                 transport="nccl", in_place=False, staging="device", engine_args=(), trainer_args=(), engine_ranks=1,
                 model_config=""):
    """The trainer on GPU 0 refits `daemons` refitd+engine pairs on GPUs 1..daemons: point to point
    (one daemon), or by fan-out (FanoutClient: one NCCL broadcast per bucket to every daemon).
    `in_place`: the trainer pushes by RefitSession::PushInPlace (example_trainer --in-place);
    `trainer_args`: more example_trainer flags (--vmm)."""
    fanout = fanout or daemons > 1
    label = f"{name}-fanout{daemons}" if fanout else name
    procs, logs, addresses = [], [], []
    try:
        first = 0 if transport == "cuda_ipc" else 1  # colocated: refitd and engine on the trainer's GPU
        for k in range(first, first + daemons):
            address, ps, log = start_node(build, label, k, shape, spec, bucket_bytes, tmp, slots, transport, staging,
                                          engine_args, engine_ranks, model_config)
            addresses.append(address)
            procs += ps
            logs.append(log)
        spec_flag = (["--spec", spec] if spec else []) + (["--model-config", model_config] if model_config else [])
        cmd = [str(build / "tools/examples/example_trainer")]
        for a in addresses:
            cmd += ["--address", a]
        if fanout:
            cmd.append("--fanout")
        if in_place:
            cmd.append("--in-place")
        cmd += list(trainer_args)
        p = subprocess.run(cmd + ["--gpu", "0", "--refits", str(refits), "--no-verify", *spec_flag, *shape],
                           capture_output=True, text=True, timeout=1200)
        reports = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
        if p.returncode != 0 or not reports or any(r["outcome"] != "committed" for r in reports):
            raise RuntimeError(f"trainer rc={p.returncode}: {p.stdout[-2000:]} {p.stderr[-2000:]} "
                               f"refitd: {logs[0].read_text()[-3000:]}")
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
    bytes_in = reports[-1]["bytes_in"]
    mode = ["bcast"] if fanout else []
    if transport == "cuda_ipc":
        ipc = json.loads(subprocess.run([str(build / "tools/bench/cuda_ipc_bench"), str(bytes_in), str(bucket_bytes), "5"],
                                        capture_output=True, text=True, check=True).stdout)
        raw = {"mode": "cuda_ipc", "ms": ipc["ipc_ms"], "gbps": ipc["ipc_gbps"], "copy_ms": ipc["copy_ms"],
               "copy_gbps": ipc["copy_gbps"]}
    else:
        raw = json.loads(subprocess.run([str(build / "tools/bench/nccl_bench"), str(bytes_in), str(bucket_bytes), "5",
                                         str(daemons), *(mode or ["sendrecv"])],
                                        capture_output=True, text=True, check=True).stdout)
    # The first refit also sets up the communicator's connections; steady state is the rest.
    steady = reports[1:] if len(reports) > 1 else reports
    wall = statistics.median(r["push_commit_ms"] for r in steady)
    return {
        "workload": label, "daemons": daemons, "fanout": fanout, "bytes_in": bytes_in,
        "bytes_out": reports[-1]["bytes_out"], "tensors": reports[-1]["tensors"], "buckets": reports[-1]["buckets"],
        "bucket_bytes": bucket_bytes, "bucket_slots": slots, "refits": reports, "wall_ms": wall, "gbps": bytes_in / wall / 1e6,
        "engines_equal": all(r.get("engines_equal", True) for r in reports),
        "nccl_raw": raw, "ratio_nccl_over_refit": raw["ms"] / wall,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--workloads", nargs="*", default=["llama8b", "moe"])
    ap.add_argument("--refits", type=int, default=3)
    ap.add_argument("--moe-layers", type=int, default=48)
    ap.add_argument("--bucket-bytes", type=int, default=1200 << 20)
    ap.add_argument("--baseline", default="")
    ap.add_argument("--slots", type=int, default=2, help="refitd's bucket ring slots (limits.bucket_slots)")
    ap.add_argument("--daemons", type=int, default=1,
                    help="refitd daemons on GPUs 1..N fed by one trainer (N > 1 implies --fanout)")
    ap.add_argument("--modes", nargs="*", default=["p2p"], choices=["p2p", "fanout"],
                    help="p2p: TrainerClient to one daemon; fanout: FanoutClient (NCCL broadcast)")
    ap.add_argument("--transport", default="nccl", choices=["nccl", "cuda_ipc"],
                    help="cuda_ipc: trainer, refitd and engine on GPU 0 (colocated)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    build = Path(a.build).resolve()
    tmp = Path(tempfile.mkdtemp())
    here = Path(__file__).resolve().parent
    out = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "results": []}

    def save():
        if a.out:
            Path(a.out).write_text(json.dumps(out, indent=1))

    base = {}
    if a.baseline:  # first, so that its figures survive a later timeout
        env = dict(os.environ, OUT=str(tmp))
        p = subprocess.run([sys.executable, a.baseline, "--nccl"], capture_output=True, text=True, env=env, timeout=900)
        base = json.loads((tmp / "baseline.json").read_text()) if (tmp / "baseline.json").exists() else {}
        out["baseline"] = base
        if p.returncode != 0:
            out["baseline_error"] = p.stderr[-2000:]
        print(json.dumps(base), file=sys.stderr, flush=True)
        save()
    for w in a.workloads:
        for mode in a.modes:
            fanout = mode == "fanout"
            if mode == "p2p" and a.daemons > 1:
                continue
            if w == "llama8b":
                r = run_workload(build, w, LLAMA8B, "", a.refits, a.bucket_bytes, tmp, a.daemons, fanout, a.slots,
                                 a.transport)
                if "llama8b_torch_bcast_fp8_refit_s" in base and a.daemons == 1:
                    r["baseline_torch_bcast_fp8_ms"] = base["llama8b_torch_bcast_fp8_refit_s"] * 1e3
                    r["ratio_baseline_over_refit"] = r["baseline_torch_bcast_fp8_ms"] / r["wall_ms"]
            elif w == "moe":
                r = run_workload(build, w, moe_shape(a.moe_layers), str(here / "moe_nvfp4_spec.yaml"), a.refits,
                                 a.bucket_bytes, tmp, a.daemons, fanout, a.slots, a.transport)
            else:
                raise SystemExit(f"unknown workload {w}")
            out["results"].append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
            save()
    save()
    print(json.dumps(out, indent=1))
    for r in out["results"]:
        print(f"{r['workload']}: {r['bytes_in']/1e9:.2f} GB in, {r['tensors']} tensors, {r['buckets']} buckets: "
              f"refit {r['wall_ms']:.1f} ms ({r['gbps']:.1f} GB/s per daemon); raw NCCL {r['nccl_raw']['mode']} "
              f"{r['nccl_raw']['ms']:.1f} ms "
              f"-> ratio {r['ratio_nccl_over_refit']:.3f}"
              + (f"; torch bcast+quantize {r['baseline_torch_bcast_fp8_ms']:.1f} ms -> "
                 f"{r['ratio_baseline_over_refit']:.2f}x" if "ratio_baseline_over_refit" in r else ""),
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
