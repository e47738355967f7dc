#!/usr/bin/env python3
"""Refits of a real transformers Llama between two GPUs, checked against the offline conversion.

One command starts three processes and drives them:

  refitd   on GPU 1 (staging on the device, NCCL data plane), with deploy/models/demo-llama.yaml:
           q/k/v/o/gate/up/down projection weights -> FP8 block-128, everything else BF16;
  engine   on GPU 1: a LlamaForCausalLM whose projections are Fp8Linear layers over FP8 bytes and
           float32 block scales, all held in one CUDA allocation registered with refitd through
           CUDA IPC (refit.CudaParams + refit.GatedEngine: refitd's pause waits for running
           forwards and their kernels, so no forward ever reads weights mid-commit). A background
           thread keeps running forwards during refits and counts any that saw two versions;
  trainer  on GPU 0: the same architecture in BF16 (seeded); pushes named_parameters() (CUDA
           tensors) with refit.TrainerClient, refit 0 as initialized, then after each of
           --refits training-like changes (a normalized gradient step on random tokens, or seeded
           noise of 1% of each tensor's scale).

After every refit the trainer's weights are saved as safetensors and converted with
`refitctl convert --spec SPEC` (the offline converter); the engine process loads that checkpoint
into a second FP8 model on the same GPU (the reference) and both run the same greedy generation.
Checked per refit: the engine's registered bytes equal the converted checkpoint's, the generated
token ids are identical, the last logits differ by at most --logits-atol (default 0: same bytes,
same kernels, same GPU), and the logits changed from the previous version. Prints one JSON
summary; exits 1 on any mismatch.

  NCCL_NVLS_ENABLE=0 python3 python/examples/gpu_llama_refit.py --build build [--refits 3] [--out F]

`--engine-device cpu --trainer-device cpu --size tiny` runs the same flow on the host (shared
memory engine, UCX data plane) for machines without GPUs (tests/python/test_gpu_example.py).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "python"))

from channel import Channel, ChannelClosed, decode_f32, encode_f32, serve  # noqa: E402

DEFAULT_SPEC = ROOT / "deploy/models/demo-llama.yaml"
CHANGES = ["gradient", "noise"]  # refit k >= 1 applies CHANGES[(k - 1) % 2]


def spec_model_name(spec: Path) -> str:
    m = re.search(r"^model:\s*(\S+)\s*$", spec.read_text(), re.M)
    if not m:
        raise ValueError(f"{spec} names no model")
    return m.group(1)


def cuda_index(device: str):
    """1 for "cuda:1", None for "cpu"."""
    if device == "cpu":
        return None
    m = re.fullmatch(r"cuda:(\d+)", device)
    if not m:
        raise ValueError(f"device '{device}': use cpu or cuda:N")
    return int(m.group(1))


def prompt_ids(size: str, length: int) -> list:
    import random

    from llama_fp8 import SIZES

    rng = random.Random(1234)
    return [rng.randrange(SIZES[size]["vocab_size"]) for _ in range(length)]


# ---- Engine process -----------------------------------------------------------------------


def bytes_of(t):
    import torch

    return t.detach().reshape(-1).view(torch.uint8)


class EngineRole:
    def __init__(self, a):
        import torch

        import llama_fp8 as L
        import refit

        self.a, self.L, self.torch = a, L, torch
        self.device = torch.device(a.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
        bf16 = L.build_bf16(a.size, a.seed)
        self.table = L.engine_table(bf16)
        initial = L.initial_tensors(bf16, self.table)
        dtypes = L.registered_dtypes(self.table)
        if self.device.type == "cuda":
            self.store = refit.CudaParams.from_tensors(initial, self.device, dtypes=dtypes)
        else:
            self.store = refit.SharedParams.from_tensors(initial, dtypes=dtypes)
        self.model = L.fp8_engine_model(bf16.to(self.device), self.store.tensors)
        self.engine = refit.GatedEngine(a.address, self.store.params)
        self.reference = None
        self.prompt = prompt_ids(a.size, a.prompt_len)
        self.traffic = {"forwards": 0, "mixed": 0, "versions": []}
        self._first = {}
        self._stop = threading.Event()
        self._thread = None
        if a.traffic:
            self._thread = threading.Thread(target=self._traffic, daemon=True)
            self._thread.start()

    def hello(self) -> dict:
        nbytes = sum(p.nbytes for p in self.store.params)
        return {"event": "registered", "params": len(self.store.params), "bytes": nbytes,
                "version": self.engine.version}

    def _traffic(self):
        """Forwards on the prompt, each inside serving(): every forward of one version must give
        the same logits (a forward that read weights mid-commit would not)."""
        torch = self.torch
        ids = torch.tensor([self.prompt], dtype=torch.long, device=self.device)
        while not self._stop.is_set():
            with self.engine.serving(timeout=120):
                version = self.engine.version
                with torch.no_grad():
                    logits = self.model(ids).logits[0, -1]
                first = self._first.setdefault(version, logits)
                same = bool(torch.equal(first, logits))
            self.traffic["forwards"] += 1
            if version not in self.traffic["versions"]:
                self.traffic["versions"].append(version)
            if not same:
                self.traffic["mixed"] += 1
            time.sleep(0.001)

    def generate(self, req) -> dict:
        self.engine.wait_for_version(req["version"], timeout=120)
        t0 = time.monotonic()
        with self.engine.serving(timeout=120):
            version = self.engine.version
            ids, logits = self.L.greedy(self.model, req["prompt"], req["tokens"], self.device)
        return {"version": version, "ids": ids, "logits": encode_f32(logits.numpy()),
                "ms": (time.monotonic() - t0) * 1e3}

    def reference_run(self, req) -> dict:
        """Loads the converted checkpoint into the reference model (same class, same GPU, its own
        memory), compares its bytes with the engine's registered ones, and generates."""
        torch, L = self.torch, self.L
        loaded = L.load_checkpoint(req["checkpoint"], self.table, self.device)
        if self.reference is None:
            self.reference = L.fp8_engine_model(L.build_bf16(self.a.size, self.a.seed).to(self.device), loaded)
            self.reference_tensors = loaded
        else:
            with torch.no_grad():
                for name, t in loaded.items():
                    self.reference_tensors[name].copy_(t)
        with self.engine.serving(timeout=120):
            version = self.engine.version
            mismatched = [name for name, _, _ in self.table
                          if not torch.equal(bytes_of(self.store.tensors[name]), bytes_of(self.reference_tensors[name]))]
        ids, logits = L.greedy(self.reference, req["prompt"], req["tokens"], self.device)
        return {"engine_version": version, "ids": ids, "logits": encode_f32(logits.numpy()),
                "mismatched": mismatched, "compared": len(self.table)}

    def stats(self, _req) -> dict:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)
        return {"traffic": self.traffic, "dirty": self.engine.dirty, "version": self.engine.version}

    def close(self):
        self._stop.set()
        self.engine.close()
        if hasattr(self.store, "close"):
            self.store.close()


# ---- Trainer process ----------------------------------------------------------------------


class TrainerRole:
    def __init__(self, a):
        import torch

        import llama_fp8 as L
        import refit
        import refit.hf

        self.a, self.L, self.torch, self.refit = a, L, torch, refit
        self.device = torch.device(a.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # the client packs buckets on this thread's device
        torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
        self.model = L.build_bf16(a.size, a.seed, self.device)
        self.client = refit.TrainerClient(a.address)
        self.model_name = a.model

    def hello(self) -> dict:
        return {"event": "ready", "params": sum(1 for _ in self.model.parameters()),
                "bytes": sum(p.numel() * p.element_size() for p in self.model.parameters())}

    def _sync(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    @staticmethod
    def _scale(p):
        """The size of a tensor's entries: its std, or (norm weights, all 1.0) its mean |x|."""
        f = p.detach().float()
        return max(float(f.std()) if f.numel() > 1 else 0.0, float(f.abs().mean()))

    def gradient_step(self, step: int):
        """One normalized gradient step on random tokens: each tensor moves by 1% of its scale
        along -grad/rms(grad) (large enough to survive BF16 and FP8 rounding)."""
        torch = self.torch
        g = torch.Generator().manual_seed(1000 + step)
        vocab = self.model.config.vocab_size
        ids = torch.randint(0, vocab, (2, 32), generator=g).to(self.device)
        self.model.zero_grad(set_to_none=True)
        loss = self.model(ids, labels=ids).loss
        loss.backward()
        with torch.no_grad():
            for p in self.model.parameters():
                if p.grad is None:
                    continue
                grad = p.grad.float()
                rms = float(grad.pow(2).mean().sqrt())
                if rms > 0:
                    p.copy_((p.float() - 0.01 * self._scale(p) * grad / rms).to(p.dtype))
        self.model.zero_grad(set_to_none=True)
        return float(loss)

    def noise(self, step: int):
        torch = self.torch
        g = torch.Generator().manual_seed(2000 + step)
        with torch.no_grad():
            for _, p in self.model.named_parameters():
                n = torch.randn(tuple(p.shape), generator=g) * (0.01 * self._scale(p))
                p.copy_((p.float() + n.to(self.device)).to(p.dtype))
        return None

    def refit_step(self, req) -> dict:
        torch, refit = self.torch, self.refit
        step = req["step"]
        change, loss = "initial", None
        if step > 0:
            change = CHANGES[(step - 1) % len(CHANGES)]
            loss = self.gradient_step(step) if change == "gradient" else self.noise(step)
        named = refit.hf.named_weights(self.model)
        self._sync()
        t0 = time.monotonic()
        with self.client.session(self.model_name, named) as s:
            s.push_all(named)
            t1 = time.monotonic()
            report = s.commit()
        t2 = time.monotonic()
        staged = s._stage_cuda_on_host
        from safetensors.torch import save_file

        save_file({n: t.detach().to("cpu").contiguous() for n, t in named}, req["checkpoint"])
        return {"change": change, "loss": loss, "push_ms": (t1 - t0) * 1e3, "commit_ms": (t2 - t1) * 1e3,
                "wall_ms": (t2 - t0) * 1e3,
                "trainer_tensors": "host-staged" if (self.device.type == "cuda" and staged) else self.device.type,
                "report": {"version": report.version, "outcome": report.outcome, "bytes_in": report.bytes_in,
                           "bytes_out": report.bytes_out, "buckets": report.buckets, "tensors": report.tensors,
                           "times_ms": report.times_ms}}

    def close(self):
        self.client.close()


def run_role(a) -> int:
    channel = Channel(a.rx, a.tx)
    try:
        role = (EngineRole if a.role == "engine" else TrainerRole)(a)
    except Exception as e:
        import traceback

        traceback.print_exc()
        channel.send({"ok": False, "error": f"{type(e).__name__}: {e}"})
        return 2
    channel.send(dict(role.hello(), ok=True))
    handlers = ({"generate": role.generate, "reference": role.reference_run, "stats": role.stats}
                if a.role == "engine" else {"refit": role.refit_step})
    try:
        serve(channel, handlers)
    finally:
        role.close()
    return 0


# ---- Driver -------------------------------------------------------------------------------


class Child:
    """A role process talking over a pipe pair; its output goes to `log`."""

    def __init__(self, name: str, args: list, log: Path, env: dict):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        self.name, self.log = name, log
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--role", name,
                                      "--rx", str(to_child_r), "--tx", str(from_child_w), *args],
                                     pass_fds=(to_child_r, from_child_w), stdout=open(log, "w"),
                                     stderr=subprocess.STDOUT, env=env)
        os.close(to_child_r)
        os.close(from_child_w)
        self.channel = Channel(from_child_r, to_child_w)

    def hello(self) -> dict:
        try:
            reply = self.channel.recv()
        except ChannelClosed:
            raise RuntimeError(f"{self.name} exited: {self.tail()}") from None
        if not reply.get("ok"):
            raise RuntimeError(f"{self.name} failed to start: {reply.get('error')}\n{self.tail()}")
        return reply

    def call(self, op, **fields):
        try:
            return self.channel.call(op, **fields)
        except ChannelClosed:
            raise RuntimeError(f"{self.name} exited during '{op}': {self.tail()}") from None

    def tail(self, n=4000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

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


def start_refitd(a, tmp: Path, env: dict):
    sock = tmp / "refitd.sock"
    cfg = tmp / "refitd.yaml"
    text = (f"listen: unix:{sock}\nmodel_spec: {a.spec}\nadmin: {{listen: ''}}\n"
            f"limits:\n  bucket_bytes: {a.bucket_bytes}\n  session_deadline_ms: 600000\n")
    engine_gpu = cuda_index(a.engine_device)
    if engine_gpu is not None:
        text += f"staging: device\ndata_plane:\n  transport: nccl\n  device: {engine_gpu}\n"
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


def convert(a, checkpoint: Path, out_dir: Path) -> Path:
    # One model.safetensors (load_checkpoint reads one file): no shards below 1 TB.
    p = subprocess.run([str(a.build / "tools/refitctl"), "convert", "--spec", str(a.spec), "--max-shard-size", "1TB",
                        str(checkpoint), str(out_dir)], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"refitctl convert failed ({p.returncode}): {p.stdout}{p.stderr}")
    return out_dir / "model.safetensors"


def compare(step_reply, engine_reply, reference_reply, previous_logits, atol):
    """(the summary row of one refit, the engine's logits)."""
    import numpy as np

    got, want = decode_f32(engine_reply["logits"]), decode_f32(reference_reply["logits"])
    diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
    changed = None if previous_logits is None else bool(not np.array_equal(previous_logits, got))
    report = step_reply["report"]
    row = {
        "step": None, "change": step_reply["change"], "version": report["version"],
        "outcome": report["outcome"], "wall_ms": round(step_reply["wall_ms"], 3),
        "push_ms": round(step_reply["push_ms"], 3), "commit_ms": round(step_reply["commit_ms"], 3),
        "trainer_tensors": step_reply["trainer_tensors"], "refitd_times_ms": report["times_ms"],
        "bytes_in": report["bytes_in"], "bytes_out": report["bytes_out"], "buckets": report["buckets"],
        "tensors": report["tensors"], "engine_version": engine_reply["version"],
        "engine_bytes_equal_reference": not reference_reply["mismatched"],
        "mismatched_tensors": reference_reply["mismatched"][:20],
        "tokens_equal": engine_reply["ids"] == reference_reply["ids"],
        "ids": engine_reply["ids"],  # prompt + generated
        "max_logit_diff": diff, "logits_changed_vs_previous": changed,
        "generate_ms": round(engine_reply["ms"], 3),
    }
    if not row["tokens_equal"]:
        row["reference_ids"] = reference_reply["ids"]
    if step_reply.get("loss") is not None:
        row["loss"] = step_reply["loss"]
    row["ok"] = bool(row["outcome"] == "committed" and row["engine_version"] == row["version"]
                     and row["engine_bytes_equal_reference"] and row["tokens_equal"] and diff <= atol
                     and changed is not False and np.isfinite(got).all())
    return row, got


def drive(a) -> int:
    a.build = a.build.resolve()
    a.spec = Path(a.spec).resolve()
    model_name = spec_model_name(a.spec)
    tmp = Path(a.workdir).resolve() if a.workdir else Path(tempfile.mkdtemp(prefix="refit-gpu-llama-"))
    tmp.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT / "python"), env.get("PYTHONPATH", "")])
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    lib = a.build / "src/client/librefit_client.so"
    if lib.exists():
        env.setdefault("REFIT_CLIENT_LIB", str(lib))
    common = ["--size", a.size, "--prompt-len", str(a.prompt_len)]
    daemon, engine, trainer = None, None, None
    summary = {"model": model_name, "spec": str(a.spec), "size": a.size, "engine_device": a.engine_device,
               "trainer_device": a.trainer_device, "tokens": a.tokens, "logits_atol": a.logits_atol,
               "workdir": str(tmp), "refits": []}
    ok = False
    try:
        daemon, address, daemon_log = start_refitd(a, tmp, env)
        engine = Child("engine", [*common, "--address", address, "--device", a.engine_device, "--seed", "7",
                                  *([] if a.traffic else ["--no-traffic"])], tmp / "engine.log", env)
        summary["engine"] = engine.hello()
        trainer = Child("trainer", [*common, "--address", address, "--device", a.trainer_device, "--seed", "42",
                                    "--model", model_name], tmp / "trainer.log", env)
        summary["trainer"] = trainer.hello()
        prompt = prompt_ids(a.size, a.prompt_len)
        previous = None
        for step in range(a.refits + 1):
            ckpt = tmp / f"trainer-{step}.safetensors"
            step_reply = trainer.call("refit", step=step, checkpoint=str(ckpt))
            version = step_reply["report"]["version"]
            engine_reply = engine.call("generate", version=version, prompt=prompt, tokens=a.tokens)
            converted = convert(a, ckpt, tmp / f"converted-{step}")
            reference_reply = engine.call("reference", checkpoint=str(converted), prompt=prompt, tokens=a.tokens)
            row, previous = compare(step_reply, engine_reply, reference_reply, previous, a.logits_atol)
            row["step"] = step
            summary["refits"].append(row)
            print(f"refit {step} ({row['change']}): version {row['version']} wall {row['wall_ms']:.1f} ms, "
                  f"tokens_equal={row['tokens_equal']} max_logit_diff={row['max_logit_diff']} "
                  f"bytes_equal={row['engine_bytes_equal_reference']} changed={row['logits_changed_vs_previous']}",
                  file=sys.stderr)
            if not a.keep:
                ckpt.unlink(missing_ok=True)
        stats = engine.call("stats")
        summary["traffic"] = stats["traffic"]
        summary["engine_dirty"] = stats["dirty"]
        ok = (len(summary["refits"]) == a.refits + 1 and all(r["ok"] for r in summary["refits"])
              and stats["traffic"]["mixed"] == 0 and not stats["dirty"])
    except Exception as e:
        summary["error"] = f"{type(e).__name__}: {e}"
    finally:
        for child in (trainer, engine):
            if child is not None:
                child.stop()
        if daemon is not None and daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
    summary["ok"] = ok
    if not ok:
        for name in ("refitd.log", "engine.log", "trainer.log"):
            path = tmp / name
            if path.exists():
                print(f"---- {path} (tail)\n{path.read_text(errors='replace')[-3000:]}", file=sys.stderr)
    # Lists of numbers (token ids) on one line each.
    text = re.sub(r"\[\s+([-\d.,\s]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]",
                  json.dumps(summary, indent=2))
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    if ok and not a.keep and not a.workdir:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", type=Path, default=ROOT / "build", help="build tree with refitd and refitctl")
    ap.add_argument("--spec", default=str(DEFAULT_SPEC), help="model spec (default deploy/models/demo-llama.yaml)")
    ap.add_argument("--size", default="small", choices=["small", "tiny"])
    ap.add_argument("--refits", type=int, default=3, help="training-like changes after the initial refit")
    ap.add_argument("--tokens", type=int, default=16, help="greedy tokens generated per check")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--engine-device", default="cuda:1")
    ap.add_argument("--trainer-device", default="cuda:0")
    ap.add_argument("--bucket-bytes", type=int, default=128 << 20, help="refitd bucket size (must hold the largest tensor)")
    ap.add_argument("--logits-atol", type=float, default=0.0, help="largest |engine - reference| logit accepted")
    ap.add_argument("--no-traffic", dest="traffic", action="store_false",
                    help="no background forwards in the engine during refits")
    ap.add_argument("--workdir", help="keep checkpoints and logs here (default: a temp dir, removed on success)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir and trainer checkpoints")
    ap.add_argument("--out", help="also write the JSON summary here")
    # Role processes (started by the driver).
    ap.add_argument("--role", choices=["engine", "trainer"], help=argparse.SUPPRESS)
    ap.add_argument("--rx", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--tx", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--address", help=argparse.SUPPRESS)
    ap.add_argument("--device", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.role:
        return run_role(a)
    return drive(a)


if __name__ == "__main__":
    sys.exit(main())
