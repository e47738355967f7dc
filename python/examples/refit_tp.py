# python/examples/refit_tp.py: torchrun --nproc-per-node 2 refit_tp.py unix:/run/refitd/refitd.sock
import sys

import torch
import torch.distributed as dist

import refit
from refit.distributed import Shard

HIDDEN, FFN = 256, 1024


def main(address):
    dist.init_process_group("gloo")  # NCCL works too (set the CUDA device first)
    rank, tp = dist.get_rank(), dist.get_world_size()
    # This rank's tensor-parallel shards of one MLP block, as a Megatron-style trainer holds them.
    torch.manual_seed(rank)
    up = torch.randn(FFN // tp, HIDDEN).bfloat16()    # column-parallel: its rows of up_proj
    down = torch.randn(HIDDEN, FFN // tp).bfloat16()  # row-parallel: its columns of down_proj
    norm = torch.ones(HIDDEN).bfloat16()              # replicated on every rank
    client = refit.TrainerClient(address)  # one per rank: its own connection and data plane
    for step in range(3):
        with torch.no_grad():  # stands in for a training step
            up.mul_(0.5)
            down.add_(1.0)
        shards = {
            "model.layers.0.mlp.up_proj.weight": Shard.even(up, dim=0, index=rank, count=tp),
            "model.layers.0.mlp.down_proj.weight": Shard(down, dim=1, start=rank * (FFN // tp),
                                                         full_shape=(HIDDEN, FFN)),
        }
        if rank == 0:  # a replicated tensor is pushed whole, by one rank
            shards["model.layers.0.post_attention_layernorm.weight"] = norm
        try:
            report = refit.distributed.refit(None, client, "my-model", shards)  # None: the default group
        except refit.RefitRefused as e:  # on every rank: e.g. a missing slice, named with its range
            print(f"rank {rank}: refused ({e.code_name}): {e}")
            raise
        if rank == 0:
            print(f"step {step}: engine at version {report.version}, {report.bytes_in} bytes in, "
                  f"{report.times_ms['total']:.1f} ms")
    client.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
