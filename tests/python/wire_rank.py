"""One trainer rank of a wire-format-checkpoint refit (test_wire_checkpoint.py spawns two): a
torch.distributed gloo group over a file store; every rank loads the same checkpoint and pushes
its half (rows along dim 0) of every matrix, vectors whole from rank 0, through
refit.distributed.refit(wire_format="checkpoint"), which reduces the NVFP4 global amax over the
group. Writes {"report": ...} or {"error": ...} to --out."""
import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist

import refit
from refit.distributed import Shard


def _load(path: Path):
    """A safetensors file as {name: torch tensor} (BF16/F32), as test_wire_checkpoint._load."""
    import struct

    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    dtypes = {"BF16": torch.bfloat16, "F32": torch.float32}
    out = {}
    for name, e in header.items():
        if name != "__metadata__":
            lo, hi = e["data_offsets"]
            data = bytearray(raw[8 + n + lo:8 + n + hi])
            out[name] = torch.frombuffer(data, dtype=dtypes[e["dtype"]]).reshape(e["shape"]).clone()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--init", required=True)
    ap.add_argument("--address", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{a.init}", rank=a.rank, world_size=a.world)
    weights = _load(Path(a.checkpoint) / "model.safetensors")
    shards = {}
    for name, t in weights.items():
        if name.endswith(".input_scale"):  # the engine's own: refits never carry it
            continue
        if t.dim() >= 2 and t.shape[0] % a.world == 0:
            part = t.chunk(a.world, dim=0)[a.rank].contiguous()
            shards[name] = Shard.even(part, dim=0, index=a.rank, count=a.world)
        elif a.rank == 0:
            shards[name] = t
    client = refit.TrainerClient(a.address)
    try:
        report = refit.distributed.refit(None, client, client.status().model, shards, wire_format="checkpoint")
        result = {"report": {"outcome": report.outcome, "bytes_in": report.bytes_in}}
    except Exception as e:
        result = {"error": str(e)}
    finally:
        client.close()
    Path(a.out).write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
