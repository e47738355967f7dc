"""Engine parameters in POSIX shared memory, where refitd can write them in place.

move_to_shm(module) lays every parameter of a module out in one shm object (/dev/shm/NAME,
256-byte aligned), copies its values there, and points the parameter at the shared bytes
(`param.data = view`: same Parameter object, dtype, shape, requires_grad). Code that holds the
Parameter objects sees the new storage; code that saved `param.data` tensors before the move
keeps the old, private copies, so move before building anything that caches them (CUDA graphs,
fused weights).

Lifetime: the views are torch.frombuffer tensors over one mmap object; each view keeps that
object alive, and the mapping is released only when the last view is gone (so it is never
unmapped under a live tensor; never call close() on the mmap yourself). The *name* lives until
SharedParams.close() (or interpreter exit) unlinks it: refitd opens the name once, when the engine
registers, and keeps its own mapping, so unlinking after registration is also safe.

Threading: building is single-threaded; the views are ordinary tensors afterwards.
"""
from __future__ import annotations

import mmap
import os
import uuid
import weakref
from dataclasses import dataclass

from .dtypes import dtype_name

ALIGN_BYTES = 256


@dataclass(frozen=True)
class ShmParam:
    """Where one registered parameter lives: what EngineAgent sends to refitd."""
    name: str
    dtype: str  # safetensors name
    shape: tuple
    shm_name: str
    offset: int
    nbytes: int


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class SharedParams:
    """One shm object holding a set of parameters. Build with move_to_shm() or from_tensors()."""

    def __init__(self, shm_name: str, nbytes: int):
        if not shm_name.startswith("/") or "/" in shm_name[1:]:
            raise ValueError(f"shm name '{shm_name}' must be '/name' without further slashes")
        self.shm_name = shm_name
        self.path = "/dev/shm" + shm_name
        self.nbytes = nbytes
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, max(nbytes, 1))
            self._mmap = mmap.mmap(fd, max(nbytes, 1))
        except BaseException:
            os.close(fd)
            _unlink(self.path)
            raise
        os.close(fd)
        self._finalizer = weakref.finalize(self, _unlink, self.path)
        self.params: list[ShmParam] = []
        self.tensors: dict = {}  # name -> the shared view

    def view(self, dtype, shape, offset: int):
        """A tensor over the shared bytes at `offset` (REQUIRES: inside the region, aligned)."""
        import torch

        numel = 1
        for d in shape:
            numel *= int(d)
        if numel == 0:
            return torch.empty(tuple(shape), dtype=dtype)
        t = torch.frombuffer(self._mmap, dtype=dtype, count=numel, offset=offset)
        return t.view(tuple(shape))

    def close(self) -> None:
        """Unlinks the shm name. The views stay valid until they are garbage (see the module doc)."""
        self._finalizer()

    @classmethod
    def from_tensors(cls, tensors, shm_name: str | None = None, dtypes=None) -> "SharedParams":
        """Copies (name, tensor) pairs into a new shm object; the shared views are in .tensors.
        `dtypes` ({name: safetensors dtype name}) registers a tensor under another dtype of the
        same element size, e.g. "F8_E4M3" for FP8 bytes held as uint8 (torch without float8)."""
        items = list(tensors.items() if hasattr(tensors, "items") else tensors)
        layout, offset = [], 0
        for name, t in items:
            if t.device.type != "cpu":
                raise NotImplementedError(
                    f"parameter '{name}' is on {t.device}: shared memory holds host parameters; CUDA "
                    "parameters register through CUDA IPC (see docs/python.md, 'CUDA parameters')")
            nbytes = t.numel() * t.element_size()
            layout.append((name, t, offset, nbytes))
            offset += (nbytes + ALIGN_BYTES - 1) // ALIGN_BYTES * ALIGN_BYTES
        region = cls(shm_name or f"/refit-{os.getpid()}-{uuid.uuid4().hex[:8]}", offset)
        for name, t, off, nbytes in layout:
            view = region.view(t.dtype, t.shape, off)
            with _no_grad():
                view.copy_(t.detach())
            region.params.append(ShmParam(name, registered_dtype(name, t, dtypes), tuple(int(d) for d in t.shape),
                                          region.shm_name, off, nbytes))
            region.tensors[name] = view
        return region


def registered_dtype(name: str, tensor, dtypes=None) -> str:
    """The safetensors dtype `tensor` registers as: dtypes[name] if given (same element size),
    else its own."""
    from .dtypes import element_bytes

    own = dtype_name(tensor.dtype)
    if not dtypes or name not in dtypes:
        return own
    want = dtypes[name]
    if element_bytes(want) != tensor.element_size():
        raise ValueError(f"parameter '{name}' holds {own} ({tensor.element_size()}-byte elements); it cannot "
                         f"register as {want}")
    return want


def _no_grad():
    import torch

    return torch.no_grad()


def move_to_shm(module, shm_name: str | None = None, named_params=None) -> SharedParams:
    """Moves a module's parameters into one new shm object and returns it. `named_params`
    overrides module.named_parameters() (e.g. to register under other names); tied parameters
    appear once, under their first name."""
    named = list(named_params if named_params is not None else module.named_parameters())
    region = SharedParams.from_tensors([(n, p.data) for n, p in named], shm_name)
    for name, p in named:
        p.data = region.tensors[name]
    return region
