"""ctypes declarations of librefit_client.so's C ABI (src/client/c_api.h) and how it is found.

The library is looked up, first match wins:
  1. the path in the environment variable REFIT_CLIENT_LIB;
  2. ``librefit_client.so`` next to this package (``refit/lib/``), as a wheel may bundle it;
  3. a build tree: ``$REFIT_BINARY_DIR/src/client/`` and ``build*/src/client/`` of the source
     checkout this package sits in (``pip install -e ./python`` or ``PYTHONPATH=python``);
  4. the dynamic linker's search path (``LD_LIBRARY_PATH``, ldconfig).

Threading: loading is guarded by a lock; the ctypes functions release the GIL while they run
(CDLL), so refitd's callbacks into Python (pause/resume) can take it on the agent thread.
"""
from __future__ import annotations

import ctypes
import glob
import os
import threading
from pathlib import Path

from .errors import error_for_code

ABI_VERSION = 14  # the REFIT_ABI_VERSION these declarations were written against (3: multi-rank sessions, tags, held
                 # versions; 4: measure_amax; 5: engine ranks; 6: wire format checkpoint; 7: in-place registration,
                 # sleep and wake, the registration audit; 8: per-tensor amax, fused NVFP4 groups; 9: in-place
                 # parameters in CUDA virtual memory; 10: refit_session_push_in_place; 11: the report's
                 # bytes_in_place and bytes_pushed_in_place; 12: refit_last_cause, a failed commit's report;
                 # 13: engine groups, refit_client_commit_group / refit_client_abort_group; 14: the
                 # daemon status's group_* fields)

OK = 0
MEMORY_HOST = 0
MEMORY_CUDA = 1
STORAGE_SHM = 0
STORAGE_CUDA_IPC = 1
STORAGE_CUDA_PTR = 2

c_int64_p = ctypes.POINTER(ctypes.c_int64)


class TensorDesc(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("name", ctypes.c_char_p), ("dtype", ctypes.c_char_p),
                ("shape", c_int64_p), ("rank", ctypes.c_uint32)]


class Manifest(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("model", ctypes.c_char_p),
                ("tensors", ctypes.POINTER(TensorDesc)), ("num_tensors", ctypes.c_uint64),
                ("partial", ctypes.c_uint32), ("deadline_ms", ctypes.c_uint32), ("tag", ctypes.c_char_p),
                ("stage_only", ctypes.c_uint32), ("wire_format", ctypes.c_char_p)]


class Tensor(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("name", ctypes.c_char_p), ("dtype", ctypes.c_char_p),
                ("shape", c_int64_p), ("rank", ctypes.c_uint32), ("data", ctypes.c_void_p),
                ("nbytes", ctypes.c_uint64), ("memory", ctypes.c_uint32), ("device", ctypes.c_int32),
                # ABI 3: a slice of the tensor (full_rank 0: the whole tensor)
                ("full_shape", c_int64_p), ("full_rank", ctypes.c_uint32), ("slice_dim", ctypes.c_int32),
                ("slice_start", ctypes.c_uint64),
                # ABI 8: the trainer's amax (has_amax != 0)
                ("has_amax", ctypes.c_uint32), ("amax", ctypes.c_float)]


class Report(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("session_id", ctypes.c_uint64), ("version", ctypes.c_uint64),
                ("outcome", ctypes.c_char_p), ("reason", ctypes.c_char_p), ("bytes_in", ctypes.c_uint64),
                ("bytes_out", ctypes.c_uint64), ("buckets", ctypes.c_uint32), ("tensors", ctypes.c_uint32),
                ("receive_ms", ctypes.c_double), ("convert_ms", ctypes.c_double),
                ("validate_ms", ctypes.c_double), ("commit_ms", ctypes.c_double), ("pause_ms", ctypes.c_double),
                ("total_ms", ctypes.c_double), ("num_formats", ctypes.c_uint32),
                ("format_names", ctypes.POINTER(ctypes.c_char_p)), ("format_bytes", ctypes.POINTER(ctypes.c_uint64)),
                ("tag", ctypes.c_char_p), ("cause", ctypes.c_char_p), ("verify_ms", ctypes.c_double),
                # ABI 11
                ("bytes_in_place", ctypes.c_uint64), ("bytes_pushed_in_place", ctypes.c_uint64)]


class DaemonStatus(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("model", ctypes.c_char_p),
                ("engine_registered", ctypes.c_uint32), ("engine_params", ctypes.c_uint32),
                ("engine_bytes", ctypes.c_uint64), ("version", ctypes.c_uint64),
                ("active_session", ctypes.c_uint64), ("staging_bytes", ctypes.c_uint64),
                ("staging_limit_bytes", ctypes.c_uint64), ("committed", ctypes.c_uint64),
                ("refused", ctypes.c_uint64), ("aborted", ctypes.c_uint64), ("data_endpoint", ctypes.c_char_p),
                ("tag", ctypes.c_char_p), ("engine_dirty", ctypes.c_uint32), ("verify_after_commit", ctypes.c_uint32),
                ("verify_mismatches", ctypes.c_uint64), ("engine_asleep", ctypes.c_uint32),
                ("awaiting_wake", ctypes.c_uint64),
                # ABI 14
                ("group_name", ctypes.c_char_p), ("group_members", ctypes.c_uint32),
                ("group_member", ctypes.c_uint32), ("group_phase", ctypes.c_char_p), ("group_tag", ctypes.c_char_p),
                ("group_pending_tag", ctypes.c_char_p), ("group_dirty", ctypes.c_uint32),
                ("group_reason", ctypes.c_char_p), ("group_version", ctypes.c_char_p),
                ("group_commits", ctypes.c_uint64), ("group_aborts", ctypes.c_uint64)]


class ParamChecksum(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("name", ctypes.c_char_p), ("checksum", ctypes.c_uint64),
                ("nbytes", ctypes.c_uint64)]


class StagedVersion(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("tag", ctypes.c_char_p), ("state", ctypes.c_char_p),
                ("version", ctypes.c_uint64), ("bytes", ctypes.c_uint64), ("checksum", ctypes.c_uint64),
                ("session_id", ctypes.c_uint64)]


class EngineParam(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("name", ctypes.c_char_p), ("dtype", ctypes.c_char_p),
                ("shape", c_int64_p), ("rank", ctypes.c_uint32), ("storage", ctypes.c_uint32),
                ("shm_name", ctypes.c_char_p), ("offset", ctypes.c_uint64),
                ("cuda_ipc_handle", ctypes.c_uint8 * 64), ("cuda_device", ctypes.c_int32),
                ("cuda_ptr", ctypes.c_void_p)]


PAUSE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
RESUME_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64)
RESUME_TAG_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_char_p)
# (user, out, capacity) -> number of stale parameters; names written '\n'-separated into out.
AUDIT_FN = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64)


class EngineOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("address", ctypes.c_char_p), ("pause", PAUSE_FN),
                ("resume", RESUME_FN), ("user", ctypes.c_void_p), ("version", ctypes.c_uint64),
                ("tag", ctypes.c_char_p), ("resume_tagged", RESUME_TAG_FN),
                ("tp_rank", ctypes.c_int32), ("tp_size", ctypes.c_int32), ("ep_rank", ctypes.c_int32),
                ("ep_size", ctypes.c_int32), ("device", ctypes.c_int32), ("model", ctypes.c_char_p),
                ("audit", AUDIT_FN)]


def new(struct_type, **fields):
    """A struct with struct_size set, as the ABI requires."""
    return struct_type(struct_size=ctypes.sizeof(struct_type), **fields)


_P = ctypes.c_void_p
_SIGNATURES = {
    "refit_abi_version": (ctypes.c_uint32, []),
    "refit_last_error": (ctypes.c_char_p, []),
    "refit_last_cause": (ctypes.c_char_p, []),
    "refit_code_name": (ctypes.c_char_p, [ctypes.c_int]),
    "refit_dense_bytes": (ctypes.c_int, [ctypes.c_char_p, c_int64_p, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint64)]),
    "refit_checksum64": (ctypes.c_uint64, [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64]),
    "refit_client_connect": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(_P)]),
    "refit_client_connect_fanout": (ctypes.c_int, [ctypes.POINTER(ctypes.c_char_p), ctypes.c_uint64,
                                                   ctypes.POINTER(_P)]),
    "refit_client_close": (None, [_P]),
    "refit_client_status": (ctypes.c_int, [_P, ctypes.POINTER(DaemonStatus)]),
    "refit_client_abort_active": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int32)]),
    "refit_client_checksums": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)]),
    "refit_client_checksum_at": (ctypes.c_int, [_P, ctypes.c_uint64, ctypes.POINTER(ParamChecksum)]),
    "refit_client_commit_version": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.POINTER(Report)]),
    "refit_client_rollback": (ctypes.c_int, [_P, ctypes.POINTER(Report)]),
    "refit_client_commit_group": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint32,
                                                 ctypes.POINTER(ctypes.c_char_p)]),
    "refit_client_abort_group": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint32]),
    "refit_client_versions": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)]),
    "refit_client_version_at": (ctypes.c_int, [_P, ctypes.c_uint64, ctypes.POINTER(StagedVersion)]),
    "refit_session_begin": (ctypes.c_int, [_P, ctypes.POINTER(Manifest), ctypes.POINTER(_P)]),
    "refit_session_id": (ctypes.c_uint64, [_P]),
    "refit_session_bucket_bytes": (ctypes.c_uint64, [_P]),
    "refit_session_push": (ctypes.c_int, [_P, ctypes.POINTER(Tensor)]),
    "refit_session_push_in_place": (ctypes.c_int, [_P, ctypes.POINTER(Tensor)]),
    "refit_session_flush": (ctypes.c_int, [_P]),
    "refit_session_measure_amax": (ctypes.c_int, [_P, ctypes.c_int]),
    "refit_session_amax_group": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)]),
    "refit_session_commit": (ctypes.c_int, [_P, ctypes.POINTER(Report)]),
    "refit_session_abort": (ctypes.c_int, [_P, ctypes.c_char_p]),
    "refit_session_close": (None, [_P]),
    "refit_session_join": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_uint64), ctypes.c_uint64, ctypes.POINTER(_P)]),
    "refit_session_detach": (ctypes.c_int, [_P]),
    "refit_session_ids": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_uint64), ctypes.c_uint64,
                                         ctypes.POINTER(ctypes.c_uint64)]),
    "refit_engine_start": (ctypes.c_int, [ctypes.POINTER(EngineOptions), ctypes.POINTER(EngineParam), ctypes.c_uint64,
                                          ctypes.POINTER(_P)]),
    "refit_engine_version": (ctypes.c_uint64, [_P]),
    "refit_engine_tag": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_uint64]),
    "refit_engine_paused": (ctypes.c_int32, [_P]),
    "refit_engine_dirty": (ctypes.c_int32, [_P]),
    "refit_engine_connected": (ctypes.c_int32, [_P]),
    "refit_engine_stop": (None, [_P]),
    "refit_engine_sleep": (ctypes.c_int, [_P]),
    "refit_engine_wake": (ctypes.c_int, [_P, ctypes.POINTER(EngineParam), ctypes.c_uint64,
                                         ctypes.POINTER(ctypes.c_int32)]),
    "refit_engine_asleep": (ctypes.c_int32, [_P]),
    "refit_engine_allocations": (ctypes.c_uint64, [_P]),
}

_lock = threading.Lock()
_lib = None


def candidate_paths() -> list[str]:
    """Where the library is looked for, in order (see the module docstring)."""
    out = []
    env = os.environ.get("REFIT_CLIENT_LIB")
    if env:
        out.append(env)
    here = Path(__file__).resolve().parent
    out.append(str(here / "lib" / "librefit_client.so"))
    binary_dir = os.environ.get("REFIT_BINARY_DIR")
    if binary_dir:
        out.append(str(Path(binary_dir) / "src" / "client" / "librefit_client.so"))
    for root in here.parents[:3]:
        out.extend(sorted(glob.glob(str(root / "build*" / "src" / "client" / "librefit_client.so"))))
    return out


def _load():
    tried = []
    for path in candidate_paths():
        if os.path.exists(path):
            return ctypes.CDLL(path), path
        tried.append(path)
    try:
        return ctypes.CDLL("librefit_client.so"), "librefit_client.so"
    except OSError as e:
        tried.append(f"librefit_client.so on the linker path ({e})")
    raise OSError("cannot find librefit_client.so; build the target refit_client_c or set REFIT_CLIENT_LIB. "
                  "Tried: " + "; ".join(tried))


def lib():
    """The loaded library, with argument and result types declared; loads it on first use."""
    global _lib
    with _lock:
        if _lib is None:
            handle, path = _load()
            for name, (restype, argtypes) in _SIGNATURES.items():
                fn = getattr(handle, name)
                fn.restype = restype
                fn.argtypes = argtypes
            version = handle.refit_abi_version()
            if version < ABI_VERSION:
                raise OSError(f"{path} implements refit C ABI version {version}; this package needs {ABI_VERSION}")
            handle.path = path
            _lib = handle
        return _lib


def check(code: int, what: str, report=None) -> None:
    """Raises the RefitError subclass for a failed call, with the library's message and refitd's
    cause; `report`: the RefitReport of the refit the call ended, if any."""
    if code == OK:
        return
    message = lib().refit_last_error().decode("utf-8", "replace")
    cause = lib().refit_last_cause().decode("utf-8", "replace")
    name = lib().refit_code_name(code).decode()
    raise error_for_code(code, name, f"{what}: {message}" if message else what, cause or None, report)


def shape_array(shape) -> ctypes.Array:
    dims = [int(d) for d in shape]
    return (ctypes.c_int64 * max(len(dims), 1))(*dims)
