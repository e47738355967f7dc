"""One trainer rank of a multi-rank refit (test_multi_rank.py spawns `--world` of them): a
torch.distributed gloo group over a file store; every rank builds the same toy model and pushes
only its own shards of it.

Shards of world size W (torch.tensor_split: uneven when W does not divide the dimension):
  embed.weight [50, 48]  rows (dim 0)     proj.weight [48, 48]  columns (dim 1)
  proj.bias    [48]      dim 0            head.weight [24, 48]  rows (dim 0)
  norm.weight, norm.bias whole, on ranks 0 and 1 % W

--mode helper:  refit.distributed.refit; writes {"report": ...} or {"error": ...} to --out.
--mode missing: as helper, but the last rank leaves out its slice of proj.weight.
--mode die:     as helper, but rank 1 SIGKILLs itself after pushing its first slice.
--mode kill:    plain API: rank 0 begins, broadcasts the id and pushes its shards, the others join;
                after a barrier rank 0 commits (refitd waits for the joined ranks' detach) while
                the other ranks push half their shards, write <out>.pushed and wait to be killed
                (the test SIGKILLs them).
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import models
import refit
from refit.distributed import Shard


def shards_of(model, rank: int, world: int, drop=()):
    params = {n: p.detach() for n, p in model.named_parameters()}
    out = {}
    for name, dim in [("embed.weight", 0), ("proj.weight", 1), ("proj.bias", 0), ("head.weight", 0)]:
        full = params[name]
        start = 0
        for r, part in enumerate(torch.tensor_split(full, world, dim=dim)):
            if r == rank and name not in drop:
                out[name] = Shard(part, dim, start, tuple(full.shape))
            start += part.shape[dim]
    for i, name in enumerate(["norm.weight", "norm.bias"]):
        if i % world == rank:
            out[name] = params[name]
    return out


def error_json(e: BaseException) -> dict:
    return {"type": type(e).__name__, "code_name": getattr(e, "code_name", None), "code": getattr(e, "code", None),
            "message": str(e)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--init", required=True)
    ap.add_argument("--address", required=True)
    ap.add_argument("--mode", choices=["helper", "missing", "kill", "die"], required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{a.init}", rank=a.rank, world_size=a.world)
    model = models.build(models.TOY, a.seed)
    out = Path(a.out)
    client = refit.TrainerClient(a.address)
    result = {"rank": a.rank}
    if a.mode == "die" and a.rank == 1:
        # Rank 1 SIGKILLs itself inside refit.distributed.refit, after its first slice was sent.
        import os
        import signal

        def push_then_die(self, *args, **kwargs):
            push(self, *args, **kwargs)
            self.flush()
            os.kill(os.getpid(), signal.SIGKILL)

        push = refit.RefitSession.push
        refit.RefitSession.push = push_then_die
    if a.mode in ("helper", "missing", "die"):
        drop = ("proj.weight",) if a.mode == "missing" and a.rank == a.world - 1 else ()
        try:
            report = refit.distributed.refit(None, client, models.TOY, shards_of(model, a.rank, a.world, drop))
            result["report"] = {"outcome": report.outcome, "version": report.version, "tensors": report.tensors,
                                "session_id": report.session_id}
        except Exception as e:
            result["error"] = error_json(e)
    else:
        mine = shards_of(model, a.rank, a.world)
        ids = [None]
        if a.rank == 0:
            session = client.session(models.TOY, model.named_parameters())
            ids[0] = session.ids
        dist.broadcast_object_list(ids, src=0)
        if a.rank != 0:
            session = client.join(ids[0])
        else:  # rank 0 pushes its share first: its commit then waits for rank 1, which dies
            for name, s in mine.items():
                if isinstance(s, Shard):
                    session.push(name, s.tensor, dim=s.dim, start=s.start, full_shape=s.full_shape)
                else:
                    session.push(name, s)
        dist.barrier()  # every rank joined before rank 0 commits
        if a.rank != 0:
            items = list(mine.items())
            for name, s in items[: max(1, len(items) // 2)]:
                session.push(name, s.tensor, dim=s.dim, start=s.start, full_shape=s.full_shape)
            session.flush()
            Path(str(out) + ".pushed").write_text("")
            time.sleep(600)  # until killed
            sys.exit(3)
        try:
            report = session.commit()
            result["report"] = {"outcome": report.outcome}
        except Exception as e:
            result["error"] = error_json(e)
        session.close()
    client.close()
    out.write_text(json.dumps(result))
    if a.mode != "kill":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
