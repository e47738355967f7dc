"""SGLang as the engine: each SGLang TP worker (one scheduler process per tensor-parallel rank)
registers its model's parameters with refitd where they lie, and refitd's commit window holds the
worker's forward passes.

SGLang (0.5.16) has no worker-extension class and its `Engine.collective_rpc` only calls existing
Scheduler methods (and returns nothing). Code of our own reaches the TP workers through SGLang's
*custom weight loader*: `update_weights_from_tensor(named_tensors, load_format=F)` imports F (a
dotted path named in `custom_weight_loader` at start) inside every TP worker and calls
`F(model, named_tensors)` there, between two batches of the scheduler loop
(sglang/srt/model_executor/model_runner_components/weight_updater.py,
WeightUpdater.update_weights_from_tensor). refit.sglang.command is such a loader: the tensor's
*name* carries a command (JSON), each rank runs it against its ModelRunner and writes its answer
to a file the caller named; the caller's helpers below read every rank's answer.

    import sglang as sgl, refit.sglang as rs
    engine = sgl.Engine(model_path=FP8_CHECKPOINT, **rs.engine_kwargs(), disable_radix_cache=True)
    rs.attach(engine, "unix:/run/refitd/refitd.sock", "llama3-fp8")   # one status per TP rank
    # ... trainers push to refitd; every commit lands in SGLang's parameters in place
    rs.status(engine)            # [{"version": 3, "tag": "step-3", ...}] one per rank
    engine.flush_cache()         # after a commit, unless the radix cache is off

What each rank registers: `model.named_parameters()` as SGLang holds them after loading
(`process_weights_after_loading` run), less the FP8 KV-cache scales (`attn.k_scale`/`v_scale`,
read into floats at load; registered_params), by device pointer (refit.cuda.InPlaceParams), under
SGLang's names (fused `qkv_proj`, `gate_up_proj`, FP8 `weight_scale_inv`). On Hopper SGLang keeps
block-FP8 weights and their float32 block scales as the checkpoint has them (its UE8M0
requantization runs only where DeepGEMM uses UE8M0 scales, i.e. Blackwell), so the daemon's spec
is deploy/models/llama3_fp8.yaml. The registration is refused naming any parameter the spec
cannot produce. Nothing is copied or re-pointed: SGLang's captured CUDA graphs stay valid, and
refitd's audit before every commit refuses a refit if SGLang re-pointed a parameter since.

The commit window: refitd's pause closes a gate that every `ModelRunner.forward` call of the rank
passes (the instance's forward is wrapped; CUDA graph replay happens inside it), then waits for
the kernels already queued on the device; refitd writes; resume opens it. SGLang computes a
step's logits inside ModelRunner.forward (sampling, after it, reads no weight), so each forward
pass runs wholly on one version. SGLang's radix (prefix) cache lives in the scheduler: flush it
after a commit (`engine.flush_cache()`, which SGLang does only when idle) or serve with
`disable_radix_cache=True`, or new requests reuse KV entries the old weights made.

Sleep: `sleep(engine, tags)` tells refitd first, then calls SGLang's
`release_memory_occupation(tags)`; `wake(engine, tags)` calls `resume_memory_occupation(tags)` and
then re-registers the addresses once the weights are mapped again. Both need SGLang started with
`enable_memory_saver=True` (torch_memory_saver), whose allocations refitd must be able to map
(refused at attach, naming the parameter, otherwise). Not run yet.

Limits: the answer files live in a local temporary directory, so every TP rank must be on the
caller's host; a command waits, like any update_weights_from_tensor, for SGLang's in-flight
requests (the tokenizer manager's model-update lock).
"""
from __future__ import annotations

import gc
import json
import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Optional

log = logging.getLogger("refit.sglang")

COMMAND = "refit.sglang.command"  # the custom weight loader: load_format and custom_weight_loader entry
_PREFIX = "refit.sglang:"
_STATE: dict = {}  # in each scheduler process: id(ModelRunner) -> its registration
# Not registered: the KV-cache scales SGLang's Fp8KVCacheMethod adds to every attention layer
# (`...self_attn.attn.k_scale` / `v_scale`, F32 scalars, 1.0 when the checkpoint has none;
# layers/quantization/kv_cache.py). SGLang copies them into Python floats at load, so writing
# them would change nothing, and they are no weights a trainer pushes.
_NOT_REGISTERED = re.compile(r"\.attn\.(k_scale|v_scale)$")


def registered_params(model) -> list:
    """(name, parameter) of `model` that refit.sglang registers: named_parameters() less the
    KV-cache scales."""
    return [(n, p) for n, p in model.named_parameters() if not _NOT_REGISTERED.search(n)]


def engine_kwargs() -> dict:
    """The sgl.Engine / ServerArgs settings the helpers need (merge with your own
    custom_weight_loader list if you have one): `--custom-weight-loader refit.sglang.command`."""
    return {"custom_weight_loader": [COMMAND]}


# ---------------------------------------------------------------------------------------------
# Caller side (the process holding sgl.Engine)

def call(engine, method: str, **args) -> list:
    """Runs `method` of refit.sglang on every TP rank; returns each rank's answer, by rank.
    Raises RuntimeError naming the rank(s) that failed."""
    import torch

    with tempfile.TemporaryDirectory(prefix="refit-sglang-") as out:
        req = json.dumps({"method": method, "args": args, "out": out})
        res = engine.update_weights_from_tensor([(_PREFIX + req, torch.empty(0))], load_format=COMMAND,
                                                flush_cache=False)
        ok, message = (res[0], res[1]) if isinstance(res, (tuple, list)) and len(res) >= 2 else (True, "")
        answers = []
        for f in sorted(Path(out).glob("rank*.json"), key=lambda p: int(p.stem[4:])):
            answers.append(json.loads(f.read_text()))
    if not ok:
        raise RuntimeError(f"SGLang refused refit.sglang {method}: {message}")
    if not answers:
        raise RuntimeError(f"refit.sglang {method}: no TP rank answered (is {COMMAND!r} in SGLang's "
                           "custom_weight_loader? see refit.sglang.engine_kwargs())")
    errors = [f"rank {a['rank']}: {a['error']}" for a in answers if "error" in a]
    if errors:
        raise RuntimeError(f"refit.sglang {method} failed: " + "; ".join(errors))
    return [a["result"] for a in answers]


def attach(engine, address: str, model: str = "", version: int = 0, tag: str = "") -> list:
    """Registers every rank's parameters with refitd at `address` and gates their forward passes.
    `model`: the spec's model name (checked by refitd when given); `version`/`tag`: what the
    loaded weights are. Returns status()."""
    return call(engine, "attach", address=address, model=model, version=version, tag=tag)


def status(engine) -> list:
    """Per rank: version, tag, paused/dirty/connected/asleep, parameter count, CUDA allocations,
    forward passes since attach, and each commit window as the rank saw it (ms)."""
    return call(engine, "status")


def param_addresses(engine) -> list:
    """Per rank: {parameter name: device address} as the model holds them now."""
    return call(engine, "addresses")


def wait_for_version(engine, version: int, timeout: Optional[float] = None) -> list:
    """Blocks until every rank holds `version` or newer (the scheduler loops wait meanwhile)."""
    return call(engine, "wait_for_version", version=version, timeout=timeout)


def run(engine, function: str, *args) -> list:
    """Calls `function` ("package.module:name", importable in SGLang's scheduler processes) as
    function(model_runner, *args) on every rank; returns its JSON-able results (tests, audits)."""
    return call(engine, "run", function=function, args=list(args))


def sleep(engine, tags: Optional[list] = None) -> None:
    """Tells refitd (when the weights are released), then SGLang's release_memory_occupation(tags)."""
    if tags is None or "weights" in tags:
        call(engine, "sleep")
    engine.release_memory_occupation(tags)


def wake(engine, tags: Optional[list] = None) -> list:
    """SGLang's resume_memory_occupation(tags); once the weights are mapped again, re-registers
    them with refitd. Returns per rank whether a refit staged meanwhile was committed."""
    engine.resume_memory_occupation(tags)
    if tags is not None and "weights" not in tags:
        return []
    return call(engine, "wake")


def detach(engine) -> None:
    """Unregisters every rank from refitd and removes the forward gate."""
    call(engine, "detach")


# ---------------------------------------------------------------------------------------------
# Scheduler side (inside each TP worker process)

def command(model, named_tensors) -> None:
    """The custom weight loader SGLang calls in each TP worker: runs the commands named by the
    tensors' names and writes this rank's answer to the caller's directory. Never raises (an
    exception here would end SGLang's scheduler): errors travel in the answer."""
    for name, _tensor in named_tensors:
        if not name.startswith(_PREFIX):
            log.error("refit.sglang.command: %r is no refit.sglang command (use refit.sglang.call)", name)
            continue
        req = json.loads(name[len(_PREFIX):])
        rank = 0
        try:
            runner = _runner_of(model)
            rank = _tp_place(runner)[0]
            answer = {"rank": rank, "result": _METHODS[req["method"]](runner, **req["args"])}
        except Exception as e:  # noqa: BLE001 - travels to the caller
            log.exception("refit.sglang %s failed", req.get("method"))
            answer = {"rank": rank, "error": f"{type(e).__name__}: {e}"}
        out = Path(req["out"])
        tmp = out / f".rank{rank}.{os.getpid()}"
        tmp.write_text(json.dumps(answer))
        tmp.rename(out / f"rank{rank}.json")


def _runner_of(model):
    """The ModelRunner holding `model` (SGLang hands the custom loader only the model)."""
    def holds(o):
        return (getattr(o, "model", None) is model and hasattr(o, "weight_updater")
                and callable(getattr(o, "forward", None)))

    for d in gc.get_referrers(model):
        if isinstance(d, dict):
            for o in gc.get_referrers(d):
                if holds(o):
                    return o
    for o in gc.get_objects():
        if type(o).__name__ == "ModelRunner" and holds(o):
            return o
    raise RuntimeError("no SGLang ModelRunner holds this model")


def _tp_place(runner):
    """(tp_rank, tp_size) of this worker; (0, 1) without tensor parallelism."""
    ps = getattr(runner, "ps", None)
    rank = getattr(ps, "tp_rank", getattr(runner, "tp_rank", 0))
    size = getattr(ps, "tp_size", getattr(runner, "tp_size", None))
    if size is None:
        try:
            from sglang.srt.distributed import get_tensor_model_parallel_world_size

            size = get_tensor_model_parallel_world_size()
        except Exception:  # noqa: BLE001
            size = 1
    return int(rank), int(size)


class _ForwardGate:
    """Wraps a ModelRunner's forward (an instance attribute over the class's method) so that each
    call holds the engine's serving gate: a pause waits for the call in progress and holds the
    next one back. CUDA graph replay and the logits are inside forward."""

    def __init__(self, runner, engine):
        self._engine = engine
        self._forward = runner.forward
        self.steps = 0

    def forward(self, *args, **kwargs):
        self._engine._gate.enter(self._engine, None)
        try:
            return self._forward(*args, **kwargs)
        finally:
            self._engine._gate.leave()
            self.steps += 1

    def install(self, runner):
        runner.forward = self.forward

    @staticmethod
    def uninstall(runner):
        runner.__dict__.pop("forward", None)


def _live(runner):
    st = _STATE.get(id(runner))
    if st is None:
        raise RuntimeError("this SGLang rank is not attached to refitd: refit.sglang.attach(engine, address) first")
    return st


def _attach(runner, address, model="", version=0, tag=""):
    import torch

    from .engine import InPlaceEngine

    if id(runner) in _STATE:
        raise RuntimeError("this SGLang rank is already attached to refitd; refit.sglang.detach(engine) first")
    tp_rank, tp_size = _tp_place(runner)
    windows, paused_at = [], []

    def on_pause():
        paused_at.append(time.monotonic())

    def on_resume(_version):
        if paused_at:
            windows.append((time.monotonic() - paused_at.pop()) * 1e3)

    engine = InPlaceEngine(address, runner.model, named_params=registered_params(runner.model), version=version,
                           tag=tag, on_pause=on_pause, on_resume=on_resume,
                           tp_rank=tp_rank if tp_size > 1 else 0, tp_size=tp_size if tp_size > 1 else 0,
                           device=torch.cuda.current_device(), model=model)
    gate = _ForwardGate(runner, engine)
    gate.install(runner)
    _STATE[id(runner)] = {"engine": engine, "gate": gate, "windows": windows}
    log.info("SGLang TP rank %d of %d registered %d parameters with refitd at %s", tp_rank, tp_size,
             len(engine.in_place.params), address)
    return _status(runner)


def _status(runner):
    st = _live(runner)
    engine = st["engine"]
    return {"version": engine.version, "tag": engine.tag, "paused": engine.agent.paused, "dirty": engine.dirty,
            "connected": engine.connected, "asleep": engine.asleep, "params": len(engine.in_place.params),
            "allocations": engine.agent.allocations, "steps": st["gate"].steps,
            "commit_windows_ms": list(st["windows"])}


def _addresses(runner):
    return {n: int(p.data_ptr()) for n, p in registered_params(runner.model)}


def _wait_for_version(runner, version, timeout=None):
    return _live(runner)["engine"].wait_for_version(version, timeout)


def _sleep(runner):
    _live(runner)["engine"].sleep()


def _wake(runner):
    return bool(_live(runner)["engine"].wake())


def _detach(runner):
    st = _STATE.pop(id(runner), None)
    if st is None:
        return None
    st["gate"].uninstall(runner)
    st["engine"].close()
    return None


def _run(runner, function, args=()):
    import importlib

    module, _, name = function.partition(":")
    return getattr(importlib.import_module(module), name)(runner, *args)


_METHODS = {"attach": _attach, "status": _status, "addresses": _addresses, "wait_for_version": _wait_for_version,
            "sleep": _sleep, "wake": _wake, "detach": _detach, "run": _run}
