"""Trainer side: push named torch tensors to refitd and commit them as one refit.

    client = refit.TrainerClient("unix:/run/refitd/refitd.sock")
    report = client.refit("my-model", model.named_parameters())     # begin, push all, commit

or, step by step:

    with client.session("my-model", model.named_parameters()) as s:  # manifest from the tensors
        for name, p in model.named_parameters():
            s.push(name, p)
    # leaving the block commits; an exception inside it aborts (and propagates)

Several trainer processes (tensor-, pipeline-, expert-parallel ranks) push one refit together:
rank 0 begins (its manifest lists every whole tensor) and hands `session.ids` to the others,
which `client.join(ids)`, push their own tensors or slices (`push(name, shard, dim=, start=,
full_shape=)`) and `detach()`; rank 0's `commit()` waits until every joined rank detached.
refit.distributed.refit(...) does all of it over a torch.distributed process group.

Tensors: CPU tensors are read in place (refitd's client copies them into its send bucket);
non-contiguous ones are made contiguous first. CUDA tensors are offered to the library as device
memory; a library without the GPU path refuses that (RefitUnimplemented) and the tensor is
staged through host memory instead (one device-to-host copy).

Threading: a TrainerClient and its sessions belong to the thread that created the client; one
client per thread.
"""
from __future__ import annotations

import ctypes
import threading
import warnings
from dataclasses import dataclass, field
from typing import Iterable, Optional

from . import _native
from .dtypes import dtype_name
from .errors import RefitUnimplemented


@dataclass
class RefitReport:
    session_id: int
    version: int
    outcome: str
    reason: str
    bytes_in: int
    bytes_out: int
    buckets: int
    tensors: int
    times_ms: dict = field(default_factory=dict)
    bytes_out_by_format: dict = field(default_factory=dict)
    tag: str = ""    # the manifest's tag ("" when none)
    cause: str = ""  # why it did not commit: "none", "engine_error", "verify_mismatch", ...
    bytes_in_place: int = 0  # output bytes converted straight into the engine (staging: direct)
    bytes_pushed_in_place: int = 0  # bytes sent from where they lie (push(..., in_place=True)), not packed


@dataclass
class StagedVersion:
    """A version refitd keeps in staging (config hold: K): "held" (stage-only, not committed since),
    or the "current" / "previous" committed one."""
    tag: str
    state: str
    version: int
    bytes: int
    checksum: int
    session_id: int


def _report(out) -> "RefitReport":
    return RefitReport(
        out.session_id, out.version, _text(out.outcome), _text(out.reason), out.bytes_in, out.bytes_out,
        out.buckets, out.tensors,
        {k: getattr(out, k + "_ms") for k in ("receive", "convert", "validate", "commit", "pause", "total", "verify")},
        {_text(out.format_names[i]): out.format_bytes[i] for i in range(out.num_formats)},
        _text(out.tag), _text(out.cause), out.bytes_in_place, out.bytes_pushed_in_place)


def _ended(out) -> Optional["RefitReport"]:
    """The report a commit call wrote, whatever its code; None when refitd sent none (the C ABI
    writes outcome "none" then, or nothing when the call's arguments were refused)."""
    return _report(out) if _text(out.outcome) not in ("", "none") else None


@dataclass
class GroupStatus:
    """The daemon as a member of an engine group (docs/architecture.md "Engine groups")."""
    name: str
    members: int
    member: int            # this daemon's index
    phase: str             # joining | idle | copying | copied | resuming | restoring
    tag: str               # the group version this member serves ("" before its first)
    pending_tag: str       # the group version in flight
    dirty: bool            # the group may be mixed: a full group refit must land
    reason: str            # why it is dirty or joining
    group_version: str     # late join: the version the other members serve ("" unknown)
    commits: int
    aborts: int


@dataclass
class DaemonStatus:
    model: str
    engine_registered: bool
    engine_params: int
    engine_bytes: int
    version: int
    active_session: int
    staging_bytes: int
    staging_limit_bytes: int
    committed: int
    refused: int
    aborted: int
    data_endpoint: str
    tag: str = ""                      # the trainer's tag of `version` ("" when none)
    engine_dirty: bool = False
    verify_after_commit: bool = False  # engine.verify_after_commit is on
    verify_mismatches: int = 0         # commits it failed
    engine_asleep: bool = False        # the engine released its weights (EngineAgent.sleep)
    awaiting_wake: int = 0             # the session whose validated refit commits at the wake; 0: none
    group: Optional[GroupStatus] = None  # the daemon's engine group; None when it is in none


def _text(value) -> str:
    return value.decode("utf-8", "replace") if value else ""


def _group(out) -> "Optional[GroupStatus]":
    if not _text(out.group_name):
        return None
    return GroupStatus(_text(out.group_name), out.group_members, out.group_member, _text(out.group_phase),
                       _text(out.group_tag), _text(out.group_pending_tag), bool(out.group_dirty),
                       _text(out.group_reason), _text(out.group_version), out.group_commits, out.group_aborts)


def _describe(name: str, value) -> tuple:
    """(dtype name, shape) of a manifest entry: a tensor, or a (dtype, shape) pair."""
    if isinstance(value, tuple) and len(value) == 2:
        dtype, shape = value
        return (dtype if isinstance(dtype, str) else dtype_name(dtype)), [int(d) for d in shape]
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        return dtype_name(value.dtype), [int(d) for d in value.shape]
    raise TypeError(f"manifest entry '{name}': expected a tensor or a (dtype, shape) pair, got {type(value).__name__}")


def _named(tensors) -> list:
    """[(name, tensor)] from a mapping, or an iterable of pairs such as named_parameters()."""
    items = tensors.items() if hasattr(tensors, "items") else tensors
    out = []
    for item in items:
        name, tensor = item
        out.append((str(name), tensor))
    return out


class TrainerClient:
    """A connection to refitd's control plane. `address`: "unix:/path" or "host:port", or a list
    of them: a fan-out client whose sessions feed every daemon at once (one NCCL broadcast per
    bucket on the NCCL data plane); status() and checksums() then address the first daemon."""

    def __init__(self, address):
        self._lib = _native.lib()
        self._owner = threading.get_ident()
        handle = ctypes.c_void_p()
        if isinstance(address, (list, tuple)):
            arr = (ctypes.c_char_p * len(address))(*[a.encode() for a in address])
            _native.check(self._lib.refit_client_connect_fanout(arr, len(address), ctypes.byref(handle)),
                          f"connect to refitd at {', '.join(address)}")
        else:
            _native.check(self._lib.refit_client_connect(address.encode(), ctypes.byref(handle)),
                          f"connect to refitd at {address}")
        self._handle = handle
        self.address = address

    def close(self) -> None:
        """Closes the connection; open sessions are aborted. Call it on the client's thread."""
        if getattr(self, "_handle", None):
            self._lib.refit_client_close(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_handle", None):
            if threading.get_ident() == getattr(self, "_owner", None):
                self.close()
            else:  # its event loop belongs to another thread: the library leaks it rather than touch it
                warnings.warn("refit.TrainerClient collected off its thread; close() it explicitly", ResourceWarning)
                self.close()

    def _live(self):
        if not self._handle:
            raise ValueError("TrainerClient is closed")
        return self._handle

    def session(self, model: str, tensors, *, partial: bool = False, deadline_ms: int = 0,
                tag=None, stage_only: bool = False, wire_format: str = "bf16") -> "RefitSession":
        """Begins a session whose manifest lists `tensors` (name -> tensor, or (name, tensor) pairs:
        names, dtypes and shapes only; a value may also be a (dtype, shape) pair, the dtype a torch
        dtype or its safetensors spelling "BF16", "F32", ...). Raises RefitBusy while
        another session is open, RefitUnavailable without an engine, RefitEngineDirty for a partial
        refit of a dirty engine.

        In a multi-rank refit the manifest lists every tensor of the refit, whole (the full
        shape of sliced tensors), whichever rank pushes it.

        `tag`: the trainer's version tag (a str, or an int such as the training step, sent as its
        decimal string): 1..128 characters of A-Z a-z 0-9 . _ : + -; refitd reports it with the
        version (RefitInvalidArgument otherwise). `stage_only` (refitd config `hold: K`): the
        commit validates and keeps the refit in refitd's staging under `tag` (outcome "staged")
        instead of writing it; `refitctl commit TAG` writes it later.

        `wire_format`: "bf16" (the default) sends every tensor as pushed and refitd converts it;
        "checkpoint" has this trainer convert the tensors refitd's spec quantizes (FP8/FP4
        formats, listed in refitd's answer to begin) before sending, with refitd's own code: the
        CPU reference quantizers for CPU tensors, the GPU kernels for CUDA tensors (a library
        built with CUDA). The wire then carries their FP8/FP4 bytes plus scales; the engine's bytes
        are identical either way. A slice of such a tensor converts on its own when it does not cut
        the format's blocks; otherwise, and for transposed tensors, RefitInvalidArgument. NVFP4
        members of fused groups and NVFP4 slices need push(amax=) (RefitSession.global_amax;
        refit.distributed.refit(wire_format="checkpoint") reduces it over the process group)."""
        if wire_format not in ("bf16", "checkpoint"):
            raise ValueError(f"wire_format must be 'bf16' or 'checkpoint', not {wire_format!r}")
        named = [(n, _describe(n, t)) for n, t in _named(tensors)]
        shapes = [_native.shape_array(shape) for _, (_, shape) in named]
        names = [n.encode() for n, _ in named]
        dtypes = [dt.encode() for _, (dt, _) in named]
        descs = (_native.TensorDesc * max(len(named), 1))()
        for i, (_, (_, shape)) in enumerate(named):
            descs[i] = _native.new(_native.TensorDesc, name=names[i], dtype=dtypes[i],
                                   shape=ctypes.cast(shapes[i], _native.c_int64_p), rank=len(shape))
        tag_bytes = None if tag is None else str(tag).encode()
        manifest = _native.new(_native.Manifest, model=model.encode(), tensors=descs, num_tensors=len(named),
                               partial=int(partial), deadline_ms=deadline_ms, tag=tag_bytes,
                               stage_only=int(stage_only), wire_format=wire_format.encode())
        handle = ctypes.c_void_p()
        _native.check(self._lib.refit_session_begin(self._live(), ctypes.byref(manifest), ctypes.byref(handle)),
                      f"begin a refit of '{model}'")
        return RefitSession(self, handle)

    def join(self, session_id) -> "RefitSession":
        """Joins the active session another trainer rank began: `session_id` is its `id` (or, for a
        fan-out client, its `ids`, one per daemon in the same order). The joined session pushes
        over this client's own data-plane connection and ends with detach(); leaving its `with`
        block detaches (an exception aborts the whole refit). A joined rank that exits without
        detaching aborts the refit too. Raises RefitRefused (FAILED_PRECONDITION) when that
        session is not active or already committing."""
        ids = [int(i) for i in session_id] if isinstance(session_id, (list, tuple)) else [int(session_id)]
        arr = (ctypes.c_uint64 * len(ids))(*ids)
        handle = ctypes.c_void_p()
        _native.check(self._lib.refit_session_join(self._live(), arr, len(ids), ctypes.byref(handle)),
                      f"join session {', '.join(map(str, ids))}")
        return RefitSession(self, handle, joined=True)

    def refit(self, model: str, tensors, *, in_place: bool = False, **kwargs) -> RefitReport:
        """One whole refit: begin with a manifest of `tensors`, push them all, commit.
        `in_place`: CUDA tensors are pushed in place (Session.push's in_place)."""
        named = _named(tensors)
        with self.session(model, named, **kwargs) as s:
            s.push_all(named, in_place=in_place)
            return s.commit()

    def status(self) -> DaemonStatus:
        out = _native.new(_native.DaemonStatus)
        _native.check(self._lib.refit_client_status(self._live(), ctypes.byref(out)), "refitd status")
        return DaemonStatus(_text(out.model), bool(out.engine_registered), out.engine_params, out.engine_bytes,
                            out.version, out.active_session, out.staging_bytes, out.staging_limit_bytes,
                            out.committed, out.refused, out.aborted, _text(out.data_endpoint), _text(out.tag),
                            bool(out.engine_dirty), bool(out.verify_after_commit), out.verify_mismatches,
                            bool(out.engine_asleep), out.awaiting_wake, _group(out))

    def commit_version(self, tag) -> RefitReport:
        """Commits the held version `tag` (a stage_only refit; refitd config hold: K) into the
        engine. RefitNotFound names the held tags when none has this one; a commit that failed
        raises with its `report`, as RefitSession.commit does."""
        out = _native.new(_native.Report)
        code = self._lib.refit_client_commit_version(self._live(), str(tag).encode(), ctypes.byref(out))
        _native.check(code, f"commit the held version '{tag}'", _ended(out))
        return _report(out)

    def rollback(self) -> RefitReport:
        """Commits again the version committed before the current one (RefitRefused when refitd no
        longer keeps it)."""
        out = _native.new(_native.Report)
        code = self._lib.refit_client_rollback(self._live(), ctypes.byref(out))
        _native.check(code, "roll back", _ended(out))
        return _report(out)

    def commit_group(self, tag, member_deadline_ms: int = 0, timeout_ms: int = 0) -> str:
        """Engine groups (a fan-out client: one address per member, in member order): commits the
        group version `tag`, prepared on every member by a session(stage_only=True, tag=tag).
        Every member pauses its engine and copies it, then every member resumes with it. Returns
        "committed"; raises (RefitError naming each member's failure) when a member could not copy
        (the version was aborted on every member: nothing serves it) or the group was left dirty
        (the error's cause is "engine_dirty": only a full group refit cleans it)."""
        outcome = ctypes.c_char_p()
        code = self._lib.refit_client_commit_group(self._live(), str(tag).encode(), member_deadline_ms, timeout_ms,
                                                   ctypes.byref(outcome))
        _native.check(code, f"commit the group version '{tag}'")
        return _text(outcome.value) if outcome.value else "committed"

    def abort_group(self, tag, reason: str = "aborted by the trainer", timeout_ms: int = 0) -> None:
        """Engine groups: aborts `tag` on every member (prepared: dropped; copied: the version each
        member held is restored and resumed)."""
        _native.check(self._lib.refit_client_abort_group(self._live(), str(tag).encode(), reason.encode(), timeout_ms),
                      f"abort the group version '{tag}'")

    def versions(self) -> list:
        """The versions refitd keeps in staging: held first, then current, then previous."""
        count, hold = ctypes.c_uint64(), ctypes.c_uint32()
        _native.check(self._lib.refit_client_versions(self._live(), ctypes.byref(count), ctypes.byref(hold)),
                      "list refitd's versions")
        out = []
        for i in range(count.value):
            v = _native.new(_native.StagedVersion)
            _native.check(self._lib.refit_client_version_at(self._live(), i, ctypes.byref(v)), "read a version")
            out.append(StagedVersion(_text(v.tag), _text(v.state), v.version, v.bytes, v.checksum, v.session_id))
        return out

    def abort_active(self, reason: str = "aborted by a trainer") -> bool:
        """Aborts whatever session refitd has open; True if there was one."""
        aborted = ctypes.c_int32(0)
        _native.check(self._lib.refit_client_abort_active(self._live(), reason.encode(), ctypes.byref(aborted)),
                      "abort the active session")
        return bool(aborted.value)

    def checksums(self) -> tuple[int, dict]:
        """(engine version, {parameter name: (checksum, nbytes)}) as refitd reads the engine's
        storage; refit.checksum(tensor) computes the same checksum locally."""
        version, count = ctypes.c_uint64(), ctypes.c_uint64()
        _native.check(self._lib.refit_client_checksums(self._live(), ctypes.byref(version), ctypes.byref(count)),
                      "engine checksums")
        out = {}
        for i in range(count.value):
            p = _native.new(_native.ParamChecksum)
            _native.check(self._lib.refit_client_checksum_at(self._handle, i, ctypes.byref(p)), "engine checksums")
            out[_text(p.name)] = (p.checksum, p.nbytes)
        return version.value, out


class RefitSession:
    """One refit in progress. Use as a context manager: a normal exit commits (a joined session:
    detaches) unless the session already ended; an exception aborts the refit and propagates."""

    def __init__(self, client: TrainerClient, handle: ctypes.c_void_p, joined: bool = False):
        self._client = client  # keeps the client alive as long as the session
        self._lib = client._lib
        self._handle = handle
        self.joined = joined  # joined another rank's session: detach() instead of commit()
        self._id: Optional[int] = None
        self._ids: Optional[list] = None
        self.bucket_bytes = self._lib.refit_session_bucket_bytes(handle)
        self.report: Optional[RefitReport] = None  # how the session ended, once commit() returned or raised
        self._ended = False
        self._stage_cuda_on_host = False
        self._in_flight: list = []  # CUDA tensors pushed, kept until their bucket is sent
        self._in_place: list = []  # CUDA tensors pushed in place, kept until the session ends

    @property
    def id(self) -> int:
        """The session's id (after a pipelined begin, read once refitd answered it: what ranks
        that join are handed)."""
        if self._id is None:
            self._id = self._lib.refit_session_id(self._handle)
        return self._id

    @property
    def ids(self) -> list:
        """One session id per daemon (a fan-out): what other ranks join."""
        if self._ids is None:
            count = ctypes.c_uint64()
            _native.check(self._lib.refit_session_ids(self._handle, None, 0, ctypes.byref(count)), "session ids")
            ids = (ctypes.c_uint64 * max(count.value, 1))()
            _native.check(self._lib.refit_session_ids(self._handle, ids, count.value, ctypes.byref(count)),
                          "session ids")
            self._ids = [ids[i] for i in range(count.value)]
        return self._ids

    def push(self, name: str, tensor, *, dim: Optional[int] = None, start: int = 0, full_shape=None,
             amax: Optional[float] = None, in_place: bool = False) -> None:
        """Sends one tensor (copied before this returns: the tensor may change afterwards).

        `in_place` (CUDA tensors): not copied where the data plane sends device memory from where
        it is (CUDA IPC, colocated): tensors pushed one after another that lie one after another
        in one allocation (a contiguous parameter buffer, e.g. Megatron's) travel as one bucket of
        that memory, which refitd's converter reads there. The tensor must not change until
        commit (or detach, abort) returns; the session keeps a reference to it until then.

        With `dim` and `full_shape`, `tensor` is a slice of the manifest's tensor `name` (e.g.
        this rank's tensor-parallel shard): it equals the whole tensor of shape `full_shape`
        except along `dim`, where it holds indices [start, start + tensor.shape[dim]). refitd
        assembles the tensor from its slices, pushed by any ranks in any order; a commit with a
        slice missing is refused naming the tensor and the missing range.

        `amax`: the tensor's max|x| as the trainer states it (docs/formats.md "Trainer-supplied
        amax"). With wire_format "checkpoint", for a tensor the plan converts to NVFP4 it is the
        global amax the client encodes against: a fused group's members (amax_group) and slices
        need it, reduced over the group and every rank's slices (global_amax does that), and are
        refused naming the tensor without it."""
        if (dim is None) != (full_shape is None):
            raise ValueError(f"tensor '{name}': a slice needs both dim and full_shape")
        if dim is not None:
            full = [int(d) for d in full_shape]
            if dim < 0:
                dim += len(full)
            slice_ = (int(dim), int(start), full)
        else:
            slice_ = None
        t = tensor.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        if t.is_cuda and not self._stage_cuda_on_host:
            import torch

            # The library copies device memory on its own stream, and may read it until the
            # bucket is sent: the tensor must be computed before, and stay allocated until then.
            torch.cuda.current_stream(t.device).synchronize()
            try:
                self._push(name, t, _native.MEMORY_CUDA, t.device.index or 0, slice_, amax, in_place)
                (self._in_place if in_place else self._in_flight).append(t)
                return
            except RefitUnimplemented:
                self._stage_cuda_on_host = True  # this library has no GPU path: stage every CUDA tensor
        if t.is_cuda:
            t = t.cpu()
        self._push(name, t, _native.MEMORY_HOST, -1, slice_, amax)

    def push_slice(self, name: str, tensor, dim: int, start: int, full_shape) -> None:
        """push(name, tensor, dim=dim, start=start, full_shape=full_shape)."""
        self.push(name, tensor, dim=dim, start=start, full_shape=full_shape)

    def _push(self, name, t, memory, device, slice_=None, amax=None, in_place=False):
        shape = _native.shape_array(t.shape)
        ref = _native.new(_native.Tensor, name=name.encode(), dtype=dtype_name(t.dtype).encode(),
                          shape=ctypes.cast(shape, _native.c_int64_p), rank=t.dim(), data=t.data_ptr(),
                          nbytes=t.numel() * t.element_size(), memory=memory, device=device)
        if amax is not None:
            ref.has_amax = 1
            ref.amax = float(amax)
        if slice_ is not None:
            dim, start, full = slice_
            if len(full) == 0:
                raise ValueError(f"tensor '{name}': a slice's full_shape needs at least one dimension")
            full_arr = _native.shape_array(full)  # alive until the call below returns
            ref.full_shape = ctypes.cast(full_arr, _native.c_int64_p)
            ref.full_rank = len(full)
            ref.slice_dim = dim
            ref.slice_start = start
        push = self._lib.refit_session_push_in_place if in_place else self._lib.refit_session_push
        _native.check(push(self._live(), ctypes.byref(ref)), f"push '{name}'")

    def amax_group(self, name: str) -> list:
        """Wire format checkpoint: the tensors whose max|x| the NVFP4 global amax of `name` spans
        (its fused group's members, q/k/v, gate/up or w1/w3, or `name` alone); [] when the
        session's plan does not convert `name` to NVFP4."""
        out = ctypes.c_char_p()
        _native.check(self._lib.refit_session_amax_group(self._live(), name.encode(), ctypes.byref(out)),
                      f"amax group of '{name}'")
        text = (out.value or b"").decode()
        return text.split("\n") if text else []

    def global_amax(self, tensors, group=None, names=None) -> dict:
        """The NVFP4 global amax of each tensor the plan converts to NVFP4, as push(amax=) wants
        it: max|x| over its fused group's members (amax_group) and, with a torch.distributed
        process `group`, over every rank's tensors and slices (one all_reduce MAX over the group:
        collective, call it on every rank with the same `names`, e.g. the manifest's names).

        `tensors`: this rank's name -> tensor (or slice), or (name, tensor) pairs, several slices
        of one name allowed. `names`: the names to reduce (default: those in `tensors`). Returns
        name -> amax for the names with an NVFP4 amax."""
        import torch

        own = {}
        for name, t in (tensors.items() if isinstance(tensors, dict) else tensors):
            t = getattr(t, "tensor", t)  # a refit.distributed.Shard
            a = float(t.detach().abs().max().float().item()) if t.numel() > 0 else 0.0
            own[name] = max(own.get(name, 0.0), a)
        names = sorted(own) if names is None else list(names)
        groups = {n: self.amax_group(n) for n in names}
        spans = sorted({m for g in groups.values() for m in g})
        if not spans:
            return {}
        values = torch.tensor([own.get(m, 0.0) for m in spans], dtype=torch.float32)
        if group is not None:
            import torch.distributed as dist

            backend = dist.get_backend(group)
            if backend == "nccl":
                values = values.cuda()
            dist.all_reduce(values, op=dist.ReduceOp.MAX, group=group)
            values = values.cpu()
        reduced = dict(zip(spans, values.tolist()))
        return {n: max(reduced[m] for m in g) for n, g in groups.items() if g}

    def push_all(self, tensors, *, in_place: bool = False) -> None:
        for name, tensor in _named(tensors):
            self.push(name, tensor, in_place=in_place)

    def flush(self) -> None:
        _native.check(self._lib.refit_session_flush(self._live()), "flush")
        self._in_flight.clear()

    def measure_amax(self, on: bool = True) -> None:
        """Tensors pushed afterwards (BF16) carry their max|x|, measured here (on the tensor's GPU
        for CUDA tensors), so refitd converts NVFP4 tensors in one pass (docs/formats.md,
        "Trainer-supplied amax")."""
        _native.check(self._lib.refit_session_measure_amax(self._live(), 1 if on else 0), "measure_amax")

    def commit(self) -> RefitReport:
        """Asks refitd to validate and swap. RefitRefused names every offending tensor; the engine
        keeps its previous version then. A refit that did not commit raises the RefitError of its
        cause (refit.errors; docs/python.md) with its `report` (outcome, cause, reason, times), also
        kept as this session's `report`; None when refitd sent none (the commit failed before
        refitd answered it)."""
        out = _native.new(_native.Report)
        self._ended = not self.joined  # a joined rank's commit is refused and leaves it open
        try:
            code = self._lib.refit_session_commit(self._live(), ctypes.byref(out))
        finally:
            self._in_flight.clear()
            self._in_place.clear()
        self.report = _ended(out)
        _native.check(code, f"commit session {self.id}", self.report)
        return self.report

    def detach(self) -> None:
        """A joined rank is done: flushes, waits until everything it pushed was sent, and tells
        refitd, whose commit on the beginning rank waits for every joined rank's detach. The
        session has ended afterwards. The beginning rank's detach is refused (it commits)."""
        self._ended = self.joined
        try:
            _native.check(self._lib.refit_session_detach(self._live()), f"detach from session {self.id}")
        finally:
            self._in_flight.clear()
            self._in_place.clear()

    def abort(self, reason: str = "aborted by the trainer") -> None:
        self._ended = True
        _native.check(self._lib.refit_session_abort(self._live(), reason.encode()), f"abort session {self.id}")

    def close(self) -> None:
        """Aborts the session if it has not ended, and frees it."""
        if self._handle:
            _ = self.id  # kept for messages after the handle is gone
            self._lib.refit_session_close(self._handle)
            self._handle = None
        self._in_flight.clear()
        self._in_place.clear()

    def _live(self):
        if not self._handle:
            raise ValueError(f"session {self.id} is closed")
        return self._handle

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is not None:
                if not self._ended:
                    try:
                        self.abort(f"trainer raised {exc_type.__name__}: {exc}")
                    except Exception:  # the original exception matters more than a failed abort
                        pass
            elif not self._ended:
                self.detach() if self.joined else self.commit()
        finally:
            self.close()
        return False

    def __del__(self):
        if getattr(self, "_handle", None):
            self.close()


def checksum(tensor) -> int:
    """refitd's checksum of a CPU tensor's bytes (what TrainerClient.checksums() reports)."""
    t = tensor.detach().contiguous().cpu()
    return _native.lib().refit_checksum64(t.data_ptr(), t.numel() * t.element_size(), 0)
