"""Megatron-core trainers (spec `source: {layout: megatron}`, refit.megatron): tp=2 x pp=2
(x ep=2 for the MoE families: Qwen3-MoE, DeepSeek-V3 with MLA, shared experts and a dense first
layer, gpt-oss with attention sinks, biases and stacked experts; Qwen3.5 with gated delta-net,
gated attention and an MTP layer) trainer processes in a gloo group, each holding its Megatron-core
model chunk laid out from an HF checkpoint by megatron_layout.py (written from Megatron-core's
and Megatron-Bridge's conventions, not from refitd's mapping), push its named_parameters() as
they are. After each of three refits the engine's bytes (as refitd reads them) equal
`refitctl convert --engine-layout` of that HF checkpoint; a missing TP shard, pipeline stage or
expert-parallel rank is refused naming the tensor and the missing rows / layers / experts, and
a rank killed mid-refit aborts it; the engine keeps its bytes in both cases. The specs are the
shipped ones, their sizes read from each checkpoint's config.json; the Llama-3 spec's engine runs
as its two engine ranks."""
import ctypes
import importlib.util
import json
import os
import signal
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import BIN, HERE, PYTHON_PKG, SRC_DIR, ExampleEngines, needs_torch, spec_tp_size, wait_for

pytestmark = needs_torch

REFITCTL = BIN / "tools/refitctl"
MODELS = SRC_DIR / "deploy/models"
SPECS = SRC_DIR / "tests/integration/specs"

LLAMA = {"layers": 2, "heads": 4, "groups": 2, "head_dim": 128}
QWEN3_MOE = {"layers": 2, "heads": 4, "groups": 2, "head_dim": 64, "experts": 4}
# make_checkpoints.py's deepseek_v3: MLA (2 heads), layer 0 dense, layer 1 MoE with 4 routed and
# shared experts; its gpt_oss: 4 heads in 2 query groups of head_dim 64, 4 experts with biases.
DEEPSEEK_V3 = {"family": "deepseek_v3", "layers": 2, "experts": 4, "dense_layers": 1,
               "drop": "decoder.layers.0.self_attention.linear_kv_up_proj.weight"}
GPT_OSS = {"family": "gpt_oss", "layers": 2, "heads": 4, "groups": 2, "head_dim": 64, "experts": 4}
# make_checkpoints.py's qwen35 (layer 0 gated delta-net, layer 1 gated full attention, dense MLPs,
# one MTP layer) with its 2 x 128-dim query heads read as 4 of 64 in 2 groups (qwen35_checkpoint).
# The sizes those two checkpoints override besides their family's small ones (make_checkpoints.py).
GQA_4_2_64 = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}
QWEN35 = {"family": "qwen35", "layers": 2, "heads": 4, "groups": 2, "head_dim": 64,
          "linear": {"num_key_heads": 2, "key_head_dim": 64, "num_value_heads": 4, "value_head_dim": 64},
          "drop": "decoder.layers.0.self_attention.in_proj.weight", "drop_pp": 0}


def _builder():
    spec = importlib.util.spec_from_file_location("make_checkpoints", SPECS / "make_checkpoints.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def llama_checkpoint(out: Path, seed: int) -> Path:
    subprocess.run([sys.executable, str(SPECS / "make_checkpoints.py"), "llama3", str(out), "--seed", str(seed)],
                   check=True)
    return out


def family_checkpoint(family):
    def make(out: Path, seed: int) -> Path:
        subprocess.run([sys.executable, str(SPECS / "make_checkpoints.py"), family, str(out), "--seed", str(seed)],
                       check=True)
        return out

    return make


def qwen3_moe_checkpoint(out: Path, seed: int) -> Path:
    """The qwen3_moe family with 4 heads in 2 query groups (head_dim 64): Megatron-core needs
    num_query_groups divisible by tp. Its config.json says so; the spec reads it from there."""
    return Path(_builder().make("qwen3_moe", str(out), seed, GQA_4_2_64))


def qwen35_checkpoint(out: Path, seed: int) -> Path:
    """The qwen35 family with 4 query heads in 2 groups of head_dim 64 (q/k/v/o of the same shapes
    as its 2 x 128; Megatron-core needs num_query_groups divisible by tp)."""
    return Path(_builder().make("qwen35", str(out), seed, GQA_4_2_64))


def engine_layout_checksums(spec: Path, ckpt: Path, out: Path) -> dict:
    """{engine parameter: refitd checksum} of `refitctl convert --engine-layout`'s output; for a
    spec of several engine ranks, every rank's ("rank<R>/<name>", as refitd names them)."""
    import refit._native as native

    ranks = spec_tp_size(spec)
    sums = {}
    for r in range(ranks):
        rank_out = out / f"rank{r}" if ranks > 1 else out
        args = [str(REFITCTL), "convert", "--engine-layout", "--spec", str(spec), str(ckpt), str(rank_out)]
        if ranks > 1:
            args[2:2] = ["--tp-rank", str(r), "--tp-size", str(ranks)]
        p = subprocess.run(args, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        raw = (rank_out / "engine.safetensors").read_bytes()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        buf = ctypes.create_string_buffer(raw[8 + n:], len(raw) - 8 - n)
        lib = native.lib()
        prefix = f"rank{r}/" if ranks > 1 else ""
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            lo, hi = meta["data_offsets"]
            sums[prefix + name] = lib.refit_checksum64(ctypes.addressof(buf) + lo, hi - lo, 0)
    return sums


class Node:
    """refitd with a shipped spec, its sizes from `ckpt`'s config.json, and the example engine
    (one process per engine rank of the spec) holding `ckpt` in that spec's layout."""

    def __init__(self, tmp: Path, spec: Path, ckpt: Path):
        self.tmp = tmp
        self.sock = tmp / "refitd.sock"
        self.address = f"unix:{self.sock}"
        cfg = tmp / "refitd.yaml"
        cfg.write_text(f"listen: {self.address}\nmodel_config: {ckpt / 'config.json'}\n")
        self.log = tmp / "refitd.log"
        self.engines = None
        self.daemon = subprocess.Popen([str(BIN / "src/server/refitd"), "--config", str(cfg), "--model-spec", str(spec)],
                                       stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        wait_for(lambda: "event=listening" in self.log.read_text() or self.daemon.poll() is not None,
                 what="refitd listening")
        assert self.daemon.poll() is None, self.log.read_text()
        self.engines = ExampleEngines(tmp, self.address, spec, ckpt, name="mg")

    def checksums(self):
        import refit

        with refit.TrainerClient(self.address) as c:
            return c.checksums()

    def close(self):
        if self.engines is not None:
            self.engines.stop(kill=True)
        if self.daemon.poll() is None:
            self.daemon.kill()
            self.daemon.wait()


@pytest.fixture
def node(tmp_path):
    made = []

    def make(spec, ckpt):
        d = tmp_path / f"node{len(made)}"
        d.mkdir()
        made.append(Node(d, spec, ckpt))
        return made[-1]

    yield make
    for n in made:
        n.close()


class Ranks:
    def __init__(self, tmp: Path, node: Node, model: str, arch: dict, ckpts, tp=2, pp=2, ep=1, mode="refit"):
        self.out = tmp / f"ranks-{mode}-{uuid.uuid4().hex[:6]}"
        self.out.mkdir()
        self.world = tp * pp * ep
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PYTHON_PKG), str(HERE), os.environ.get("PYTHONPATH", "")]))
        self.procs = [subprocess.Popen(
            [sys.executable, str(HERE / "megatron_rank.py"), "--rank", str(r), "--init", str(self.out / "store"),
             "--address", node.address, "--model", model, "--ckpts", ",".join(str(c) for c in ckpts),
             "--out", str(self.out), "--arch", json.dumps(arch), "--tp", str(tp), "--pp", str(pp), "--ep", str(ep),
             "--mode", mode],
            stdout=open(self.out / f"rank{r}.log", "w"), stderr=subprocess.STDOUT, env=env) for r in range(self.world)]

    def step(self, i, ranks=None, timeout=180):
        ranks = range(self.world) if ranks is None else ranks
        files = [self.out / f"rank{r}.step{i}.json" for r in ranks]
        deadline = time.monotonic() + timeout
        while not all(f.exists() for f in files):
            for r, p in enumerate(self.procs):
                if r in ranks and p.poll() is not None and not files[list(ranks).index(r)].exists():
                    raise AssertionError(f"rank {r} exited {p.returncode}: " + (self.out / f"rank{r}.log").read_text())
            if time.monotonic() > deadline:
                raise AssertionError("ranks did not finish step %d: %s" % (
                    i, {r: (self.out / f"rank{r}.log").read_text()[-2000:] for r in ranks}))
            time.sleep(0.05)
        time.sleep(0.05)
        return [json.loads(f.read_text()) for f in files]

    def go(self, i):
        (self.out / f"go{i}").write_text("")

    def close(self, timeout=60):
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *_):
        self.close(timeout=60 if exc_type is None else 0)  # a failed check: the ranks wait for go files


def assert_engine_equals(node, expected: dict, version: int):
    got_version, got = node.checksums()
    assert got_version == version
    compared = 0
    for name, (checksum, _) in got.items():
        if name.endswith("input_scale"):  # refit: never; the engine keeps its own
            continue
        assert name in expected, name
        assert checksum == expected[name], f"engine parameter {name} differs from refitctl convert --engine-layout"
        compared += 1
    assert compared == len([n for n in expected if not n.endswith("input_scale")])


FAMILIES = {
    "llama3": ("llama3_fp8.yaml", "llama3-fp8", LLAMA, llama_checkpoint, 1),
    # llm-compressor FP8_DYNAMIC at engine TP 2: row-parallel o_proj / down_proj per-channel FP8
    # with the whole [N, 1] scale (F32) on each engine rank.
    "llama3_ct": ("llama3_ct_fp8_dynamic.yaml", "llama3-ct-fp8-dynamic", LLAMA, family_checkpoint("llama3_ct"), 1),
    "qwen3_moe": ("qwen3_moe_nvfp4.yaml", "qwen3-moe-nvfp4", QWEN3_MOE, qwen3_moe_checkpoint, 2),
    "deepseek_v3": ("deepseek_v3_fp8_ue8m0.yaml", "deepseek-v3-fp8-ue8m0", DEEPSEEK_V3,
                    family_checkpoint("deepseek_v3"), 2),
    "gpt_oss": ("gpt_oss_mxfp4.yaml", "gpt-oss-mxfp4", GPT_OSS, family_checkpoint("gpt_oss"), 2),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_megatron_ranks_refit_equals_offline_conversion(family, node, tmp_path):
    spec_name, model, arch, make, ep = FAMILIES[family]
    spec = MODELS / spec_name
    ckpts = [make(tmp_path / f"ckpt{s}", s) for s in range(4)]
    expected = [engine_layout_checksums(spec, c, tmp_path / f"conv{i}") for i, c in enumerate(ckpts)]
    n = node(spec, ckpts[0])
    with Ranks(tmp_path, n, model, arch, ckpts[1:], ep=ep) as ranks:
        for i in range(3):
            results = ranks.step(i)
            reports = [r.get("report") for r in results]
            assert all(r is not None for r in reports), results
            assert reports[0]["outcome"] == "committed" and reports[0]["version"] == i + 1, reports
            assert all(r == reports[0] for r in reports)
            assert_engine_equals(n, expected[i + 1], i + 1)
            ranks.go(i)
    # Every rank pushed only its own part: no name twice unless sliced (its TP shards).
    pushed = [set(r["pushed"]) for r in results]
    assert sum(len(p) for p in pushed) > len(set().union(*pushed))  # TP slices share names


def test_megatron_tp2_trainer_reshards_into_a_tp4_engine(node, tmp_path):
    """Megatron-core trainer ranks at TP=2 x PP=2, each pushing its own shards, into an engine of
    four ranks (the shipped llama3_fp8 spec at tensor_parallel size 4; 4 key/value heads and an
    intermediate size of 1024, so every engine rank's rows are whole 128-blocks): after each of
    three refits every engine rank holds `refitctl convert --engine-layout --tp-rank R`."""
    import re

    spec = tmp_path / "llama3_fp8_tp4.yaml"
    spec.write_text(re.sub(r"^tensor_parallel:.*$", "tensor_parallel: {size: 4}",
                           (MODELS / "llama3_fp8.yaml").read_text(), flags=re.M))
    sizes = {"num_key_value_heads": 4, "intermediate_size": 1024}
    ckpts = [Path(_builder().make("llama3", str(tmp_path / f"ckpt{s}"), s, sizes)) for s in range(4)]
    expected = [engine_layout_checksums(spec, c, tmp_path / f"conv{i}") for i, c in enumerate(ckpts)]
    assert len({n.split("/", 1)[0] for n in expected[0]}) == 4
    n = node(spec, ckpts[0])
    arch = {"layers": 2, "heads": 4, "groups": 4, "head_dim": 128}
    with Ranks(tmp_path, n, "llama3-fp8", arch, ckpts[1:], tp=2, pp=2) as ranks:
        for i in range(3):
            reports = [r.get("report") for r in ranks.step(i)]
            assert all(r is not None for r in reports), reports
            assert reports[0]["outcome"] == "committed" and reports[0]["version"] == i + 1, reports
            assert_engine_equals(n, expected[i + 1], i + 1)
            ranks.go(i)


MISSING = {
    # family, mode -> fragments the refusal must contain
    ("llama3", "missing-tp"): ["model.layers.1.self_attn.q_proj.weight",
                               "from Megatron-core 'decoder.layers.1.self_attention.linear_qkv.weight'",
                               "missing [256, 512)"],
    ("llama3", "missing-pp"): ["model.layers.1.", "lm_head.weight"],
    ("qwen3_moe", "missing-ep"): ["model.layers.0.mlp.experts.2.", "model.layers.1.mlp.experts.3."],
    # kv_b_proj: 2 heads x (128 + 128) rows, tp rank 1's head missing
    ("deepseek_v3", "missing-tp"): ["model.layers.1.self_attn.kv_b_proj.weight",
                                    "from Megatron-core 'decoder.layers.1.self_attention.linear_kv_up_proj.weight'",
                                    "missing [256, 512)"],
    # the stacked experts: entries 2 and 3 (ep rank 1's) missing
    ("gpt_oss", "missing-ep"): ["model.layers.0.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj_bias",
                                "missing [2, 4)"],
}


@pytest.mark.parametrize("family,mode", sorted(MISSING))
def test_a_missing_shard_stage_or_expert_rank_is_refused_naming_it(family, mode, node, tmp_path):
    spec_name, model, arch, make, ep = FAMILIES[family]
    spec = MODELS / spec_name
    ckpts = [make(tmp_path / f"ckpt{s}", s) for s in range(2)]
    n = node(spec, ckpts[0])
    before = n.checksums()
    with Ranks(tmp_path, n, model, arch, ckpts[1:], ep=ep, mode=mode) as ranks:
        results = ranks.step(0)
    errors = [r.get("error") for r in results]
    assert all(e is not None and e["code_name"] == "FAILED_PRECONDITION" for e in errors), results
    for fragment in MISSING[(family, mode)]:
        assert fragment in errors[0]["message"], errors[0]["message"]
    assert n.checksums() == before


def test_qwen35_megatron_ranks_refit_and_a_missing_shard(node, tmp_path):
    """Qwen3.5 (gated delta-net, gated attention, MTP): tp=2 x pp=2 ranks, three refits equal to
    the offline conversion, then tp rank 1 of stage 0 without its in_proj shard: refused naming
    the checkpoint tensors and rows, the engine unchanged."""
    spec = MODELS / "qwen35_mxfp8.yaml"
    ckpts = [qwen35_checkpoint(tmp_path / f"ckpt{s}", s) for s in range(4)]
    expected = [engine_layout_checksums(spec, c, tmp_path / f"conv{i}") for i, c in enumerate(ckpts)]
    n = node(spec, ckpts[0])
    with Ranks(tmp_path, n, "qwen35-mxfp8", QWEN35, ckpts[1:]) as ranks:
        for i in range(3):
            results = ranks.step(i)
            reports = [r.get("report") for r in results]
            assert all(r is not None for r in reports), results
            assert reports[0]["outcome"] == "committed" and reports[0]["version"] == i + 1, reports
            assert_engine_equals(n, expected[i + 1], i + 1)
            ranks.go(i)
    pushed = set().union(*(set(r["pushed"]) for r in results))
    assert "decoder.layers.0.self_attention.in_proj.weight" in pushed
    assert "mtp.layers.0.transformer_layer.self_attention.linear_qkv.weight" in pushed
    before = n.checksums()
    with Ranks(tmp_path, n, "qwen35-mxfp8", QWEN35, ckpts[1:2], mode="missing-tp") as ranks:
        results = ranks.step(0)
    errors = [r.get("error") for r in results]
    assert all(e is not None and e["code_name"] == "FAILED_PRECONDITION" for e in errors), results
    # tp rank 1's key head: the second half of each regrouped tensor
    for fragment in ("tensor 'model.layers.0.linear_attn.in_proj_qkvz.weight' (from Megatron-core "
                     "'decoder.layers.0.self_attention.in_proj.weight'): slices cover 384 of 768 rows of dimension 0; "
                     "missing [384, 768)",
                     "tensor 'model.layers.0.linear_attn.in_proj_ba.weight'", "missing [4, 8)"):
        assert fragment in errors[0]["message"], errors[0]["message"]
    assert n.checksums() == before


def test_a_rank_killed_mid_refit_aborts_it(node, tmp_path):
    spec = MODELS / "llama3_fp8.yaml"
    ckpts = [llama_checkpoint(tmp_path / f"ckpt{s}", s) for s in range(2)]
    n = node(spec, ckpts[0])
    before = n.checksums()
    with Ranks(tmp_path, n, "llama3-fp8", LLAMA, ckpts[1:], mode="die") as ranks:
        wait_for(lambda: ranks.procs[-1].poll() is not None, timeout=120, what="the last rank's death")
        assert ranks.procs[-1].returncode == -signal.SIGKILL
        for p in ranks.procs[:-1]:  # the survivors' next collective fails (gloo: peer gone)
            p.wait(timeout=120)
    assert n.checksums() == before
    # refitd is not wedged: the next refit from all ranks commits.
    expected = engine_layout_checksums(spec, ckpts[1], tmp_path / "conv1")
    with Ranks(tmp_path, n, "llama3-fp8", LLAMA, ckpts[1:]) as again:
        results = again.step(0)
        assert results[0]["report"]["outcome"] == "committed", results
        assert_engine_equals(n, expected, results[0]["report"]["version"])
        again.go(0)


def test_shards_helper_applies_megatron_conventions_only():
    import torch

    import refit.megatron
    from refit.distributed import Shard

    named = [
        ("module.module.decoder.layers.0.self_attention.linear_qkv.weight", torch.zeros(6, 4)),
        ("module.decoder.layers.1.self_attention.linear_proj.weight", torch.zeros(4, 3)),
        ("decoder.layers.1.self_attention.linear_qkv.layer_norm_weight", torch.ones(4)),
        ("decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight", torch.zeros(8, 4)),
        ("decoder.layers.0.mlp.experts.linear_fc2.weight0", torch.zeros(4, 2)),
        ("decoder.layers.0.mlp.router.weight", torch.zeros(4, 4)),
    ]
    tp1 = refit.megatron.shards(named, tp_rank=1, tp_size=2, layer_offset=4, ep_rank=1, num_local_experts=2)
    # Replicated tensors are tp rank 0's; non-expert tensors ep rank 0's: only experts remain here.
    assert sorted(tp1) == ["decoder.layers.4.mlp.experts.linear_fc2.weight2",
                           "decoder.layers.4.mlp.experts.local_experts.3.linear_fc1.weight"]
    fc1 = tp1["decoder.layers.4.mlp.experts.local_experts.3.linear_fc1.weight"]
    assert isinstance(fc1, Shard) and (fc1.dim, fc1.start, fc1.full_shape) == (0, 8, (16, 4))
    fc2 = tp1["decoder.layers.4.mlp.experts.linear_fc2.weight2"]
    assert (fc2.dim, fc2.start, fc2.full_shape) == (1, 2, (4, 4))
    tp0 = refit.megatron.shards(named, tp_rank=0, tp_size=2, layer_offset=4, ep_rank=0, num_local_experts=2)
    assert tp0["decoder.layers.5.self_attention.linear_qkv.layer_norm_weight"].shape == (4,)  # whole
    assert tp0["decoder.layers.4.mlp.router.weight"].shape == (4, 4)
    proj = tp0["decoder.layers.5.self_attention.linear_proj.weight"]
    assert (proj.dim, proj.start, proj.full_shape) == (1, 0, (4, 6))
    qkv = tp0["decoder.layers.4.self_attention.linear_qkv.weight"]
    assert (qkv.dim, qkv.start, qkv.full_shape) == (0, 0, (12, 4))
    # A parameter's own Megatron-core attributes win over the name.
    p = torch.nn.Parameter(torch.zeros(4, 6), requires_grad=False)
    p.tensor_model_parallel, p.partition_dim = True, 1
    custom = refit.megatron.shards([("decoder.layers.0.mlp.linear_fc1.weight", p)], tp_rank=1, tp_size=2)
    assert custom["decoder.layers.0.mlp.linear_fc1.weight"].dim == 1


def test_shards_helper_mla_gpt_oss_buffers_and_expert_copies():
    import torch

    import refit.megatron

    named = [
        ("decoder.layers.0.self_attention.linear_q_down_proj.weight", torch.zeros(8, 4)),   # TE: duplicated
        ("decoder.layers.0.self_attention.linear_kv_up_proj.weight", torch.zeros(6, 4)),
        ("decoder.layers.0.self_attention.core_attention.softmax_offset", torch.zeros(2)),
        ("decoder.layers.0.mlp.shared_experts.linear_fc1.weight", torch.zeros(4, 4)),
        ("decoder.layers.0.mlp.experts.linear_fc1.bias1", torch.zeros(4)),
        ("decoder.layers.0.mlp.experts.linear_fc2.bias1", torch.zeros(4)),
    ]
    buffers = [("decoder.layers.0.mlp.router.expert_bias", torch.zeros(4)),
               ("decoder.layers.0.mlp.router.local_tokens_per_expert", torch.zeros(4))]
    tp0 = refit.megatron.shards(named, tp_rank=0, tp_size=2, ep_rank=1, num_local_experts=2, etp_rank=0, etp_size=1,
                                named_buffers=buffers)
    # ep rank 1: only its experts (global 3), whole with expert TP 1; a row-parallel bias is whole too.
    assert sorted(tp0) == ["decoder.layers.0.mlp.experts.linear_fc1.bias3", "decoder.layers.0.mlp.experts.linear_fc2.bias3"]
    assert all(not hasattr(v, "full_shape") for v in tp0.values())
    ep0 = refit.megatron.shards(named, tp_rank=1, tp_size=2, ep_rank=0, num_local_experts=2, named_buffers=buffers)
    assert "decoder.layers.0.self_attention.linear_q_down_proj.weight" not in ep0  # replicated: tp rank 0's
    assert "decoder.layers.0.mlp.router.expert_bias" not in ep0 and "decoder.layers.0.mlp.router.local_tokens_per_expert" not in ep0
    kv = ep0["decoder.layers.0.self_attention.linear_kv_up_proj.weight"]
    assert (kv.dim, kv.start, kv.full_shape) == (0, 6, (12, 4))
    sinks = ep0["decoder.layers.0.self_attention.core_attention.softmax_offset"]
    assert (sinks.dim, sinks.start, sinks.full_shape) == (0, 2, (4,))
    fc1 = ep0["decoder.layers.0.mlp.shared_experts.linear_fc1.weight"]
    assert (fc1.dim, fc1.start) == (0, 4)
    # A row-parallel expert bias is replicated over expert TP: etp rank 0 pushes it, the fc1 bias is split.
    assert "decoder.layers.0.mlp.experts.linear_fc2.bias1" not in ep0
    assert ep0["decoder.layers.0.mlp.experts.linear_fc1.bias1"].start == 4
    tp0_ep0 = refit.megatron.shards(named, tp_rank=0, tp_size=2, ep_rank=0, num_local_experts=2, named_buffers=buffers)
    assert tp0_ep0["decoder.layers.0.mlp.router.expert_bias"].shape == (4,)
    assert "decoder.layers.0.mlp.router.local_tokens_per_expert" not in tp0_ep0
    # Expert data-parallel copies push nothing of their experts.
    copy = refit.megatron.shards(named, tp_rank=1, tp_size=2, ep_rank=1, num_local_experts=2, etp_rank=0, etp_size=1,
                                 edp_rank=1)
    assert copy == {}


def test_shards_helper_gated_delta_net_mtp_and_the_mtp_stage_embedding_copy():
    import torch

    import refit.megatron

    a_log = torch.nn.Parameter(torch.zeros(2), requires_grad=False)
    a_log.tensor_model_parallel = True  # gated_delta_net.py sets no partition_dim on it
    named = [
        ("decoder.layers.0.self_attention.in_proj.weight", torch.zeros(12, 4)),
        ("decoder.layers.0.self_attention.conv1d.weight", torch.zeros(6, 1, 4)),
        ("decoder.layers.0.self_attention.A_log", a_log),
        ("decoder.layers.0.self_attention.out_proj.weight", torch.zeros(4, 2)),
        ("mtp.layers.0.eh_proj.weight", torch.zeros(2, 8)),
        ("mtp.layers.0.enorm.weight", torch.ones(4)),
        ("embedding.word_embeddings.weight", torch.zeros(6, 4)),
    ]
    last = refit.megatron.shards(named, tp_rank=1, tp_size=2, layer_offset=1, pp_rank=1)
    assert "embedding.word_embeddings.weight" not in last and "mtp.layers.0.enorm.weight" not in last
    dims = {n: (v.dim, v.start, tuple(v.full_shape)) for n, v in last.items()}
    assert dims == {"decoder.layers.1.self_attention.in_proj.weight": (0, 12, (24, 4)),
                    "decoder.layers.1.self_attention.conv1d.weight": (0, 6, (12, 1, 4)),
                    "decoder.layers.1.self_attention.A_log": (0, 2, (4,)),
                    "decoder.layers.1.self_attention.out_proj.weight": (1, 2, (4, 4)),
                    "mtp.layers.0.eh_proj.weight": (0, 2, (4, 8))}
    first = refit.megatron.shards(named, tp_rank=0, tp_size=2, pp_rank=0)
    assert first["embedding.word_embeddings.weight"].start == 0 and "mtp.layers.0.enorm.weight" in first
