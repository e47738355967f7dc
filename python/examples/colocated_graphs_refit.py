#!/usr/bin/env python3
"""Colocated RL on one GPU with a CUDA-graph engine: refits over CUDA IPC into the weights the
captured graphs read, checked against the offline conversion, with the engine asleep between
rollouts.

Three processes share GPU 0:
  refitd   `staging: device`, `data_plane: cuda_ipc` on GPU 0, deploy/models/demo-llama.yaml (the
           FP8 block-128 rules of llama3_fp8.yaml: q/k/v/o/gate/up/down projections, BF16 rest);
  trainer  a child process: the BF16 transformers Llama (seeded) on GPU 0; each policy is one
           training-like change (a normalized gradient step, or seeded noise); pushes
           named_parameters() as CUDA tensors (refit.TrainerClient; buckets over CUDA IPC);
  engine   this process: the FP8 engine of llama_fp8 over refitd-registered CUDA memory
           (graph_engine.register_engine_params), its decode step captured ONCE in CUDA graphs
           (graph_engine.GraphEngine, batch sizes 2 and 1), its KV pool in CUDA virtual memory.

The loop, --policies times: trainer step and push (engine asleep: refitd validates the refit
and stages it) -> engine wakes (weights and KV pool mapped again at the same addresses; the
agent's wake makes refitd map the weights and commit the staged refit into them over CUDA IPC)
-> rollout (greedy, by replaying the same graphs, inside GatedEngine.serving()) -> engine sleeps
(refitd drops its mappings; the weights' and the KV pool's physical memory are released, torch's
cache emptied). The weights live in one CUDA virtual-memory buffer shareable as a POSIX file
descriptor (graph_engine.VmmWeights, registered in place); --keep-weights keeps them in an
ordinary allocation, resident while asleep. After each refit the trainer's weights are
converted with `refitctl convert`; a second engine built from scratch over that checkpoint
(same classes, its own captured graphs) generates the same prompts. Checked per policy: the
engine's registered bytes equal the checkpoint's, token ids and every generated step's logits
are equal (tolerance 0), the logits changed from the previous policy, the graphs are the same
objects (no capture since the first) and every parameter and buffer keeps its data_ptr. The
engine's device memory awake and asleep is measured each time. Prints one JSON summary; exits 1
on any mismatch.

  python3 python/examples/colocated_graphs_refit.py --build build [--policies 3] [--out F]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "python"))

from channel import Channel, ChannelClosed, serve  # noqa: E402
from graph_engine import VmmWeights  # noqa: E402

DEFAULT_SPEC = ROOT / "deploy/models/demo-llama.yaml"
CHANGES = ["gradient", "noise"]  # policy k >= 1 applies CHANGES[(k - 1) % 2]
MiB = 1 << 20


# ---- Trainer process ----------------------------------------------------------------------


def trainer_main(a) -> int:
    from gpu_llama_refit import TrainerRole

    channel = Channel(a.rx, a.tx)
    try:
        role = TrainerRole(a)
    except Exception as e:
        import traceback

        traceback.print_exc()
        channel.send({"ok": False, "error": f"{type(e).__name__}: {e}"})
        return 2

    def train(req):
        step = req["step"]
        change = CHANGES[(step - 1) % len(CHANGES)]
        loss = role.gradient_step(step) if change == "gradient" else role.noise(step)
        role._sync()
        return {"change": change, "loss": loss}

    def push(req):
        import refit.hf

        named = refit.hf.named_weights(role.model)
        role._sync()
        t0 = time.monotonic()
        with role.client.session(role.model_name, named) as s:
            s.push_all(named)
            t1 = time.monotonic()
            report = s.commit()
        t2 = time.monotonic()
        from safetensors.torch import save_file

        save_file({n: t.to("cpu").contiguous() for n, t in named}, req["checkpoint"])
        return {"push_ms": (t1 - t0) * 1e3, "commit_ms": (t2 - t1) * 1e3, "wall_ms": (t2 - t0) * 1e3,
                "host_staged": bool(s._stage_cuda_on_host),
                "report": {"version": report.version, "outcome": report.outcome, "reason": report.reason,
                           "bytes_in": report.bytes_in, "bytes_out": report.bytes_out, "buckets": report.buckets,
                           "tensors": report.tensors, "times_ms": report.times_ms}}

    channel.send({"ok": True, "params": sum(1 for _ in role.model.parameters())})
    try:
        serve(channel, {"train": train, "push": push})
    finally:
        role.close()
    return 0


class Child:
    def __init__(self, args: list, log: Path, env: dict):
        to_r, to_w = os.pipe()
        from_r, from_w = os.pipe()
        self.log = log
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--role", "trainer",
                                      "--rx", str(to_r), "--tx", str(from_w), *args], pass_fds=(to_r, from_w),
                                     stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
        os.close(to_r)
        os.close(from_w)
        self.channel = Channel(from_r, to_w)

    def tail(self, n=4000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def hello(self):
        try:
            reply = self.channel.recv()
        except ChannelClosed:
            raise RuntimeError(f"trainer exited: {self.tail()}") from None
        if not reply.get("ok"):
            raise RuntimeError(f"trainer failed to start: {reply.get('error')}\n{self.tail()}")
        return reply

    def call(self, op, **fields):
        try:
            return self.channel.call(op, **fields)
        except ChannelClosed:
            raise RuntimeError(f"trainer exited during '{op}': {self.tail()}") from None

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.channel.call("quit")
            except Exception:
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.channel.close()


# ---- refitd -------------------------------------------------------------------------------


def start_refitd(a, tmp: Path, env: dict):
    sock = tmp / "refitd.sock"
    cfg = tmp / "refitd.yaml"
    text = (f"listen: unix:{sock}\nmodel_spec: {a.spec}\nadmin: {{listen: ''}}\n"
            f"limits:\n  bucket_bytes: {a.bucket_bytes}\n  session_deadline_ms: 600000\n")
    if a.engine_device != "cpu":
        text += "staging: device\ndata_plane:\n  transport: cuda_ipc\n  device: 0\n"
    cfg.write_text(text)
    log = tmp / "refitd.log"
    proc = subprocess.Popen([str(a.build / "src/server/refitd"), "--config", str(cfg)], stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 60
    while not sock.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not sock.exists():
        proc.kill()
        raise RuntimeError(f"refitd did not listen: {log.read_text(errors='replace')[-3000:]}")
    return proc, f"unix:{sock}", log


# ---- Engine (this process) ----------------------------------------------------------------


def prompts(vocab: int, batch: int, length: int) -> list:
    rng = random.Random(1234)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(batch)]


def build_engine(a, tensors, kv_pool_bytes: int, vmm: bool):
    """(GraphEngine over an FP8 llama_fp8 model whose tensors are `tensors`, graphs captured)."""
    import llama_fp8 as L
    from graph_engine import GraphEngine

    model = L.fp8_engine_model(L.build_bf16(a.size, a.seed).to(a.engine_device), tensors)
    engine = GraphEngine(model, max_len=a.prompt_len + a.tokens, batch_sizes=(2, 1), kv_pool_bytes=kv_pool_bytes,
                         vmm=vmm)
    if engine.device.type == "cuda":
        engine.capture()
    return engine


def bytes_of(t):
    import torch

    return t.detach().reshape(-1).view(torch.uint8)


def memory(engine, store=None) -> dict:
    """The engine's device memory: torch's reserved memory, the mapped KV pool and the mapped
    weights (VmmWeights), their total, and the device's used memory (refitd's included)."""
    import torch

    out = engine.resident_bytes()
    weights = store.nbytes if isinstance(store, VmmWeights) and store.mapped else 0
    out = dict(out, weights_mapped=weights, total=out["total"] + weights)
    if engine.device.type != "cuda":
        return dict(out, device_used=0)
    free, total = torch.cuda.mem_get_info(0)
    return dict(out, device_used=int(total - free))


def sleep(engine, gated, store):
    """refitd drops its mappings (agent sleep), then the engine releases the KV pool and, when
    they are VmmWeights, the weights."""
    gated.sleep()
    engine.sleep()
    if isinstance(store, VmmWeights):
        store.release()


def wake(engine, gated, store) -> bool:
    """Weights and KV pool mapped again at the same addresses, then the agent's wake: refitd maps
    them and commits the refit staged while asleep (returned: whether one was committed)."""
    if isinstance(store, VmmWeights):
        store.map()
    engine.wake()
    return gated.wake()


def drive(a) -> int:
    import torch

    import llama_fp8 as L
    import refit
    from gpu_llama_refit import convert, spec_model_name
    from graph_engine import register_engine_params

    a.build = a.build.resolve()
    a.spec = Path(a.spec).resolve()
    tmp = Path(a.workdir).resolve() if a.workdir else Path(tempfile.mkdtemp(prefix="refit-graphs-"))
    tmp.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT / "python"), env.get("PYTHONPATH", "")])
    lib = a.build / "src/client/librefit_client.so"
    if lib.exists():
        env.setdefault("REFIT_CLIENT_LIB", str(lib))
        os.environ.setdefault("REFIT_CLIENT_LIB", str(lib))
    cuda = a.engine_device != "cpu"
    if cuda:
        torch.cuda.set_device(0)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    summary = {"model": spec_model_name(a.spec), "spec": str(a.spec), "size": a.size, "tokens": a.tokens,
               "prompt_len": a.prompt_len, "kv_pool_bytes": a.kv_pool_mib * MiB, "workdir": str(tmp),
               "device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__, "policies": []}
    daemon = trainer = gated = store = None
    ok = False
    try:
        import transformers

        summary["transformers"] = transformers.__version__
        daemon, address, daemon_log = start_refitd(a, tmp, env)
        # The engine: registered weights first, then the graphs over them.
        bf16 = L.build_bf16(a.size, a.seed)
        table = L.engine_table(bf16)
        release = cuda and a.release_weights
        try:
            store, params, views = register_engine_params(L.initial_tensors(bf16, table), torch.device(a.engine_device),
                                                          L.registered_dtypes(table), release_weights=release)
        except RuntimeError as e:  # no shareable CUDA virtual memory here: weights stay resident
            summary["weights_vmm_error"] = f"{type(e).__name__}: {e}"
            store, params, views = register_engine_params(L.initial_tensors(bf16, table), torch.device(a.engine_device),
                                                          L.registered_dtypes(table))
        summary["weights_released_while_asleep"] = isinstance(store, VmmWeights)
        del bf16
        before = int(torch.cuda.memory_reserved(0)) if cuda else 0
        engine = build_engine(a, views, a.kv_pool_mib * MiB, vmm=True)
        summary["engine"] = {"params": len(params), "weight_bytes": sum(p.nbytes for p in params),
                             "kv_cache_bytes": engine.cache_bytes, "kv_pool_bytes": engine.kv.nbytes,
                             "kv_pool_vmm": engine.kv_is_vmm, "kv_vmm_error": engine.kv_error,
                             "graphs": sorted(engine.graphs), "torch_reserved_by_model_and_graphs":
                                 (int(torch.cuda.memory_reserved(0)) if cuda else 0) - before}
        graph_ids = {b: id(g) for b, g in engine.graphs.items()}
        graph_objects = dict(engine.graphs)
        ptrs = engine.tensor_ptrs()
        view_ptrs = {n: t.data_ptr() for n, t in views.items()}
        gated = refit.GatedEngine(address, params)
        trainer = Child(["--address", address, "--device", a.engine_device, "--seed", "42", "--size", a.size,
                         "--model", summary["model"]], tmp / "trainer.log", env)
        summary["trainer"] = trainer.hello()
        prompt2 = prompts(L.SIZES[a.size]["vocab_size"], 2, a.prompt_len)
        awake = memory(engine, store)
        sleep(engine, gated, store)
        asleep = memory(engine, store)
        summary["memory_before_loop"] = {"awake": awake, "asleep": asleep}
        previous = None
        for k in range(1, a.policies + 1):
            row = {"policy": k}
            row.update(trainer.call("train", step=k))                 # trainer step, engine asleep
            ckpt = tmp / f"policy-{k}.safetensors"
            pushed = trainer.call("push", checkpoint=str(ckpt))        # refit over CUDA IPC: staged
            row.update(pushed)
            t0 = time.monotonic()
            row["wake_committed"] = wake(engine, gated, store)         # mapped again; staged refit commits
            row["wake_ms"] = (time.monotonic() - t0) * 1e3
            row["memory_awake"] = memory(engine, store)
            version = gated.version
            t0 = time.monotonic()
            with gated.serving(timeout=120):                           # rollout: the same graphs
                row["engine_version"] = gated.version
                ids2, logits2 = engine.generate(prompt2, a.tokens)
                ids1, logits1 = engine.generate(prompt2[:1], a.tokens)
                loaded = L.load_checkpoint(convert(a, ckpt, tmp / f"converted-{k}"), table, a.engine_device)
                mismatched = [n for n, _, _ in table if not torch.equal(bytes_of(views[n]), bytes_of(loaded[n]))]
            row["rollout_and_convert_ms"] = (time.monotonic() - t0) * 1e3
            reference = build_engine(a, loaded, 0, vmm=False)         # from scratch, its own graphs
            ref_ids2, ref_logits2 = reference.generate(prompt2, a.tokens)
            ref_ids1, ref_logits1 = reference.generate(prompt2[:1], a.tokens)
            del reference, loaded
            gc.collect()  # the reference's graphs and their pool go before the engine sleeps
            row.update({
                "outcome": pushed["report"]["outcome"], "version": version,
                "engine_bytes_equal_reference": not mismatched, "mismatched": mismatched[:10],
                "tokens_equal": bool(torch.equal(ids2, ref_ids2) and torch.equal(ids1, ref_ids1)),
                "max_logit_diff": float(max((logits2 - ref_logits2).abs().max(), (logits1 - ref_logits1).abs().max())),
                "logits_equal": bool(torch.equal(logits2, ref_logits2) and torch.equal(logits1, ref_logits1)),
                "logits_changed_vs_previous": None if previous is None else bool(not torch.equal(previous, logits2)),
                "finite": bool(torch.isfinite(logits2).all()),
                "ids": ids2.tolist(),
                "same_graphs": ({b: id(g) for b, g in engine.graphs.items()} == graph_ids
                                and all(engine.graphs[b] is graph_objects[b] for b in graph_objects)),
                "captures": engine.captures,
                "same_data_ptrs": engine.tensor_ptrs() == ptrs
                and all(views[n].data_ptr() == p for n, p in view_ptrs.items()),
            })
            previous = logits2
            sleep(engine, gated, store)                                # release, measure
            row["memory_asleep"] = memory(engine, store)
            row["released_bytes"] = row["memory_awake"]["total"] - row["memory_asleep"]["total"]
            row["device_released_bytes"] = row["memory_awake"]["device_used"] - row["memory_asleep"]["device_used"]
            row["ok"] = bool(row["outcome"] == "staged" and row["wake_committed"] and version == k
                             and row["engine_version"] == version
                             and row["engine_bytes_equal_reference"] and row["tokens_equal"] and row["logits_equal"]
                             and row["logits_changed_vs_previous"] is not False and row["finite"]
                             and row["same_graphs"] and row["captures"] == len(graph_ids) and row["same_data_ptrs"]
                             and not (cuda and pushed["host_staged"]))
            summary["policies"].append(row)
            print(f"policy {k} ({row['change']}): version {version} refit {pushed['wall_ms']:.1f} ms, "
                  f"tokens_equal={row['tokens_equal']} logits_equal={row['logits_equal']} "
                  f"same_graphs={row['same_graphs']} engine memory awake "
                  f"{row['memory_awake']['total'] / MiB:.0f} MiB asleep {row['memory_asleep']['total'] / MiB:.0f} MiB",
                  file=sys.stderr)
        log = daemon_log.read_text(errors="replace")
        summary["data_plane_cuda_ipc"] = "data=cuda_ipc:" in log
        summary["data_plane"] = "cuda_ipc" if summary["data_plane_cuda_ipc"] else "host"
        summary["dirty"] = gated.dirty
        ok = (len(summary["policies"]) == a.policies and all(r["ok"] for r in summary["policies"])
              and summary["data_plane_cuda_ipc"] == cuda and not gated.dirty)
    except Exception as e:
        import traceback

        traceback.print_exc()
        summary["error"] = f"{type(e).__name__}: {e}"
    finally:
        if trainer is not None:
            trainer.stop()
        if gated is not None:
            gated.close()
        if store is not None and hasattr(store, "close"):
            store.close()
        if daemon is not None and daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
    summary["ok"] = ok
    if not ok:
        for name in ("refitd.log", "trainer.log"):
            path = tmp / name
            if path.exists():
                print(f"---- {path} (tail)\n{path.read_text(errors='replace')[-3000:]}", file=sys.stderr)
    for r in summary["policies"]:
        r["ids"] = [" ".join(map(str, s)) for s in r["ids"]]
    text = json.dumps(summary, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    if ok and not a.workdir:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", type=Path, default=ROOT / "build", help="build tree with refitd and refitctl")
    ap.add_argument("--spec", default=str(DEFAULT_SPEC), help="model spec (default deploy/models/demo-llama.yaml)")
    ap.add_argument("--size", default="small", choices=["small", "tiny"])
    ap.add_argument("--policies", type=int, default=3, help="trainer steps, each refitted and checked")
    ap.add_argument("--tokens", type=int, default=16, help="greedy tokens generated per rollout")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--kv-pool-mib", type=int, default=1024, help="the engine's KV pool (released while asleep)")
    ap.add_argument("--keep-weights", dest="release_weights", action="store_false",
                    help="keep the weights resident while asleep (default: released, in shareable CUDA virtual memory)")
    ap.add_argument("--bucket-bytes", type=int, default=128 << 20, help="refitd bucket size (must hold the largest tensor)")
    ap.add_argument("--engine-device", default="cuda:0", choices=["cuda:0", "cpu"],
                    help="cpu: the same flow on the host (shm engine, UCX, no graphs) for machines without a GPU")
    ap.add_argument("--workdir", help="keep checkpoints and logs here (default: a temp dir, removed on success)")
    ap.add_argument("--out", help="also write the JSON summary here")
    ap.add_argument("--role", choices=["trainer"], help=argparse.SUPPRESS)
    ap.add_argument("--rx", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--tx", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--address", help=argparse.SUPPRESS)
    ap.add_argument("--device", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=7, help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.role:
        return trainer_main(a)
    return drive(a)


if __name__ == "__main__":
    sys.exit(main())
