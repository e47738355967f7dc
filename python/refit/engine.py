"""Engine side: register parameters with refitd and serve its pause/resume calls.

Three levels:
  * EngineAgent(address, params, on_pause, on_resume): registers ShmParam entries (from
    refit.shm) or CudaParam entries (refit.cuda) and calls the callbacks on refitd's behalf. `on_pause()` must return only once
    nothing reads the parameters; between pause and resume refitd writes them in place;
    `on_resume(version)` says they hold `version`.
  * GatedEngine(address, params): registers them and gates inference with `serving()` (below);
    with CUDA parameters a pause also waits for the kernels queued on their devices.
  * ModuleEngine(address, module): moves a torch module's parameters into shared memory,
    registers them, and gates inference with `serving()`: pause waits for every open serving()
    block to end and holds new ones back until resume, so each forward pass sees one version.

        engine = refit.ModuleEngine("unix:/run/refitd/refitd.sock", model)
        with engine.serving():
            logits = model(input_ids)

Threading: the callbacks run on the agent's own thread, holding the GIL only while Python code
runs (ctypes takes it for the callback and every library call releases it). Don't stop the
engine from inside a callback or a serving() block (stop waits for the agent thread, and pause
waits for serving() blocks). An exception in a user callback is logged and does not reach
refitd: the pause still holds serving() back.
"""
from __future__ import annotations

import ctypes
import logging
import threading
import time
from typing import Callable, Iterable, Optional

from . import _native
from .cuda import IPC_HANDLE_BYTES, CudaParam, CudaPtrParam, InPlaceParams
from .errors import WeightsDirty
from .shm import SharedParams, ShmParam, move_to_shm

log = logging.getLogger("refit.engine")


def _param_array(params):
    """The refit_engine_param array of `params`, and the ctypes objects it points into."""
    keep = []
    array = (_native.EngineParam * max(len(params), 1))()
    for i, p in enumerate(params):
        shape = _native.shape_array(p.shape)
        name, dtype = p.name.encode(), p.dtype.encode()
        keep += [shape, name, dtype]
        fields = dict(name=name, dtype=dtype, shape=ctypes.cast(shape, _native.c_int64_p), rank=len(p.shape))
        if isinstance(p, CudaPtrParam):
            fields.update(storage=_native.STORAGE_CUDA_PTR, cuda_device=p.device, cuda_ptr=p.ptr)
        elif isinstance(p, CudaParam):
            fields.update(storage=_native.STORAGE_CUDA_IPC, cuda_device=p.device, offset=p.offset,
                          cuda_ipc_handle=(ctypes.c_uint8 * IPC_HANDLE_BYTES)(*p.ipc_handle))
        else:
            shm = p.shm_name.encode()
            keep.append(shm)
            fields.update(storage=_native.STORAGE_SHM, shm_name=shm, offset=p.offset)
        array[i] = _native.new(_native.EngineParam, **fields)
    return array, keep


def _as_params(params):
    return list(params.params if isinstance(params, InPlaceParams) else params)


class EngineAgent:
    """Registers `params` with refitd at `address`: all ShmParam (refit.shm), all CudaParam
    (refit.cuda, by IPC handle) or all CudaPtrParam (in place; an InPlaceParams is accepted and
    audits itself). Returns once refitd accepted them (RefitError naming the parameter otherwise).
    The storage must stay mapped (allocated) until stop(), or until sleep().

    `audit()`, when given, returns the names of registered parameters that are no longer where
    they were registered; refitd calls it before every commit and refuses the refit naming them.

    Sleep and wake: sleep() before releasing the weights (refitd drops its mappings; a refit
    meanwhile is staged, or refused when refitd's engine.asleep_refits says so); wake(params) once
    they are mapped again, at the same or new addresses (None: the ones registered last). wake
    returns whether a refit staged meanwhile was committed (pause and resume are called during it)."""

    def __init__(self, address: str, params: Iterable[ShmParam], *,
                 on_pause: Optional[Callable[[], None]] = None,
                 on_resume: Optional[Callable[[int], None]] = None, version: int = 0, tag: str = "",
                 audit: Optional[Callable[[], Iterable[str]]] = None,
                 tp_rank: int = 0, tp_size: int = 0, ep_rank: int = 0, ep_size: int = 0, device: int = -1,
                 model: str = ""):
        """Engine ranks (one process per GPU of a TP/EP engine): each rank passes its `tp_rank` of
        `tp_size` (and `ep_rank` of `ep_size` under expert parallelism, its CUDA `device`, and the
        `model` it serves) to the node's one refitd; tp_size=0 is a single engine."""
        self._lib = _native.lib()
        self._on_pause, self._on_resume = on_pause, on_resume
        if audit is None and isinstance(params, InPlaceParams):
            audit = params.stale
        self._on_audit = audit
        params = _as_params(params)
        # ctypes objects that must outlive the C call (and, for the callbacks, the agent).
        self._pause_fn = _native.PAUSE_FN(self._pause)
        self._resume_fn = _native.RESUME_FN(self._resume)
        self._audit_fn = _native.AUDIT_FN(self._audit) if audit is not None else _native.AUDIT_FN()
        self._tag_arg = str(tag).encode()
        self._model_arg = str(model).encode()
        array, keep = _param_array(params)
        options = _native.new(_native.EngineOptions, address=address.encode(), pause=self._pause_fn,
                              resume=self._resume_fn, user=None, version=version, tag=self._tag_arg,
                              audit=self._audit_fn, tp_rank=tp_rank, tp_size=tp_size, ep_rank=ep_rank,
                              ep_size=ep_size, device=device, model=self._model_arg)
        handle = ctypes.c_void_p()
        _native.check(self._lib.refit_engine_start(ctypes.byref(options), array, len(params), ctypes.byref(handle)),
                      f"register {len(params)} parameters with refitd at {address}")
        self._handle = handle
        self.address = address

    def _pause(self, _user):
        if self._on_pause is not None:
            try:
                self._on_pause()
            except Exception:
                log.exception("on_pause raised")

    def _audit(self, _user, out, capacity):
        try:
            names = [str(n) for n in self._on_audit()]
        except Exception:
            log.exception("audit raised")
            return 0
        if names:
            data = "\n".join(names).encode()[:max(int(capacity) - 1, 0)] + b"\0"
            ctypes.memmove(out, data, len(data))
        return len(names)

    def sleep(self) -> None:
        """The engine is about to release its weights: returns once refitd dropped its mappings
        (RefitError UNAVAILABLE while a commit is in flight: retry)."""
        _native.check(self._lib.refit_engine_sleep(self._live()), "put the engine to sleep")

    def wake(self, params=None) -> bool:
        """The weights are mapped again: `params` (the same names, dtypes and shapes at the same or
        new addresses; None: the ones registered last; an InPlaceParams is refreshed first). Returns
        whether refitd committed a refit staged while the engine slept."""
        if isinstance(params, InPlaceParams):
            params.refresh()
        params = None if params is None else _as_params(params)
        committed = ctypes.c_int32(0)
        if params is None:
            rc = self._lib.refit_engine_wake(self._live(), None, 0, ctypes.byref(committed))
        else:
            array, _keep = _param_array(params)
            rc = self._lib.refit_engine_wake(self._live(), array, len(params), ctypes.byref(committed))
        _native.check(rc, "wake the engine")
        return bool(committed.value)

    @property
    def asleep(self) -> bool:
        return bool(self._lib.refit_engine_asleep(self._live()))

    @property
    def allocations(self) -> int:
        """Distinct CUDA allocations the in-place parameters lie in (0 for other storage)."""
        return int(self._lib.refit_engine_allocations(self._live()))

    def _resume(self, _user, version):
        if self._on_resume is not None:
            try:
                self._on_resume(int(version))
            except Exception:
                log.exception("on_resume raised")

    @property
    def version(self) -> int:
        """The version the parameters hold (the last resume's, or the one registered)."""
        return self._lib.refit_engine_version(self._live())

    @property
    def tag(self) -> str:
        """The trainer's tag of `version` ("" when none): the last resume's (already set when
        on_resume runs), or the one registered."""
        buf = ctypes.create_string_buffer(256)
        _native.check(self._lib.refit_engine_tag(self._live(), buf, len(buf)), "read the engine's tag")
        return buf.value.decode("utf-8", "replace")

    @property
    def paused(self) -> bool:
        return bool(self._lib.refit_engine_paused(self._live()))

    @property
    def dirty(self) -> bool:
        """refitd went away between pause and resume: the weights may mix versions."""
        return bool(self._lib.refit_engine_dirty(self._live()))

    @property
    def connected(self) -> bool:
        return bool(self._lib.refit_engine_connected(self._live()))

    def _live(self):
        if not self._handle:
            raise ValueError("EngineAgent is stopped")
        return self._handle

    def stop(self) -> None:
        """Disconnects and waits for the agent thread (and any callback in progress)."""
        if getattr(self, "_handle", None):
            handle, self._handle = self._handle, None
            self._lib.refit_engine_stop(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def __del__(self):
        self.stop()


class _ServeGate:
    """Many serving() blocks at once, or one pause; a pause waits for open blocks to end."""

    def __init__(self):
        self._cv = threading.Condition()
        self._readers = 0
        self._paused = False

    def enter(self, engine: "ModuleEngine", timeout: Optional[float]):
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self._paused:
                if engine.agent.dirty and not engine.agent.connected:
                    raise WeightsDirty("refitd disconnected during a refit: the weights may mix two versions")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError("the engine stayed paused for a refit")
                # Wake up now and then to notice a refitd that died inside the commit window.
                self._cv.wait(0.1 if left is None else min(left, 0.1))
            self._readers += 1

    def leave(self):
        with self._cv:
            self._readers -= 1
            self._cv.notify_all()

    def pause(self):
        with self._cv:
            self._paused = True
            while self._readers:
                self._cv.wait()

    def resume(self):
        with self._cv:
            self._paused = False
            self._cv.notify_all()


class _Serving:
    def __init__(self, engine, timeout):
        self._engine, self._timeout = engine, timeout

    def __enter__(self):
        self._engine._gate.enter(self._engine, self._timeout)
        return self._engine

    def __exit__(self, *exc):
        self._engine._gate.leave()
        return False


class GatedEngine:
    """Registers `params` (ShmParam or CudaParam entries, e.g. SharedParams.params or
    CudaParams.params) and gates inference with serving(): a pause waits for every open serving()
    block, then (CUDA parameters) for the kernels those blocks queued on the parameters' devices,
    before refitd writes. `on_pause`/`on_resume` run after the gate closed / before it reopens
    (e.g. to flush a KV cache computed with the old weights)."""

    def __init__(self, address: str, params, *, on_pause: Optional[Callable[[], None]] = None,
                 on_resume: Optional[Callable[[int], None]] = None, version: int = 0,
                 audit: Optional[Callable[[], Iterable[str]]] = None, **rank):
        """`rank`: an engine rank's place (tp_rank, tp_size, ep_rank, ep_size, device, model), as
        EngineAgent takes it."""
        if audit is None and isinstance(params, InPlaceParams):
            audit = params.stale
        params = params if isinstance(params, InPlaceParams) else list(params)
        self._gate = _ServeGate()
        self._user_pause, self._user_resume = on_pause, on_resume
        self._resumed = threading.Condition()
        self._cuda_devices = sorted({p.device for p in _as_params(params) if isinstance(p, (CudaParam, CudaPtrParam))})
        self.agent = EngineAgent(address, params, on_pause=self._pause, on_resume=self._resume, version=version,
                                 audit=audit, **rank)

    def _pause(self):
        self._gate.pause()
        if self._cuda_devices:
            import torch

            for d in self._cuda_devices:  # kernels launched inside serving() may still be reading
                torch.cuda.synchronize(d)
        if self._user_pause is not None:
            self._user_pause()

    def _resume(self, version: int):
        try:
            if self._user_resume is not None:
                self._user_resume(version)
        finally:
            self._gate.resume()
            with self._resumed:
                self._resumed.notify_all()

    def serving(self, timeout: Optional[float] = None) -> _Serving:
        """A block in which the parameters hold one version: waits while a refit is in its commit
        window; raises WeightsDirty if refitd died inside one, TimeoutError after `timeout` s."""
        return _Serving(self, timeout)

    def wait_for_version(self, version: int, timeout: Optional[float] = None) -> int:
        """Blocks until the engine holds `version` or newer; returns the version it holds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._resumed:
            while self.agent.version < version:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"engine still at version {self.agent.version}, waiting for {version}")
                self._resumed.wait(0.1 if left is None else min(left, 0.1))
        return self.agent.version

    @property
    def version(self) -> int:
        return self.agent.version

    def sleep(self) -> None:
        """See EngineAgent.sleep: call before releasing the weights (serve nothing while asleep)."""
        self.agent.sleep()

    def wake(self, params=None) -> bool:
        """See EngineAgent.wake: call once the weights are mapped again."""
        return self.agent.wake(params)

    @property
    def asleep(self) -> bool:
        return self.agent.asleep

    @property
    def tag(self) -> str:
        """The trainer's tag of `version` ("" when none)."""
        return self.agent.tag

    @property
    def dirty(self) -> bool:
        return self.agent.dirty

    @property
    def connected(self) -> bool:
        return self.agent.connected

    def close(self) -> None:
        """Unregisters (disconnects)."""
        self.agent.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class ModuleEngine(GatedEngine):
    """A torch module whose parameters refitd updates in place (CPU: POSIX shared memory).

    `named_params` overrides module.named_parameters() for what is registered (its names are the
    ones the model spec maps trainer tensors onto). `on_pause`/`on_resume` as GatedEngine's.
    """

    def __init__(self, address: str, module, *, shm_name: Optional[str] = None, named_params=None,
                 on_pause: Optional[Callable[[], None]] = None,
                 on_resume: Optional[Callable[[int], None]] = None, version: int = 0):
        self.module = module
        self.shared: SharedParams = move_to_shm(module, shm_name, named_params)
        try:
            super().__init__(address, self.shared.params, on_pause=on_pause, on_resume=on_resume, version=version)
        except BaseException:
            self.shared.close()
            raise

    def close(self) -> None:
        """Unregisters (disconnects) and unlinks the shm name; the module keeps its parameters."""
        super().close()
        self.shared.close()


class InPlaceEngine(GatedEngine):
    """A torch module on the GPU whose parameters refitd updates where they are (no copy, no
    re-pointing: CUDA graphs captured over them stay valid). Parameters sharing a caching-allocator
    segment share one CUDA IPC handle. `named_params` overrides module.named_parameters(). Before
    every commit the registration is audited: a parameter re-pointed since (param.data = other)
    makes refitd refuse the refit naming it. wake() re-reads the parameters' addresses."""

    def __init__(self, address: str, module, *, named_params=None, dtypes=None,
                 on_pause: Optional[Callable[[], None]] = None,
                 on_resume: Optional[Callable[[int], None]] = None, version: int = 0, **rank):
        """`rank`: the tag of `version` and an engine rank's place (tag, tp_rank, tp_size, ep_rank,
        ep_size, device, model), as EngineAgent takes them."""
        from .cuda import CudaParams

        self.module = module
        self.in_place: InPlaceParams = CudaParams.from_module(module, named_params, dtypes)
        super().__init__(address, self.in_place, on_pause=on_pause, on_resume=on_resume, version=version, **rank)

    def wake(self, params=None) -> bool:
        return self.agent.wake(self.in_place if params is None else params)
