"""Engine parameters registered in place on one GPU (nothing copied), sleep and wake, and the
registration audit, with a torch model as the engine (refit.InPlaceEngine) and refitd and the
trainer as real processes' peers:
  - a torch model's parameters from the caching allocator, several in one segment: one CUDA IPC
    handle per allocation, refits written where the model's kernels read (data_ptr unchanged), equal
    to `refitctl convert --engine-layout` byte for byte;
  - sleep -> refit staged -> wake at new addresses, then at the same ones -> committed bytes equal
    `refitctl convert --engine-layout`;
  - a stale registration (a parameter re-pointed after registering) refused naming it;
  - memory CUDA IPC cannot share (a cuMemCreate virtual-memory allocation, managed memory, pinned
    host memory) refused at registration naming the parameter.
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
    wait_for(lambda: sock.exists() or proc.poll() is not None, what="refitd socket")
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
               "cuMemGetAllocationGranularity"):
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
        "vmm.plain": (vmm_allocation(lib, n * 2, 0), "virtual-memory allocation"),
        "vmm.posix_fd": (vmm_allocation(lib, n * 2, 1), "virtual-memory allocation"),  # POSIX fd handle type
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
