"""Engine parameters in CUDA memory, registered with refitd through CUDA IPC.

CudaParams.from_tensors(tensors, device) lays a set of tensors out in ONE allocation on `device`
(256-byte aligned, like the shm layout), copies their values there and hands back the views
(.tensors) and what refitd needs to write them in place (.params: the allocation's 64-byte
cudaIpcMemHandle, each tensor's byte offset inside it, dtype, shape). refitd opens the handle once
per registration; the engine points its modules at the views (e.g. `param.data = view`), so
refitd's writes are what its kernels read. The allocation is never moved or reallocated, so CUDA
graphs captured over the views stay valid across refits.

The handle comes from torch (`untyped_storage()._share_cuda_()`, what torch.multiprocessing uses;
newer torch prefixes it with a version and a type byte, which cuda_ipc_handle() strips), so the
allocation must come from the ordinary caching allocator: with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True torch exports another kind of handle, which this
module refuses, naming the setting (registered in place, below, such memory is exported as a file
descriptor instead).

Lifetime: the views keep the allocation alive; keep them (or the CudaParams) until the engine
agent has stopped.

In place (nothing copied): CudaParams.from_module(module) / CudaParams.in_place(named_tensors)
register the engine's existing CUDA tensors where they are, by device pointer (CudaPtrParam). The
client library groups them by the CUDA allocation holding them (PyTorch's caching allocator puts
many parameters in one segment), exports one CUDA IPC handle per allocation base and sends each
parameter as that handle plus its offset. Tensors in CUDA virtual memory (cuMemCreate + cuMemMap:
torch's expandable segments, vLLM's sleep-mode allocator) go the same way: the library exports one
POSIX file descriptor per mapped piece (the allocation must have been made with the POSIX file
descriptor handle type), which passes to refitd only over a unix: address, at most 64 pieces.
Host tensors, managed memory and virtual memory without that handle type are refused naming the
parameter. Before every commit refitd asks the engine to audit its registration: InPlaceParams.stale()
names the parameters whose tensor no longer points where it was registered (e.g. after
`param.data = other`), and the library re-checks each pointer's allocation; refitd then refuses
the refit naming them.

Threading: building is single-threaded; the views are ordinary CUDA tensors afterwards.
"""
from __future__ import annotations

from dataclasses import dataclass

from .shm import ALIGN_BYTES, registered_dtype

IPC_HANDLE_BYTES = 64


@dataclass(frozen=True)
class CudaParam:
    """Where one registered parameter lives in GPU memory: what EngineAgent sends to refitd."""
    name: str
    dtype: str  # safetensors name
    shape: tuple
    device: int
    ipc_handle: bytes  # cudaIpcMemHandle_t of the allocation holding it
    offset: int  # bytes from the allocation's base
    nbytes: int


@dataclass(frozen=True)
class CudaPtrParam:
    """A parameter registered in place by its device pointer (InPlaceParams)."""
    name: str
    dtype: str  # safetensors name
    shape: tuple
    device: int
    ptr: int  # the tensor's data_ptr()
    nbytes: int


def _untyped_storage(t):
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()._untyped()


def cuda_ipc_handle(exported: bytes) -> bytes:
    """The 64-byte cudaIpcMemHandle inside the handle torch's `_share_cuda_()` exports: the raw
    handle (older torch), or a versioned one: a version byte, a type byte ('c': a cudaMalloc
    block, followed by the handle; 'e': an expandable segment, refused) and the payload."""
    exported = bytes(exported)
    if len(exported) == IPC_HANDLE_BYTES:
        return exported
    if len(exported) >= 2 + IPC_HANDLE_BYTES and exported[1:2] == b"c":
        return exported[2:2 + IPC_HANDLE_BYTES]
    if len(exported) >= 2 and exported[1:2] == b"e":
        raise RuntimeError("the parameters' allocation is an expandable segment, which CUDA IPC cannot export: "
                           "unset PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True for the engine, or register "
                           "the tensors in place (CudaParams.in_place), which exports it as a file descriptor")
    raise RuntimeError(f"unrecognized CUDA IPC handle from torch ({len(exported)} bytes)")


def ipc_handle_of(t) -> tuple[bytes, int]:
    """(cudaIpcMemHandle bytes of the allocation holding CUDA tensor `t`, byte offset of t's first
    element inside that allocation)."""
    share = _untyped_storage(t)._share_cuda_()
    storage_offset_bytes = int(share[3])  # the storage's start inside the cudaMalloc'd block
    return cuda_ipc_handle(share[1]), storage_offset_bytes + t.storage_offset() * t.element_size()


class CudaParams:
    """One CUDA allocation holding a set of parameters. Build with from_tensors()."""

    def __init__(self, device, nbytes: int):
        import torch

        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"CudaParams holds CUDA memory, not {self.device}")
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.nbytes = nbytes
        self.buffer = torch.zeros(max(nbytes, 1), dtype=torch.uint8, device=self.device)
        self.ipc_handle, self.base_offset = ipc_handle_of(self.buffer)
        self.params: list[CudaParam] = []
        self.tensors: dict = {}  # name -> the view inside the allocation

    def view(self, dtype, shape, offset: int):
        """A tensor over the allocation's bytes at `offset` (REQUIRES: inside it, aligned)."""
        import torch

        numel = 1
        for d in shape:
            numel *= int(d)
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        return self.buffer[offset:offset + nbytes].view(dtype).view(tuple(int(d) for d in shape))

    @classmethod
    def from_tensors(cls, tensors, device, dtypes=None) -> "CudaParams":
        """Copies (name, tensor) pairs (any device) into a new allocation on `device`. `dtypes`
        ({name: safetensors dtype name}) registers a tensor under another dtype of the same
        element size (e.g. "F8_E4M3" for FP8 bytes held as uint8)."""
        import torch

        items = list(tensors.items() if hasattr(tensors, "items") else tensors)
        layout, offset = [], 0
        for name, t in items:
            nbytes = t.numel() * t.element_size()
            layout.append((name, t, offset, nbytes, registered_dtype(name, t, dtypes)))
            offset += (nbytes + ALIGN_BYTES - 1) // ALIGN_BYTES * ALIGN_BYTES
        region = cls(device, offset)
        with torch.no_grad():
            for name, t, off, nbytes, dtype in layout:
                view = region.view(t.dtype, t.shape, off)
                view.copy_(t.detach())
                region.params.append(CudaParam(name, dtype, tuple(int(d) for d in t.shape), region.device.index,
                                               region.ipc_handle, region.base_offset + off, nbytes))
                region.tensors[name] = view
        torch.cuda.synchronize(region.device)
        return region

    def synchronize(self) -> None:
        """Waits for every kernel queued on the allocation's device (the engine's reads)."""
        import torch

        torch.cuda.synchronize(self.device)


    @staticmethod
    def in_place(named_tensors, dtypes=None) -> "InPlaceParams":
        """Registers existing CUDA tensors where they are (no copy): see InPlaceParams."""
        return InPlaceParams(named_tensors, dtypes)

    @staticmethod
    def from_module(module, named_params=None, dtypes=None) -> "InPlaceParams":
        """A torch module's CUDA parameters (and `named_params` instead, when given), in place."""
        return InPlaceParams.from_module(module, named_params, dtypes)


class InPlaceParams:
    """Existing CUDA tensors registered in place: .params (CudaPtrParam entries) for EngineAgent,
    .tensors (name -> the tensor, kept to audit). The tensors must be contiguous and stay
    allocated while registered; parameters that share a caching-allocator segment share one IPC
    handle (refitd maps each allocation once)."""

    def __init__(self, named_tensors, dtypes=None):
        items = list(named_tensors.items() if hasattr(named_tensors, "items") else named_tensors)
        self.tensors: dict = {}
        self._dtypes = dtypes
        for name, t in items:
            if not getattr(t, "is_cuda", False):
                raise ValueError(f"parameter '{name}' is not a CUDA tensor ({getattr(t, 'device', type(t))}); "
                                 "register host parameters through shared memory (refit.shm)")
            if not t.is_contiguous():
                raise ValueError(f"parameter '{name}' is not contiguous; refitd writes dense bytes")
            self.tensors[name] = t
        self.params: list[CudaPtrParam] = []
        self.refresh()

    @classmethod
    def from_module(cls, module, named_params=None, dtypes=None) -> "InPlaceParams":
        named = list(named_params if named_params is not None else module.named_parameters())
        return cls(named, dtypes)

    def refresh(self) -> list:
        """Re-reads every tensor's address (after a wake that reallocated them): .params anew."""
        self.params = [CudaPtrParam(name, registered_dtype(name, t, self._dtypes), tuple(int(d) for d in t.shape),
                                    t.device.index, int(t.data_ptr()), t.numel() * t.element_size())
                       for name, t in self.tensors.items()]
        return self.params

    def stale(self) -> list:
        """The names of the parameters whose tensor no longer points where it was registered."""
        return [p.name for p in self.params if int(self.tensors[p.name].data_ptr()) != p.ptr]

    def synchronize(self) -> None:
        import torch

        for d in sorted({p.device for p in self.params}):
            torch.cuda.synchronize(d)
