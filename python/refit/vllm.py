"""vLLM as the engine: each vLLM worker (one per tensor-parallel rank) registers its model's
parameters with refitd where they lie, and refitd's commit window holds the worker's forward steps.

Switch it on with vLLM's own extension point, a worker extension class, and one collective call:

    from vllm import LLM
    llm = LLM(model=FP8_CHECKPOINT, worker_extension_cls="refit.vllm.RefitWorker")
    llm.collective_rpc("refit_attach", args=("unix:/run/refitd/refitd.sock",))
    # ... trainers push to refitd; every commit lands in vLLM's parameters in place
    llm.collective_rpc("refit_status")   # [{"version": 3, "tag": "step-3", ...}] one per rank

What each worker registers: `model.named_parameters()` after vLLM's `process_weights_after_loading`,
by device pointer (refit.cuda.InPlaceParams: one CUDA IPC handle per caching-allocator segment, a
file descriptor per piece of virtual memory), under vLLM's own names (fused `qkv_proj`,
`gate_up_proj`, FP8 `weight_scale_inv`). The daemon's spec gives those names' layout
(deploy/models/llama3_fp8_ue8m0.yaml is what vLLM holds for FP8 block-128 Llama on Hopper,
where it requantizes weights to power-of-two scales at load); the registration is
refused naming any parameter the spec cannot produce. Nothing is copied or re-pointed, so the
CUDA graphs vLLM captured stay valid, and the audit refitd runs before every commit refuses a
refit if vLLM re-pointed a parameter since.

The commit window: refitd's pause closes a gate that every `execute_model` and `sample_tokens`
call of the worker passes, then waits for the kernels already queued on the device; refitd
writes; resume opens it. vLLM computes a step's logits inside execute_model, so a step's forward
pass runs wholly on the old or wholly on the new weights; requests in flight continue on the new weights (their
KV cache from earlier tokens stays). vLLM's prefix cache lives in its scheduler, out of a worker's
reach: after a commit call `llm.reset_prefix_cache()` (as after vLLM's own weight updates), or
serve with `enable_prefix_caching=False`, or new requests reuse KV entries the old weights made.

Sleep: `refit_sleep(level)` tells refitd first (it drops its mappings; refits meanwhile are staged
or refused per its `engine.asleep_refits`), then calls vLLM's `sleep(level)`;
`refit_wake(tags)` calls vLLM's `wake_up(tags)`, then re-registers the addresses once the weights
are mapped again, committing a refit staged meanwhile. vLLM's sleep allocator must export POSIX
file descriptors for refitd to map its memory (refused at registration, naming the parameter,
otherwise).

Ranks: under tensor parallelism each worker registers its TP rank and size (a spec with
`tensor_parallel: {size: engine}`, as shipped, takes vLLM's `tensor_parallel_size` from them; a
stated `tensor_parallel.size` must equal it); a single-GPU vLLM registers as the daemon's one
engine. vLLM 0.25 keeps no weight version of its own: `refit_status()` reports
the committed version and the trainer's tag.

Works with vLLM's in-process engine core (VLLM_ENABLE_V1_MULTIPROCESSING=0) and with its worker
processes alike: the registration and its agent thread live in the worker process.
"""
from __future__ import annotations

import logging
import time
from typing import Optional

log = logging.getLogger("refit.vllm")


class _StepGate:
    """Wraps a worker's execute_model and sample_tokens so that each call holds the engine's
    serving gate: a pause waits for the call in progress and holds the next one back. vLLM
    computes a step's logits inside execute_model, so a step's forward pass sees one version;
    sample_tokens (sampling, and a speculative drafter's forward) is gated on its own."""

    def __init__(self, worker, engine):
        self._engine = engine
        self._execute = worker.execute_model
        self._sample = getattr(worker, "sample_tokens", None)
        self.steps = 0

    def _gated(self, fn, *args, **kwargs):
        self._engine._gate.enter(self._engine, None)
        try:
            return fn(*args, **kwargs)
        finally:
            self._engine._gate.leave()

    def execute_model(self, *args, **kwargs):
        out = self._gated(self._execute, *args, **kwargs)
        self.steps += 1
        return out

    def sample_tokens(self, *args, **kwargs):
        return self._gated(self._sample, *args, **kwargs)

    def install(self, worker):
        worker.execute_model = self.execute_model
        if self._sample is not None:
            worker.sample_tokens = self.sample_tokens

    @staticmethod
    def uninstall(worker):
        for name in ("execute_model", "sample_tokens"):
            worker.__dict__.pop(name, None)


def _tp_place():
    """(tp_rank, tp_size) of this worker in vLLM's tensor-parallel group; (0, 1) without one."""
    try:
        from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

        return int(get_tensor_model_parallel_rank()), int(get_tensor_model_parallel_world_size())
    except Exception:  # noqa: BLE001 - outside an initialized vLLM worker
        return 0, 1


class RefitWorker:
    """vLLM worker extension (`worker_extension_cls="refit.vllm.RefitWorker"`): vLLM mixes it into
    its worker class, and `llm.collective_rpc("refit_<method>", ...)` calls it on every rank."""

    def refit_attach(self, address: str, model: str = "", version: int = 0, tag: str = "") -> dict:
        """Registers this rank's parameters with refitd at `address` and gates its model steps.
        `model`: the spec's model name (checked by refitd when given); `version`/`tag`: what the
        loaded weights are. Returns refit_status()."""
        import torch

        from .engine import InPlaceEngine

        if getattr(self, "_refit_engine", None) is not None:
            raise RuntimeError("this vLLM worker is already attached to refitd; refit_detach() first")
        module = self.model_runner.model
        tp_rank, tp_size = _tp_place()
        self._refit_windows_ms, paused_at = [], []

        def on_pause():
            paused_at.append(time.monotonic())

        def on_resume(_version):
            if paused_at:
                self._refit_windows_ms.append((time.monotonic() - paused_at.pop()) * 1e3)

        engine = InPlaceEngine(address, module, version=version, tag=tag, on_pause=on_pause, on_resume=on_resume,
                               tp_rank=tp_rank if tp_size > 1 else 0, tp_size=tp_size if tp_size > 1 else 0,
                               device=torch.cuda.current_device(), model=model)
        gate = _StepGate(self, engine)
        gate.install(self)
        self._refit_engine, self._refit_gate = engine, gate
        log.info("vLLM worker (TP rank %d of %d) registered %d parameters with refitd at %s", tp_rank, tp_size,
                 len(engine.in_place.params), address)
        return self.refit_status()

    def refit_status(self) -> dict:
        """This rank's registration: version, tag, paused/dirty/connected, parameter count and the
        CUDA allocations they lie in, model steps run since attach, and each commit window as this
        rank saw it (ms from refitd's pause, once no step ran and the device was idle, to resume)."""
        engine = self._refit_live()
        return {"version": engine.version, "tag": engine.tag, "paused": engine.agent.paused,
                "dirty": engine.dirty, "connected": engine.connected, "asleep": engine.asleep,
                "params": len(engine.in_place.params), "allocations": engine.agent.allocations,
                "steps": self._refit_gate.steps, "commit_windows_ms": list(self._refit_windows_ms)}

    def refit_param_addresses(self) -> dict:
        """{parameter name: device address} as the model holds them now (for audits and tests)."""
        return {n: int(p.data_ptr()) for n, p in self.model_runner.model.named_parameters()}

    def refit_wait_for_version(self, version: int, timeout: Optional[float] = None) -> int:
        """Blocks until this rank holds `version` or newer; returns the version it holds."""
        return self._refit_live().wait_for_version(version, timeout)

    def refit_sleep(self, level: int = 1) -> None:
        """Tells refitd, then puts vLLM to sleep at `level` (its weights offloaded or discarded)."""
        self._refit_live().sleep()
        self.sleep(level)

    def refit_wake(self, tags: Optional[list] = None) -> bool:
        """Wakes vLLM (`tags` as its wake_up's); once the weights are mapped again, re-registers
        them with refitd. Returns whether a refit staged meanwhile was committed."""
        self.wake_up(tags)
        if tags is not None and "weights" not in tags:
            return False
        return self._refit_live().wake()

    def refit_detach(self) -> None:
        """Unregisters from refitd and removes the step gate."""
        engine = getattr(self, "_refit_engine", None)
        if engine is None:
            return
        self._refit_gate.uninstall(self)
        self._refit_engine = None
        engine.close()

    def _refit_live(self):
        engine = getattr(self, "_refit_engine", None)
        if engine is None:
            raise RuntimeError("this vLLM worker is not attached to refitd: call refit_attach(address) first")
        return engine
