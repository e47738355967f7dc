"""One rank of a Megatron-core trainer (test_megatron.py spawns tp * pp * ep of them in a gloo
group): it lays out each HF checkpoint of --ckpts as its Megatron-core model chunk holds it
(megatron_layout.py: local layer and expert numbers, its TP shards, "module." wrapped as under
DDP) and pushes that chunk's named parameters as they are through refit.megatron.shards +
refit.distributed.refit. After refit i it writes <out>/rank{r}.step{i}.json and waits for
<out>/go{i} before the next.

--mode refit:       every tensor of every rank;
--mode missing-tp:  tp rank 1 of the last stage (arch["drop_pp"]: of that stage) leaves out its
                    shard of arch["drop"] (default the linear_qkv of its first layer);
--mode missing-pp:  the last pipeline stage pushes nothing;
--mode missing-ep:  ep rank 1 pushes none of its experts;
--mode die:         the last rank SIGKILLs itself after its first push.
"""
import argparse
import json
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file

import megatron_layout
import refit
import refit.megatron


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--init", required=True)
    ap.add_argument("--address", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--ckpts", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--arch", required=True,
                    help="json: family (gqa, deepseek_v3, gpt_oss), layers, heads, groups, head_dim, experts, "
                         "dense_layers, drop (the tensor --mode missing-tp leaves out)")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--mode", default="refit", choices=["refit", "missing-tp", "missing-pp", "missing-ep", "die"])
    a = ap.parse_args()
    torch.set_num_threads(1)
    arch = json.loads(a.arch)
    world = a.tp * a.pp * a.ep
    tp_rank, ep_rank, pp_rank = a.rank % a.tp, (a.rank // a.tp) % a.ep, a.rank // (a.tp * a.ep)
    dist.init_process_group("gloo", init_method=f"file://{a.init}", rank=a.rank, world_size=world)
    out = Path(a.out)
    client = refit.TrainerClient(a.address)
    if a.mode == "die" and a.rank == world - 1:
        push = refit.RefitSession.push

        def push_then_die(self, *args, **kwargs):
            push(self, *args, **kwargs)
            self.flush()
            os.kill(os.getpid(), signal.SIGKILL)

        refit.RefitSession.push = push_then_die
    per_stage = arch["layers"] // a.pp
    experts = arch.get("experts", 0)
    for i, ckpt in enumerate(a.ckpts.split(",")):
        hf = load_file(str(Path(ckpt) / "model.safetensors"))
        family = arch.get("family", "gqa")
        common = dict(layers=arch["layers"], tp=a.tp, tp_rank=tp_rank, pp=a.pp, pp_rank=pp_rank, ep=a.ep,
                      ep_rank=ep_rank, experts=experts)
        heads = dict(heads=arch.get("heads"), groups=arch.get("groups"), head_dim=arch.get("head_dim"))
        if family == "deepseek_v3":
            chunk = megatron_layout.deepseek_chunk(hf, dense_layers=arch.get("dense_layers", 1), **common)
        elif family == "gpt_oss":
            chunk = megatron_layout.gpt_oss_chunk(hf, **heads, **common)
        elif family == "qwen35":
            chunk = megatron_layout.qwen35_chunk(hf, linear=arch["linear"], **heads, **common)
        else:
            chunk = megatron_layout.megatron_chunk(hf, **heads, **common)
        if a.mode == "missing-tp" and tp_rank == 1 and pp_rank == arch.get("drop_pp", a.pp - 1):
            del chunk[arch.get("drop", "decoder.layers.0.self_attention.linear_qkv.weight")]
        if a.mode == "missing-pp" and pp_rank == a.pp - 1:
            chunk = {}
        if a.mode == "missing-ep" and ep_rank == 1:
            chunk = {n: t for n, t in chunk.items() if ".mlp.experts." not in n}
        # The router's expert_bias is a buffer in Megatron-core, next to runtime-state buffers.
        buffers = [("module." + n, chunk.pop(n)) for n in [n for n in chunk if n.endswith(".expert_bias")]]
        buffers += [("module." + n[:-len("expert_bias")] + "local_tokens_per_expert", torch.zeros(experts))
                    for n, _ in list(buffers)]
        # A gated delta-net's out_norm is the checkpoint's linear_attn.norm minus 1 (zero-centred):
        # refitd maps no value transforms, so the trainer pushes that norm under its checkpoint name.
        own = {}
        for n in [n for n in chunk if n.endswith(".self_attention.out_norm.weight")]:
            t = chunk.pop(n)
            layer = int(n.split(".")[2]) + pp_rank * per_stage
            if tp_rank == 0 and ep_rank == 0:
                own[f"model.layers.{layer}.linear_attn.norm.weight"] = (t.float() + 1).to(t.dtype)
        named = [("module." + n, torch.nn.Parameter(t, requires_grad=False)) for n, t in chunk.items()]
        # gpt-oss experts are whole on each expert-parallel rank (expert tensor-parallel size 1).
        etp = dict(etp_rank=0, etp_size=1, edp_rank=tp_rank) if family == "gpt_oss" else {}
        shards = refit.megatron.shards(named, tp_rank=tp_rank, tp_size=a.tp, layer_offset=pp_rank * per_stage,
                                       ep_rank=ep_rank, num_local_experts=experts // a.ep if experts else 0,
                                       named_buffers=buffers, pp_rank=pp_rank, **etp)
        shards.update(own)
        result = {"rank": a.rank, "pushed": sorted(shards)}
        try:
            report = refit.distributed.refit(None, client, a.model, shards)
            result["report"] = {"outcome": report.outcome, "version": report.version, "tensors": report.tensors,
                                "bytes_in": report.bytes_in, "total_ms": report.times_ms.get("total")}
        except Exception as e:  # noqa: BLE001 - reported to the test
            result["error"] = {"type": type(e).__name__, "code_name": getattr(e, "code_name", None), "message": str(e)}
        (out / f"rank{a.rank}.step{i}.json").write_text(json.dumps(result))
        if "error" in result:
            break
        go = out / f"go{i}"
        while not go.exists():
            time.sleep(0.02)
    client.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
