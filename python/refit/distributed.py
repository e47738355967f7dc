"""One refit pushed by every rank of a torch.distributed process group, each rank its own shards.

    import torch.distributed as dist
    import refit
    from refit.distributed import Shard

    client = refit.TrainerClient(address)        # on every rank: its own connection and data plane
    tp, rank = dist.get_world_size(), dist.get_rank()
    shards = {
        # this rank's rows of a row-parallel matrix: start and full shape say where they go
        "model.embed_tokens.weight": Shard.even(embed_local, dim=0, index=rank, count=tp),
        # any slice: dim, start, full shape
        "model.layers.0.mlp.down_proj.weight": Shard(down_local, dim=1, start=rank * 512, full_shape=(2048, 4096)),
    }
    if rank == 0:
        shards["model.norm.weight"] = norm_weight   # a whole tensor, pushed by one rank
    report = refit.distributed.refit(None, client, "my-model", shards)   # collectively, on every rank

refit() gathers every rank's tensor names, dtypes and full shapes to build the manifest (no rank
needs to know the others' shards), begins the session on `root`, broadcasts its id, joins it on
the other ranks (each over its own connection), waits until every rank has joined, then every
rank pushes its shards; the others detach and root commits (refitd waits for every detach, then
validates the whole refit: every tensor exactly once, every sliced tensor tiled; a missing slice
is refused naming the tensor and the missing range). Every rank returns the same RefitReport,
or raises the same error, with its code: the first failing rank's (in rank order) failure to
push, else root's commit or a rank's detach failure. The failing rank re-raises its own exception.

A rank that dies mid-refit aborts the session in refitd at once (the engine keeps its weights);
the surviving ranks' next collective then fails the way torch.distributed reports a dead peer
(gloo: at once, the connection closed). A surviving rank whose own step failed meanwhile (root's
commit: RefitAborted, "a joined trainer rank disconnected before detaching") raises that, chained
to the collective's error.

Collectives used, on every rank in this order: all_gather_object (descriptions), broadcast_object_list
(session ids), all_gather_object (join results), all_gather_object (outcomes). Any backend that
carries Python objects works (gloo, or NCCL with the current CUDA device set).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .dtypes import dtype_name
from .errors import RefitError, error_for_code
from .trainer import RefitReport, TrainerClient, _named


@dataclass(frozen=True)
class Shard:
    """A slice of tensor `name`: `tensor` equals the whole tensor (shape `full_shape`) except along
    `dim`, where it holds indices [start, start + tensor.shape[dim])."""

    tensor: Any
    dim: int
    start: int
    full_shape: tuple

    @classmethod
    def even(cls, tensor, dim: int, index: int, count: int) -> "Shard":
        """Shard `index` of `count` equal shards along `dim` (tensor-parallel style): starts at
        index * tensor.shape[dim], and the full tensor is `count` times as long along `dim`."""
        full = [int(d) for d in tensor.shape]
        if dim < 0:
            dim += len(full)
        start = index * full[dim]
        full[dim] *= count
        return cls(tensor, dim, start, tuple(full))


def _describe(name: str, value) -> tuple:
    """(name, dtype, full shape, slice) of one local entry, for the manifest."""
    if isinstance(value, Shard):
        full = tuple(int(d) for d in value.full_shape)
        return name, dtype_name(value.tensor.dtype), full, (int(value.dim), int(value.start),
                                                            int(value.tensor.shape[value.dim]))
    return name, dtype_name(value.dtype), tuple(int(d) for d in value.shape), None


def manifest_of(gathered: list) -> list:
    """The session's manifest, [(name, (dtype, full shape))] in first-seen rank order, from every
    rank's descriptions; ValueError naming the tensor when ranks disagree on its dtype or shape."""
    seen: dict = {}
    order = []
    for rank, entries in enumerate(gathered):
        for name, dtype, full, _ in entries:
            if name not in seen:
                seen[name] = (dtype, full, rank)
                order.append(name)
                continue
            dtype0, full0, rank0 = seen[name]
            if (dtype0, full0) != (dtype, full):
                raise ValueError(f"tensor '{name}': rank {rank0} pushes {dtype0}{list(full0)} but rank {rank} "
                                 f"pushes {dtype}{list(full)} (dtype and full shape must agree)")
    return [(name, (seen[name][0], seen[name][1])) for name in order]


def _portable(rank: int, e: BaseException, stage: int = 0) -> tuple:
    """An exception as plain data that every rank can rebuild; `stage` orders failures (a failed
    push, 0, is the cause of the commit failure, 1, it leads to)."""
    if isinstance(e, RefitError):
        return (stage, rank, "refit", str(e), e.code, e.code_name, e.cause, e.report)
    return (stage, rank, type(e).__name__, str(e), None, None, None, None)


def _rebuild(failure: tuple, own_rank: int, own: Optional[BaseException]) -> BaseException:
    _, rank, kind, message, code, code_name, cause, report = failure
    if rank == own_rank and own is not None:
        return own
    if kind == "refit":
        return error_for_code(code, code_name, f"rank {rank}: {message}", cause, report)
    if kind == "ValueError":
        return ValueError(f"rank {rank}: {message}")
    return RuntimeError(f"rank {rank} failed: {kind}: {message}")


def refit(group, client: TrainerClient, model: str, named_shards, *, root: int = 0, partial: bool = False,
          deadline_ms: int = 0, wire_format: str = "bf16") -> RefitReport:
    """One refit of `model` pushed by every rank of `group` (None: the default group), collectively:
    call it on every rank, each with its own `client` and its own `named_shards` (name -> tensor
    or Shard, or (name, value) pairs; a rank may have none). `root` (a rank of the group) begins
    and commits. `partial`, `deadline_ms` and `wire_format` are as in TrainerClient.session.
    With wire_format "checkpoint", the NVFP4 global amax of every tensor the plan converts to
    NVFP4 is reduced over the group first (RefitSession.global_amax: one all_reduce MAX over the
    max|x| of every rank's slices and fused-group members), so every rank's slices encode against
    the same one. Returns the RefitReport on every rank, or raises the same error on every rank."""
    import torch.distributed as dist

    if group is None:
        group = dist.group.WORLD
    me = dist.get_rank(group)
    world = dist.get_world_size(group)
    root_global = dist.get_global_rank(group, root) if group is not dist.group.WORLD else root
    entries = _named(named_shards)
    local = [_describe(n, v) for n, v in entries]

    # 1. Every rank's descriptions -> the manifest (every rank builds it, and fails alike).
    gathered = [None] * world
    dist.all_gather_object(gathered, local, group=group)
    manifest = manifest_of(gathered)

    # 2. root begins; every rank learns the session ids (or why there is no session).
    session = None
    own: Optional[BaseException] = None
    begun = [None]
    if me == root:
        try:
            session = client.session(model, manifest, partial=partial, deadline_ms=deadline_ms,
                                     wire_format=wire_format)
            begun[0] = ("ok", session.ids)
        except Exception as e:  # every rank raises it
            own = e
            begun[0] = ("err", _portable(me, e))
    dist.broadcast_object_list(begun, src=root_global, group=group)
    if begun[0][0] == "err":
        raise _rebuild(begun[0][1], me, own)

    # 3. The others join; nobody pushes (and root does not commit) before every rank has joined.
    if me != root:
        try:
            session = client.join(begun[0][1])
        except Exception as e:
            own = e
    joined = [None] * world
    dist.all_gather_object(joined, None if own is None else _portable(me, own), group=group)
    failures = [f for f in joined if f is not None]
    if failures:
        if session is not None:
            try:
                session.abort(f"rank {failures[0][1]} could not join the session")
            except Exception:
                pass
            session.close()
        raise _rebuild(failures[0], me, own)

    # 4. Every rank pushes its own shards; the others detach; root commits once all detached.
    # Wire format checkpoint: the NVFP4 global amax, reduced over the group first (collective).
    amax = {}
    if wire_format == "checkpoint":
        amax = session.global_amax(entries, group=group, names=[n for n, _ in manifest])
    report = None
    stage = 0
    try:
        try:
            for name, value in entries:
                if isinstance(value, Shard):
                    session.push(name, value.tensor, dim=value.dim, start=value.start, full_shape=value.full_shape,
                                 amax=amax.get(name))
                else:
                    session.push(name, value, amax=amax.get(name))
        except Exception as e:
            own = e
            try:
                session.abort(f"rank {me} failed to push: {e}")
            except Exception:
                pass
        if own is None:
            stage = 1
            try:
                if me == root:
                    report = session.commit()
                else:
                    session.detach()
            except Exception as e:
                own = e
    finally:
        session.close()

    # 5. Every rank learns every outcome and ends alike.
    outcomes = [None] * world
    try:
        dist.all_gather_object(outcomes, (None if own is None else _portable(me, own, stage), report), group=group)
    except Exception as e:  # a rank died: this rank's own failure (e.g. the aborted commit) says more
        if own is not None:
            raise own from e
        raise
    failures = sorted(f for f, _ in outcomes if f is not None)
    if failures:
        raise _rebuild(failures[0], me, own)
    return outcomes[root][1]
