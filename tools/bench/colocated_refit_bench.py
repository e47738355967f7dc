#!/usr/bin/env python3
"""Colocated FP8 refit on one GPU over CUDA IPC, against its bound and against the PyTorch loop a
colocated user writes today, measured in one run.

  refitd    tools/bench/nccl_refit_bench.py's workload with --transport cuda_ipc: the example
            trainer, refitd (`staging: device`, --slots ring slots, 2) and an idle example engine (CUDA IPC
            registration) on GPU 0; Llama-3-8B shapes (16.06 GB BF16, 291 tensors) under the
            shipped spec deploy/models/llama3_fp8.yaml as one engine on one GPU (its
            tensor_parallel set to size 1: the engine holds the whole model), i.e. FP8 block-128
            projections into the engine layout SGLang and vLLM hold (fused qkv_proj and
            gate_up_proj), BF16 rest (--spec another file; --spec demo: the embedded demo spec,
            unfused); --refits refits, steady state = all but the first. Wall = the trainer's
            Begin -> commit reply; pause = refitd's engine pause window. Ten runs (see `runs`):
            the trainer packing its weights into bucket buffers (Push) or pushing them from its
            one weight allocation, kept across refits as a trainer keeps its parameters
            (PushInPlace, example_trainer --in-place); `staging: device` or `staging: direct`
            (converted straight into the engine's memory, the engine paused for the whole refit);
            the engine's weights in one cudaMalloc registered by CUDA IPC handle, or in CUDA
            virtual memory registered in place (example_engine --vmm, as vLLM's sleep mode and
            SGLang's memory saver allocate them); the trainer's weights in one cudaMalloc (sent
            by CUDA IPC handle) or in CUDA virtual memory (example_trainer --vmm, as PyTorch's
            expandable segments allocate them: sent as POSIX descriptors, read faster; a run maps
            it in 20 MiB pieces, as expandable segments grow); the trainer beginning 5 ms before
            its weights are ready (`_ahead`); the colocated loop, the engine asleep between
            refits (`_wake`).
  bound     read the BF16 bytes once and write the engine's bytes once at the device's copy rate:
            (bytes_in + bytes_out) / (2 x copy rate), the copy rate measured here as one
            device-to-device copy of `--copy-gib` GiB (payload bytes per second: each is read once
            and written once).
  baseline  two processes on GPU 0: a "trainer" holding the same BF16 tensors sends one CUDA IPC
            handle per tensor (torch.multiprocessing.reductions.reduce_tensor, as colocated RL
            frameworks serialize them), the "engine" rebuilds each tensor from its handle,
            quantizes the projections with torch ops (fp8_block_quant of the --baseline file,
            shared/bench/gpu_baseline.py) and copies into its preallocated FP8 weights and float32
            scales (BF16 copy for the rest), synchronizes and drops the handles. Wall = trainer
            sync -> engine done (CLOCK_MONOTONIC across both processes); one warm-up, median of
            --refits.
  wake      vmm_both_direct_wake runs the colocated loop: trainer step, engine wakes, refit, rollout,
            engine sleeps (its weights' memory given back: freed_bytes_asleep, per sleep).
  copy      a plain device-to-device copy of bytes_out (the engine's bytes) in one cudaMemcpy,
            against refitd's pause (goal: pause <= copy + 1 ms).
  moe       --workload moe: Qwen3-30B-A3B shapes (hidden 2048, 32 heads of 128, 4 key/value
            groups, 128 experts of 768, vocabulary 151936; --moe-layers of its 48 layers, as many
            as fit the card) under the shipped deploy/models/qwen3_moe_nvfp4.yaml, its sizes from a
            config.json of that model written here (given to refitd, engine and trainer): every
            expert's gate/up fused and stacked into w13_weight, down stacked into w2_weight, NVFP4
            with swizzled scales; the rest BF16 (q/k/v fused). The PyTorch baseline then quantizes
            each expert projection with gpu_baseline.py's nvfp4_quant into per-expert weights
            (no fusion, stacking or swizzle: less work than refitd does) and copies the rest.

  python3 tools/bench/colocated_refit_bench.py --build build --baseline shared/bench/gpu_baseline.py \
      [--refits 3] [--out FILE]

Prints one JSON document (and a summary on stderr).
"""
import argparse
import importlib.util
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def load_module(path):
    spec = importlib.util.spec_from_file_location("gpu_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed(fn, iters, warm=1):
    import torch

    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_rates(copy_bytes: int, engine_bytes: int) -> dict:
    import torch

    a = torch.empty(copy_bytes, dtype=torch.uint8, device="cuda:0")
    b = torch.empty_like(a)
    big_ms = timed(lambda: b.copy_(a), 5)
    del a, b
    a = torch.empty(engine_bytes, dtype=torch.uint8, device="cuda:0")
    b = torch.empty_like(a)
    engine_ms = timed(lambda: b.copy_(a), 5)
    del a, b
    torch.cuda.empty_cache()
    return {"copy_bytes": copy_bytes, "copy_ms": big_ms, "copy_gbps": copy_bytes / big_ms / 1e6,
            "engine_bytes_copy_ms": engine_ms}


# ---- The PyTorch baseline -----------------------------------------------------------------


# Qwen3-30B-A3B's sizes (its config.json); --moe-layers picks how many of its 48 layers.
QWEN3_30B_A3B = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
                 "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
                 "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                 "intermediate_size": 6144, "num_hidden_layers": 48, "rms_norm_eps": 1e-6,
                 "tie_word_embeddings": False}


def moe_shapes(layers: int):
    c = QWEN3_30B_A3B
    H, E, I, V = c["hidden_size"], c["num_experts"], c["moe_intermediate_size"], c["vocab_size"]
    Q, KV, D = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"], c["head_dim"]
    shapes = [("embed", (V, H))]
    for l in range(layers):
        shapes += [(f"l{l}.q", (Q, H)), (f"l{l}.k", (KV, H)), (f"l{l}.v", (KV, H)), (f"l{l}.o", (H, Q)),
                   (f"l{l}.q_norm", (D,)), (f"l{l}.k_norm", (D,)), (f"l{l}.router", (E, H)),
                   (f"l{l}.in_norm", (H,)), (f"l{l}.post_norm", (H,))]
        for e in range(E):
            shapes += [(f"l{l}.experts.{e}.gate", (I, H)), (f"l{l}.experts.{e}.up", (I, H)),
                       (f"l{l}.experts.{e}.down", (H, I))]
    shapes += [("norm", (H,)), ("lm_head", (V, H))]
    return shapes


def baseline_shapes(base, workload: str, layers: int):
    return base.llama8b_shapes() if workload == "llama8b" else moe_shapes(layers)


def baseline_engine(baseline_path: str, rx: int, tx: int, workload: str = "llama8b", layers: int = 0) -> int:
    """Receives per-tensor handles, quantizes and copies into its weights, replies when done."""
    import torch
    from torch.multiprocessing import reductions  # noqa: F401 (registers the CUDA rebuild functions)

    base = load_module(baseline_path)
    torch.cuda.set_device(0)
    shapes = baseline_shapes(base, workload, layers)
    weights = {}
    for name, s in shapes:
        if workload == "moe" and ".experts." in name:
            weights[name] = (torch.empty((s[0], s[1] // 2), dtype=torch.uint8, device="cuda:0"),
                             torch.empty((s[0], s[1] // 16), dtype=torch.float8_e4m3fn, device="cuda:0"),
                             torch.empty((), dtype=torch.float32, device="cuda:0"))
        elif workload == "llama8b" and len(s) == 2 and not name.startswith(("embed", "lm_head")):
            weights[name] = (torch.empty(s, dtype=torch.float8_e4m3fn, device="cuda:0"),
                             torch.empty(((s[0] + 127) // 128, (s[1] + 127) // 128), dtype=torch.float32,
                                         device="cuda:0"))
        else:
            weights[name] = (torch.empty(s, dtype=torch.bfloat16, device="cuda:0"),)
    engine_bytes = sum(t.numel() * t.element_size() for ts in weights.values() for t in ts)
    rfile, wfile = os.fdopen(rx, "rb"), os.fdopen(tx, "wb")
    pickle.dump({"engine_bytes": engine_bytes}, wfile)
    wfile.flush()
    while True:
        try:
            msg = pickle.load(rfile)
        except EOFError:
            return 0
        if msg is None:
            return 0
        with torch.no_grad():
            for name, (rebuild, args) in msg:
                src = rebuild(*args)  # opens (or finds) the trainer's allocation
                dst = weights[name]
                if len(dst) == 3:
                    q, scale, gscale = base.nvfp4_quant(src)
                    dst[0].copy_(q)
                    dst[1].copy_(scale)
                    dst[2].copy_(gscale)
                elif len(dst) == 2:
                    q, scale = base.fp8_block_quant(src)
                    dst[0].copy_(q)
                    dst[1].copy_(scale)
                else:
                    dst[0].copy_(src)
                del src
        torch.cuda.synchronize()
        done = time.monotonic()
        del msg
        pickle.dump({"done": done}, wfile)
        wfile.flush()


def baseline(baseline_path: str, refits: int, workload: str = "llama8b", layers: int = 0) -> dict:
    import torch
    from torch.multiprocessing.reductions import reduce_tensor

    base = load_module(baseline_path)
    torch.cuda.set_device(0)
    shapes = baseline_shapes(base, workload, layers)
    g = torch.Generator(device="cuda:0").manual_seed(0)
    tensors = [(name, torch.randn(s, dtype=torch.bfloat16, device="cuda:0", generator=g)) for name, s in shapes]
    bytes_in = sum(t.numel() * t.element_size() for _, t in tensors)
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--baseline-engine", baseline_path,
                             "--rx", str(to_r), "--tx", str(from_w), "--workload", workload,
                             "--moe-layers", str(layers)], pass_fds=(to_r, from_w))
    os.close(to_r)
    os.close(from_w)
    wfile, rfile = os.fdopen(to_w, "wb"), os.fdopen(from_r, "rb")
    try:
        hello = pickle.load(rfile)
        walls = []
        for k in range(refits + 1):
            torch.cuda.synchronize()
            t0 = time.monotonic()
            pickle.dump([(name, reduce_tensor(t)) for name, t in tensors], wfile)
            wfile.flush()
            reply = pickle.load(rfile)
            if k > 0:
                walls.append((reply["done"] - t0) * 1e3)
        pickle.dump(None, wfile)
        wfile.flush()
    finally:
        wfile.close()
        proc.wait(timeout=120)
    del tensors
    torch.cuda.empty_cache()
    return {"bytes_in": bytes_in, "engine_bytes": hello["engine_bytes"], "walls_ms": walls,
            "wall_ms": statistics.median(walls)}


# ---- Driver -------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--baseline", required=False, default="", help="shared/bench/gpu_baseline.py (its fp8_block_quant)")
    ap.add_argument("--refits", type=int, default=3)
    ap.add_argument("--bucket-bytes", type=int, default=1200 << 20)
    ap.add_argument("--copy-gib", type=int, default=4)
    ap.add_argument("--slots", type=int, default=2, help="refitd's bucket ring slots (limits.bucket_slots)")
    ap.add_argument("--runs", default="", help="comma-separated run labels to do (default: all)")
    ap.add_argument("--spec", default=str(HERE.parent.parent / "deploy/models/llama3_fp8.yaml"),
                    help="model spec (its tensor_parallel is set to size 1); 'demo' for the embedded demo spec")
    ap.add_argument("--engine-tps", default="1",
                    help="comma-separated engine tensor-parallel sizes: each run is repeated for an engine of that "
                         "many rank processes, all on GPU 0 (labels _tpN for N > 1; e.g. 1,4); with --workload moe "
                         "the experts are split too (expert_parallel of the same size: TP=N x EP=N)")
    ap.add_argument("--workload", choices=["llama8b", "moe"], default="llama8b",
                    help="llama8b (Llama-3-8B shapes, --spec), or moe (Qwen3-30B-A3B shapes under the shipped "
                         "qwen3_moe_nvfp4.yaml, --moe-layers of its 48 layers)")
    ap.add_argument("--moe-layers", type=int, default=48)
    ap.add_argument("--out", default="")
    ap.add_argument("--baseline-engine", help=argparse.SUPPRESS)
    ap.add_argument("--rx", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--tx", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.baseline_engine:
        return baseline_engine(a.baseline_engine, a.rx, a.tx, a.workload, a.moe_layers)
    import nccl_refit_bench as nb

    build = Path(a.build).resolve()
    tmp = Path(tempfile.mkdtemp(prefix="refit-colocated-"))
    out = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "bucket_bytes": a.bucket_bytes}

    def save():
        if a.out:
            Path(a.out).write_text(json.dumps(out, indent=1))

    tps = [int(x) for x in a.engine_tps.split(",")]
    specs = {tp: "" for tp in tps}
    shape, model_config = nb.LLAMA8B, ""
    out["workload"] = a.workload
    if a.workload == "moe":
        if a.spec.endswith("llama3_fp8.yaml"):
            a.spec = str(HERE.parent.parent / "deploy/models/qwen3_moe_nvfp4.yaml")
        config = dict(QWEN3_30B_A3B, num_hidden_layers=a.moe_layers)
        model_config = str(tmp / "config.json")
        Path(model_config).write_text(json.dumps(config))
        shape = nb.moe_shape(a.moe_layers)
        out["moe_layers"] = a.moe_layers
    if a.spec != "demo":
        # The shipped spec with the engine's tensor_parallel size: 1, one engine process holding the
        # whole model; N, N engine rank processes sharing GPU 0, each holding its part.
        import re

        for tp in tps:
            text = re.sub(r"^(tensor|expert)_parallel:.*\n", "", Path(a.spec).read_text(), flags=re.M)
            text += f"tensor_parallel: {{size: {tp}}}\n"
            if a.workload == "moe" and tp > 1:
                # TP=N x EP=N: attention split by heads, each rank holding 128/N whole experts.
                text += f"expert_parallel: {{size: {tp}}}\n"
            spec_path = tmp / f"spec.tp{tp}.yaml"
            spec_path.write_text(text)
            specs[tp] = str(spec_path)
        out["spec"] = a.spec
    elif tps != [1]:
        raise SystemExit("--engine-tps needs a spec (not demo)")

    def refitd_run(in_place, staging="device", engine_args=(), trainer_args=(), tp=1):
        r = nb.run_workload(build, a.workload, shape, specs[tp], a.refits, a.bucket_bytes, tmp, slots=a.slots,
                            transport="cuda_ipc", in_place=in_place, staging=staging, engine_args=engine_args,
                            trainer_args=trainer_args, engine_ranks=tp, model_config=model_config)
        steady = r["refits"][1:] if len(r["refits"]) > 1 else r["refits"]
        return r, {"wall_ms": r["wall_ms"], "walls_ms": [x["push_commit_ms"] for x in r["refits"]],
                   # From the weights ready to the commit's answer (differs from wall_ms with
                   # --begin-ahead-ms: the trainer began that long before).
                   "ready_wall_ms": statistics.median(x.get("ready_commit_ms", x["push_commit_ms"]) for x in steady),
                   "pause_ms": statistics.median(x["pause_ms"] for x in steady),
                   "pauses_ms": [x["pause_ms"] for x in r["refits"]],
                   "phases_ms": {k: statistics.median(x[k] for x in steady)
                                 for k in ("receive_ms", "convert_ms", "validate_ms", "commit_ms", "prepare_ms")},
                   "bytes_in": r["bytes_in"], "bytes_out": r["bytes_out"], "tensors": r["tensors"],
                   "bytes_in_place": r["refits"][-1].get("bytes_in_place", 0),
                   "buckets": r["buckets"], "raw_cuda_ipc": r["nccl_raw"],
                   # Every timing field of the trainer's reports (refitd's phases and the trainer's
                   # own timeline: trainer_begin_ms, trainer_push_ms, trainer_commit_ms).
                   "steady_medians_ms": {k: statistics.median(x[k] for x in steady) for k in steady[0]
                                         if k.endswith("_ms") and isinstance(steady[0][k], (int, float))}}

    # The runs, each a fresh refitd + engine: the trainer packing its tensors into two bucket
    # buffers (Push), or pushing them from where they lie in its one weight allocation (PushInPlace:
    # refitd's converter reads them there); staging: device (converted into staging, copied into
    # the engine in the pause), or staging: direct (converted into the engine's memory, the engine
    # paused for the whole refit); the engine's weights in one cudaMalloc registered by CUDA IPC
    # handle, or in CUDA virtual memory registered in place (--vmm: as vLLM's sleep mode and
    # SGLang's memory saver allocate them).
    # The last three: the trainer's weights in CUDA virtual memory too (example_trainer --vmm, as
    # PyTorch's expandable segments allocate them), sent as descriptors and imported by refitd;
    # the last maps them in 20 MiB pieces, as expandable segments do.
    runs = [("refitd", False, "device", (), ()), ("refitd_in_place", True, "device", (), ()),
            ("refitd_direct", True, "direct", (), ()), ("vmm_in_place", True, "device", ("--vmm",), ()),
            ("vmm_direct", True, "direct", ("--vmm",), ()),
            ("vmm_both_in_place", True, "device", ("--vmm",), ("--vmm",)),
            ("vmm_both_direct", True, "direct", ("--vmm",), ("--vmm",)),
            ("vmm_pieces_direct", True, "direct", ("--vmm",), ("--vmm", "--vmm-piece-mib", "20")),
            # As vmm_both_direct, the trainer beginning each refit 5 ms before its weights are
            # ready (while its optimizer step would run): refitd plans and pauses the engine
            # meanwhile; its ready_wall_ms counts from the weights ready.
            ("vmm_both_direct_ahead", True, "direct", ("--vmm",), ("--vmm", "--begin-ahead-ms", "5")),
            # As vmm_both_direct, in the colocated loop (example_engine and example_trainer
            # --sleep-wake): after each refit's rollout the engine sleeps, giving its weights'
            # memory back, while the trainer makes the next weights (its step, seconds); then the
            # trainer wakes the engine and begins once it is awake.
            ("vmm_both_direct_wake", True, "direct", ("--vmm", "--sleep-wake", "{loop}"),
             ("--vmm", "--sleep-wake", "{loop}"))]
    if a.runs:
        runs = [x for x in runs if x[0] in a.runs.split(",")]
    runs = [(label if tp == 1 else f"{label}_tp{tp}", in_place, staging, engine_args, trainer_args, tp)
            for tp in tps for label, in_place, staging, engine_args, trainer_args in runs]
    results = {}
    r = None
    for label, in_place, staging, engine_args, trainer_args, tp in runs:
        loop = tmp / f"{label}.loop"  # the sleep/wake run's FIFOs
        if "{loop}" in engine_args:
            os.mkfifo(f"{loop}.ctl")
            os.mkfifo(f"{loop}.ack")
        engine_args = tuple(str(loop) if x == "{loop}" else x for x in engine_args)
        trainer_args = tuple(str(loop) if x == "{loop}" else x for x in trainer_args)
        raw, results[label] = refitd_run(in_place, staging, engine_args, trainer_args, tp)
        results[label]["engine_tp"] = tp
        if "--sleep-wake" in engine_args:
            # The engine's memory given back at each sleep (its weights), from its log.
            events = [json.loads(l) for l in (tmp / f"{a.workload}.0.engine.log").read_text().splitlines() if l.startswith("{")]
            asleep = [e for e in events if e.get("event") == "asleep"]
            results[label]["sleeps"] = len(asleep)
            results[label]["freed_bytes_asleep"] = [e["freed_bytes"] for e in asleep]
        r = r or raw
        out[label] = results[label]
        print(json.dumps({label: results[label]}), file=sys.stderr, flush=True)
        save()
    import torch

    out["gpu"] = torch.cuda.get_device_name(0)
    out["torch"] = torch.__version__
    copy = copy_rates(a.copy_gib << 30, r["bytes_out"])
    out["copy"] = copy
    bound_ms = (r["bytes_in"] + r["bytes_out"]) / (2 * copy["copy_gbps"] * 1e6)
    out["bound"] = {"ms": bound_ms, "refit_fraction_of_bound": bound_ms / r["wall_ms"]}
    for label, x in results.items():
        out["bound"][f"{label}_fraction_of_bound"] = bound_ms / x["wall_ms"]
        out["bound"][f"{label}_ready_fraction_of_bound"] = bound_ms / x["ready_wall_ms"]
    out["pause_vs_copy"] = {label: {"pause_ms": x["pause_ms"], "copy_ms": copy["engine_bytes_copy_ms"],
                                    "pause_minus_copy_ms": x["pause_ms"] - copy["engine_bytes_copy_ms"]}
                            for label, x in results.items()}
    # An engine of N ranks against the one-process engine of the same bytes, run for run.
    out["tp_over_tp1"] = {label: x["wall_ms"] / results[label.rsplit("_tp", 1)[0]]["wall_ms"]
                          for label, x in results.items()
                          if x["engine_tp"] > 1 and label.rsplit("_tp", 1)[0] in results}
    save()
    if a.baseline:
        b = baseline(a.baseline, a.refits, a.workload, a.moe_layers)
        b["refitd_speedup"] = b["wall_ms"] / r["wall_ms"]
        for label, x in results.items():
            b[f"{label}_speedup"] = b["wall_ms"] / x["wall_ms"]
        b["fraction_of_bound"] = bound_ms / b["wall_ms"]
        out["baseline"] = b
        save()
    print(json.dumps(out, indent=1))
    what = "FP8" if a.workload == "llama8b" else f"Qwen3-30B-A3B NVFP4 ({a.moe_layers} layers)"
    print(f"colocated {what} refit, {r['tensors']} tensors, {r['bytes_in'] / 1e9:.2f} GB in, {r['bytes_out'] / 1e9:.2f} GB out; bound "
          f"{bound_ms:.2f} ms; one copy of the engine's bytes {copy['engine_bytes_copy_ms']:.2f} ms", file=sys.stderr)
    print(f"{'run':<16} {'wall ms':>8} {'of bound':>8} {'pause ms':>8} {'convert':>8} {'commit':>8} {'in place GB':>11}",
          file=sys.stderr)
    for label, x in results.items():
        print(f"{label:<16} {x['wall_ms']:>8.2f} {bound_ms / x['wall_ms']:>8.2f} {x['pause_ms']:>8.2f} "
              f"{x['phases_ms']['convert_ms']:>8.2f} {x['phases_ms']['commit_ms']:>8.2f} "
              f"{x['bytes_in_place'] / 1e9:>11.2f}", file=sys.stderr)
    if "baseline" in out:
        print(f"torch per-tensor IPC + quantize + copy: {out['baseline']['wall_ms']:.1f} ms "
              f"({out['baseline']['refitd_speedup']:.2f}x packed, "
              f"{max(out['baseline'][f'{l}_speedup'] for l in results):.2f}x best)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
