"""Engine parameters registered in place on one GPU (nothing copied), sleep and wake, and the
registration audit, with a torch model as the engine (refit.InPlaceEngine) and refitd and the
trainer as real processes' peers:
  - a torch model's parameters from the caching allocator, several in one segment: one CUDA IPC
    handle per allocation, refits written where the model's kernels read (data_ptr unchanged), equal
    to `refitctl convert --engine-layout` byte for byte;
  - sleep -> refit staged -> wake at new addresses, then at the same ones -> committed bytes equal
    `refitctl convert --engine-layout`;
  - a stale registration (a parameter re-pointed after registering) refused naming it;
  - parameters in a CUDA virtual-memory allocation (cuMemCreate with the POSIX file descriptor
    handle type, mapped at a reserved address, viewed by torch): registered in place over the Unix
    socket (one descriptor), refits written where the model reads, sleep (the engine unmaps and
    releases the memory, which the GPU's free memory shows given back), wake at the same address;
  - a model allocated by torch's expandable segments (an engine process of its own with
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) registered in place and refitted;
  - memory that cannot be shared (a virtual-memory allocation without the descriptor handle type,
    managed memory, pinned host memory) refused at registration naming the parameter.
Skips, saying why, without torch, a CUDA device or a CUDA build of refitd."""
import ctypes
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SRC = Path(os.environ.get("REFIT_SOURCE_DIR", HERE.parents[2]))
BIN = Path(os.environ.get("REFIT_BINARY_DIR", SRC / "build"))
REFITD = BIN / "src/server/refitd"
REFITCTL = BIN / "tools/refitctl"
sys.path.insert(0, str(SRC / "python"))


def _skip_reason():
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return f"torch is not importable ({e})"
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    cache = BIN / "CMakeCache.txt"
    if cache.exists() and "REFIT_CUDA:BOOL=ON" not in cache.read_text():
        return "refitd was built without CUDA"
    return ""


pytestmark = pytest.mark.skipif(bool(_skip_reason()), reason=_skip_reason() or "runs")


def wait_for(pred, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def daemon(tmp_path):
    sock = tmp_path / "refitd.sock"
    spec = tmp_path / "spec.yaml"
    spec.write_text("model: toy\ndefaults:\n  format: auto\n")
    cfg = tmp_path / "refitd.yaml"
    cfg.write_text(f"listen: unix:{sock}\nlog_level: debug\nmodel_spec: {spec}\n")
    log = tmp_path / "refitd.log"
    proc = subprocess.Popen([str(REFITD), "--config", str(cfg)], stdout=open(log, "w"), stderr=subprocess.STDOUT)
    wait_for(lambda: "event=listening" in log.read_text() or proc.poll() is not None, what="refitd listening")
    assert proc.poll() is None, log.read_text()
    proc.address, proc.spec, proc.tmp, proc.logfile = f"unix:{sock}", spec, tmp_path, log
    yield proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


def model():
    import torch

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32))
    return m.to(device="cuda", dtype=torch.bfloat16)


def weights(seed):
    import torch

    g = torch.Generator().manual_seed(seed)
    shapes = {"0.weight": (128, 64), "0.bias": (128,), "2.weight": (32, 128), "2.bias": (32,)}
    return {n: torch.randn(s, generator=g).to(torch.bfloat16) for n, s in shapes.items()}


def write_safetensors(path: Path, tensors):
    import torch

    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        raw = t.contiguous().view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def convert_engine_layout(d, tensors, tag):
    """{engine parameter: bytes} of `refitctl convert --engine-layout` of `tensors`."""
    ckpt, out = d.tmp / f"ckpt-{tag}", d.tmp / f"out-{tag}"
    ckpt.mkdir()
    write_safetensors(ckpt / "model.safetensors", tensors)
    p = subprocess.run([str(REFITCTL), "convert", "--engine-layout", "--spec", str(d.spec), str(ckpt), str(out)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    raw = (out / "engine.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    return {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in header.items()
            if k != "__metadata__"}


def engine_bytes(m):
    import torch

    torch.cuda.synchronize()
    return {n: p.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes() for n, p in m.named_parameters()}


def test_torch_parameters_registered_in_place_several_per_segment(daemon):
    import refit

    m = model()
    ptrs = {n: p.data_ptr() for n, p in m.named_parameters()}
    with refit.InPlaceEngine(daemon.address, m) as engine, refit.TrainerClient(daemon.address) as client:
        # Four parameters in the caching allocator's small-block segment(s): fewer handles than params.
        assert 1 <= engine.agent.allocations < len(ptrs), engine.agent.allocations
        assert client.status().engine_params == len(ptrs)
        for seed in (1, 2):
            w = weights(seed)
            report = client.refit("toy", w)
            assert report.outcome == "committed", report
            assert engine_bytes(m) == convert_engine_layout(daemon, w, f"r{seed}")
        assert {n: p.data_ptr() for n, p in m.named_parameters()} == ptrs  # written in place, never moved


def test_sleep_refit_staged_wake_at_new_then_same_addresses(daemon):
    import torch

    import refit

    m = model()
    with refit.InPlaceEngine(daemon.address, m) as engine, refit.TrainerClient(daemon.address) as client:
        # Sleep: release the weights (as a memory saver would), refit meanwhile, wake elsewhere.
        engine.sleep()
        assert client.status().engine_asleep
        shapes = {n: (p.shape, p.dtype) for n, p in m.named_parameters()}
        old = {n: p.data_ptr() for n, p in m.named_parameters()}
        for p in m.parameters():
            p.data = torch.empty(0, device="cuda", dtype=p.dtype)
        torch.cuda.empty_cache()  # the weights' segment goes back to the driver
        # A block of the segment's size takes its address back, so the weights land elsewhere.
        keep = [torch.empty(2 << 20, dtype=torch.uint8, device="cuda")]
        w = weights(3)
        report = client.refit("toy", w, tag="asleep-1")
        assert report.outcome == "staged", report
        for n, p in m.named_parameters():
            p.data = torch.zeros(shapes[n][0], device="cuda", dtype=shapes[n][1])
        moved = sum(p.data_ptr() != old[n] for n, p in m.named_parameters())
        assert engine.wake() is True  # re-reads the new addresses, commits the staged refit
        assert engine.version == 1 and engine.tag == "asleep-1" and not client.status().engine_asleep
        assert engine_bytes(m) == convert_engine_layout(daemon, w, "asleep-1")
        print(f"woke with {moved} of {len(old)} parameters at new addresses")

        # At the same addresses.
        engine.sleep()
        w2 = weights(4)
        assert client.refit("toy", w2).outcome == "staged"
        assert engine.wake() is True
        assert engine_bytes(m) == convert_engine_layout(daemon, w2, "asleep-2")
        del keep


def test_a_stale_registration_is_refused_naming_the_parameter(daemon):
    import refit

    m = model()
    with refit.InPlaceEngine(daemon.address, m) as engine, refit.TrainerClient(daemon.address) as client:
        before = engine_bytes(m)
        m[0].weight.data = m[0].weight.data.clone()  # re-pointed: refitd's mapping is of the old tensor
        with pytest.raises(refit.RefitRefused, match=r"stale registration: parameter '0.weight'"):
            client.refit("toy", weights(5))
        assert engine_bytes(m) == before
        # A sleep and a wake register the current addresses again.
        engine.sleep()
        assert engine.wake() is False
        w = weights(6)
        assert client.refit("toy", w).outcome == "committed"
        assert engine_bytes(m) == convert_engine_layout(daemon, w, "after-stale")


def _cuda():
    import torch

    torch.zeros(1, device="cuda")  # the primary context current on this thread
    lib = ctypes.CDLL("libcuda.so.1")
    for fn in ("cuMemCreate", "cuMemAddressReserve", "cuMemMap", "cuMemSetAccess", "cuMemAllocManaged",
               "cuMemGetAllocationGranularity", "cuMemUnmap", "cuMemRelease"):
        getattr(lib, fn).restype = ctypes.c_int
    return lib


class _AllocProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("loc_type", ctypes.c_int),
                ("loc_id", ctypes.c_int), ("win32HandleMetaData", ctypes.c_void_p),
                ("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int), ("flags", ctypes.c_int)]


def vmm_allocation(lib, nbytes, handle_types):
    prop = _AllocProp(type=1, requestedHandleTypes=handle_types, loc_type=1, loc_id=0)  # PINNED, DEVICE 0
    gran = ctypes.c_size_t()
    assert lib.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0) == 0
    size = (nbytes + gran.value - 1) // gran.value * gran.value
    handle = ctypes.c_ulonglong()
    assert lib.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(prop), ctypes.c_ulonglong(0)) == 0
    ptr = ctypes.c_ulonglong()
    assert lib.cuMemAddressReserve(ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0),
                                   ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)) == 0
    assert lib.cuMemMap(ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), handle, ctypes.c_ulonglong(0)) == 0
    access = _AccessDesc(loc_type=1, loc_id=0, flags=3)  # READWRITE
    assert lib.cuMemSetAccess(ptr, ctypes.c_size_t(size), ctypes.byref(access), ctypes.c_size_t(1)) == 0
    return ptr.value


def test_memory_cuda_ipc_cannot_share_is_refused_naming_the_parameter(daemon):
    import torch

    import refit

    lib = _cuda()
    n = 4096
    cases = {
        # No handle type: it cannot be exported as a file descriptor.
        "vmm.plain": (vmm_allocation(lib, n * 2, 0), "virtual-memory allocation.*CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR"),
    }
    managed = ctypes.c_ulonglong()
    assert lib.cuMemAllocManaged(ctypes.byref(managed), ctypes.c_size_t(n * 2), ctypes.c_uint(1)) == 0
    cases["managed.w"] = (managed.value, "managed")
    pinned = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
    cases["pinned.w"] = (pinned.data_ptr(), "host memory")
    for name, (ptr, why) in cases.items():
        p = refit.CudaPtrParam(name, "BF16", (n,), 0, ptr, n * 2)
        with pytest.raises(refit.RefitInvalidArgument, match=rf"parameter '{name}' cannot be registered in place.*{why}"):
            refit.EngineAgent(daemon.address, [p])
    with pytest.raises(ValueError, match="parameter 'cpu.w' is not a CUDA tensor"):
        refit.CudaParams.in_place({"cpu.w": torch.zeros(4)})


class _Cai:
    """__cuda_array_interface__ of raw device bytes, so torch.as_tensor can view them."""

    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 2}


class VmmWeights:
    """`nbytes` of CUDA virtual memory (POSIX file descriptor handle type) at an address reserved
    once, as vLLM's sleep-mode allocator holds weights: release() unmaps and gives the physical
    memory back, map() maps new memory at the same address."""

    def __init__(self, lib, nbytes):
        self.lib = lib
        self.prop = _AllocProp(type=1, requestedHandleTypes=1, loc_type=1, loc_id=0)  # PINNED, POSIX fd, DEVICE 0
        gran = ctypes.c_size_t()
        assert lib.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(self.prop), 0) == 0
        self.size = (nbytes + gran.value - 1) // gran.value * gran.value
        ptr = ctypes.c_ulonglong()
        assert lib.cuMemAddressReserve(ctypes.byref(ptr), ctypes.c_size_t(self.size), ctypes.c_size_t(0),
                                       ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)) == 0
        self.ptr = ptr.value
        self.handle = None
        self.map()

    def map(self):
        handle = ctypes.c_ulonglong()
        assert self.lib.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(self.size), ctypes.byref(self.prop),
                                    ctypes.c_ulonglong(0)) == 0
        assert self.lib.cuMemMap(ctypes.c_ulonglong(self.ptr), ctypes.c_size_t(self.size), ctypes.c_size_t(0), handle,
                                 ctypes.c_ulonglong(0)) == 0
        access = _AccessDesc(loc_type=1, loc_id=0, flags=3)  # READWRITE
        assert self.lib.cuMemSetAccess(ctypes.c_ulonglong(self.ptr), ctypes.c_size_t(self.size), ctypes.byref(access),
                                       ctypes.c_size_t(1)) == 0
        self.handle = handle

    def release(self):
        assert self.lib.cuMemUnmap(ctypes.c_ulonglong(self.ptr), ctypes.c_size_t(self.size)) == 0
        assert self.lib.cuMemRelease(self.handle) == 0
        self.handle = None

    def place(self, m):
        """Points every parameter of `m` at a view into the allocation (256-byte aligned)."""
        import torch

        raw = torch.as_tensor(_Cai(self.ptr, self.size), device="cuda")
        off = 0
        for p in m.parameters():
            nbytes = p.numel() * p.element_size()
            view = raw[off:off + nbytes].view(p.dtype).view(p.shape)
            view.copy_(p.data)
            p.data = view
            off += (nbytes + 255) // 256 * 256
        assert off <= self.size


def test_virtual_memory_parameters_registered_in_place_refit_sleep_wake(daemon):
    import torch

    import refit

    lib = _cuda()
    vmm = VmmWeights(lib, 64 << 20)  # large enough for the GPU's free memory to show its release
    m = model()
    vmm.place(m)
    ptrs = {n: p.data_ptr() for n, p in m.named_parameters()}
    with refit.InPlaceEngine(daemon.address, m) as engine, refit.TrainerClient(daemon.address) as client:
        assert engine.agent.allocations == 1  # one descriptor for the mapping
        w = weights(11)
        assert client.refit("toy", w).outcome == "committed"
        assert engine_bytes(m) == convert_engine_layout(daemon, w, "vmm-1")

        # Sleep: refitd drops its mapping, the engine releases the memory, and it is free.
        engine.sleep()
        torch.cuda.synchronize()
        free_before = torch.cuda.mem_get_info()[0]
        vmm.release()
        first_freed = torch.cuda.mem_get_info()[0] - free_before
        assert first_freed >= vmm.size // 2, f"first sleep: released {vmm.size} bytes, {first_freed} came back"
        w2 = weights(12)
        assert client.refit("toy", w2, tag="vmm-asleep").outcome == "staged"

        # Wake at the same address with new memory: the staged refit lands there.
        vmm.map()
        assert engine.wake() is True
        assert engine.tag == "vmm-asleep"
        assert engine_bytes(m) == convert_engine_layout(daemon, w2, "vmm-2")
        w3 = weights(13)
        assert client.refit("toy", w3).outcome == "committed"
        assert engine_bytes(m) == convert_engine_layout(daemon, w3, "vmm-3")
        assert {n: p.data_ptr() for n, p in m.named_parameters()} == ptrs

        # A second cycle frees the memory mapped at the wake the same way.
        engine.sleep()
        torch.cuda.synchronize()
        free_before = torch.cuda.mem_get_info()[0]
        vmm.release()
        freed = torch.cuda.mem_get_info()[0] - free_before
        assert freed >= vmm.size // 2, f"second sleep: released {vmm.size} bytes, {freed} came back"
        vmm.map()
        assert engine.wake() is False  # nothing staged


_EXPANDABLE_ENGINE = r'''
import json, sys
import torch
import refit

address = sys.argv[1]
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32))
m = m.to(device="cuda", dtype=torch.bfloat16)
segments = [s for s in torch.cuda.memory_snapshot() if s.get("device", 0) == 0]
expandable = any(s.get("is_expandable", False) for s in segments)
g = torch.Generator().manual_seed(21)
w = {n: torch.randn(p.shape, generator=g).to(torch.bfloat16) for n, p in m.named_parameters()}
out = {"expandable": expandable}
with refit.InPlaceEngine(address, m) as engine, refit.TrainerClient(address) as client:
    out["allocations"] = engine.agent.allocations
    out["outcome"] = client.refit("toy", w).outcome
    torch.cuda.synchronize()
    out["equal"] = all(torch.equal(p.detach().cpu(), w[n]) for n, p in m.named_parameters())
print(json.dumps(out))
'''


def test_expandable_segments_parameters_registered_in_place(daemon):
    """A model allocated by torch's expandable segments (PYTORCH_CUDA_ALLOC_CONF is read when CUDA
    starts, so the engine is its own process): its parameters register in place as virtual
    memory, one descriptor per mapped piece."""
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True",
               PYTHONPATH=str(SRC / "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", _EXPANDABLE_ENGINE, daemon.address], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-4000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    if not out["expandable"]:
        pytest.skip(f"this torch did not allocate expandable segments ({out})")
    assert out["outcome"] == "committed" and out["equal"], out
    assert out["allocations"] >= 1, out

