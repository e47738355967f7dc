"""Every example spec of deploy/models/ end to end (issue: model specs for real families), as
shipped, its sizes from the small checkpoint's config.json: three consecutive refits and one
partial refit through the real host path leave the engine (both engine ranks of the tensor-parallel
Llama-3 spec) holding exactly the engine layout of `refitctl convert`'s output for the same
checkpoint — fused, stacked, sharded and laid-out parameters, derived Gemma norms, kept input
scales — and a stranded fused member or a missing expert is refused before any engine byte is
written."""
import subprocess

import pytest

import refit_harness as h
from conftest import REFITD, SRC, convert, make_checkpoint

MODELS = SRC / "deploy/models"

# family -> (spec, partial refit patterns, tensor to drop, error the drop must produce)
FAMILIES = {
    "llama3": (
        "llama3_fp8.yaml",
        ["model.layers.0.{n:input_layernorm,post_attention_layernorm}.weight",
         "model.layers.1.self_attn.{p:q,k,v}_proj.weight"],
        "model.layers.0.mlp.up_proj.weight",
        # tensor_parallel.size 2: two engine ranks, each missing its part
        "incomplete: engine parameter 'rank0/model.layers.0.mlp.gate_up_proj.weight' lacks "
        "'rank0/model.layers.0.mlp.up_proj.weight'",
    ),
    "qwen3_moe": (
        "qwen3_moe_nvfp4.yaml",
        ["model.layers.1.mlp.experts.{E}.{p:gate,up}_proj.weight", "model.layers.0.input_layernorm.weight"],
        "model.layers.1.mlp.experts.2.down_proj.weight",
        "incomplete: engine parameter 'model.layers.1.mlp.experts.w2_weight' lacks "
        "'model.layers.1.mlp.experts.2.down_proj.weight'",
    ),
    "deepseek_v3": (
        "deepseek_v3_fp8_ue8m0.yaml",
        ["model.layers.1.self_attn.{p:q_a_proj,kv_a_proj_with_mqa}.weight",
         "model.layers.1.self_attn.{n:q_a_layernorm,kv_a_layernorm}.weight"],
        "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
        "incomplete: engine parameter 'model.layers.0.self_attn.fused_qkv_a_proj_with_mqa.weight' lacks "
        "'model.layers.0.self_attn.kv_a_proj_with_mqa.weight'",
    ),
    "gpt_oss": (
        "gpt_oss_mxfp4.yaml",
        ["model.layers.0.mlp.experts.{t:gate_up_proj,gate_up_proj_bias}", "model.layers.1.input_layernorm.weight"],
        "model.layers.1.mlp.experts.down_proj",
        "missing: 'model.layers.1.mlp.experts.down_proj_blocks'",
    ),
    # llm-compressor FP8_DYNAMIC (compressed-tensors per-channel FP8), tensor_parallel.size 2: o_proj
    # and down_proj split along K with their [N, 1] scales whole on both ranks, scales held F32.
    "llama3_ct": (
        "llama3_ct_fp8_dynamic.yaml",
        ["model.layers.0.{n:input_layernorm,post_attention_layernorm}.weight",
         "model.layers.1.self_attn.{p:q,k,v}_proj.weight"],
        "model.layers.0.mlp.up_proj.weight",
        "incomplete: engine parameter 'rank0/model.layers.0.mlp.gate_up_proj.weight' lacks "
        "'rank0/model.layers.0.mlp.up_proj.weight'",
    ),
    # Absorbed MLA: a partial refit of kv_b_proj rewrites its derived w_kc / w_vc.
    "deepseek_v3_absorbed": (
        "deepseek_v3_fp8_absorbed.yaml",
        ["model.layers.1.self_attn.kv_b_proj.weight",
         "model.layers.0.self_attn.{p:q_a_proj,kv_a_proj_with_mqa}.weight"],
        "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
        "incomplete: engine parameter 'model.layers.0.self_attn.fused_qkv_a_proj_with_mqa.weight' lacks "
        "'model.layers.0.self_attn.kv_a_proj_with_mqa.weight'",
    ),
    # The TRT-LLM MXFP4 MoE layout: padded, row-pair swapped and shuffled experts.
    "gpt_oss_trtllm": (
        "gpt_oss_mxfp4_trtllm.yaml",
        ["model.layers.0.mlp.experts.{t:gate_up_proj,gate_up_proj_bias}", "model.layers.1.input_layernorm.weight"],
        "model.layers.1.mlp.experts.down_proj",
        "missing: 'model.layers.1.mlp.experts.down_proj_blocks'",
    ),
    "qwen35": (
        "qwen35_mxfp8.yaml",
        ["{m:model,mtp}.layers.{L}.{n:input_layernorm,post_attention_layernorm}.weight", "model.norm.weight",
         "mtp.layers.0.mlp.{p:gate,up}_proj.weight"],
        "mtp.layers.0.mlp.gate_proj.weight",
        "incomplete: engine parameter 'mtp.layers.0.mlp.gate_up_proj.weight' lacks "
        "'mtp.layers.0.mlp.gate_proj.weight'",
    ),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_refits_match_refitctl_convert(family, family_node, tmp_path):
    spec_file, partial, drop, drop_error = FAMILIES[family]
    spec = str(MODELS / spec_file)
    ckpts = [make_checkpoint(family, tmp_path / f"ckpt{s}", s) for s in range(4)]
    conv = [convert(spec, c, tmp_path / f"conv{i}") for i, c in enumerate(ckpts)]
    node = family_node(spec, ckpts[0])

    # Three consecutive full refits, each with fresh weights.
    for i in (1, 2, 3):
        p, lines = node.trainer(ckpts[i], "--expected", str(conv[i]))
        assert p.returncode == 0, p.stdout + p.stderr
        assert lines[0]["outcome"] == "committed", lines
        assert lines[0]["engine_matches_expected"], lines
    assert [r["version"] for r in node.resumed()] == [1, 2, 3]

    # The trainer supplies every tensor's amax (single-pass NVFP4): the same engine bytes.
    p, lines = node.trainer(ckpts[1], "--expected", str(conv[1]), "--measure-amax")
    assert p.returncode == 0, p.stdout + p.stderr
    assert lines[0]["outcome"] == "committed" and lines[0]["engine_matches_expected"], lines

    # A partial refit of whole parameters: exactly those (and what derives from them) change.
    only = [a for pat in partial for a in ("--only", pat)]
    p, lines = node.trainer(ckpts[0], "--expected", str(conv[0]), *only)
    assert p.returncode == 0, p.stdout + p.stderr
    assert lines[0]["outcome"] == "committed" and lines[0]["engine_matches_expected"], lines

    # A stranded fused member / missing expert is refused; no engine byte changes.
    before = node.shm_digest()
    p, lines = node.trainer(ckpts[1], "--drop", drop)
    assert p.returncode == 0, p.stdout + p.stderr
    assert lines[0]["outcome"] == "refused", lines
    assert drop_error in lines[0]["error"], lines[0]["error"]
    assert node.shm_digest() == before
    assert [r["version"] for r in node.resumed()] == [1, 2, 3, 4, 5]

    # After the refusal, a full refit still lands byte-exact.
    p, lines = node.trainer(ckpts[2], "--expected", str(conv[2]))
    assert lines[0]["outcome"] == "committed" and lines[0]["engine_matches_expected"], lines
    node.stop()


def test_engine_layout_of_convert_matches_engine_load(tmp_path):
    """refitctl convert --engine-layout and the engine's own load agree (same spec functions)."""
    spec = str(MODELS / "deepseek_v3_fp8_ue8m0.yaml")
    ckpt = make_checkpoint("deepseek_v3", tmp_path / "ckpt", 5)
    out = convert(spec, ckpt, tmp_path / "conv", engine_layout=True)
    import json
    import struct
    raw = (out / "engine.safetensors").read_bytes()
    header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    fused = header["model.layers.0.self_attn.fused_qkv_a_proj_with_mqa.weight"]
    assert fused["dtype"] == "F8_E4M3" and fused["shape"] == [2624, 256]
    packed = header["model.layers.0.self_attn.fused_qkv_a_proj_with_mqa.weight_scale_inv"]
    assert packed["dtype"] == "I32" and packed["shape"] == [1, 2624]


def _safetensors(path):
    import json
    import struct
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items()}


def test_ct_fp8_row_parallel_ranks_hold_column_slices_and_whole_f32_scales(tmp_path):
    """llama3_ct_fp8_dynamic.yaml over two engine ranks: `refitctl convert --engine-layout --tp-rank R`
    gives rank R exactly its columns of the checkpoint's FP8 o_proj / down_proj and every row's
    weight_scale whole, as F32 (vLLM's RowParallelLinear with a per-channel scale), and its rows of
    qkv_proj with their scales; the checkpoint itself keeps the package's BF16 scales."""
    import struct
    spec = str(MODELS / "llama3_ct_fp8_dynamic.yaml")
    ckpt = make_checkpoint("llama3_ct", tmp_path / "ckpt", 3)
    whole = {}
    for f in sorted(convert(spec, ckpt, tmp_path / "conv").glob("*.safetensors")):
        whole.update(_safetensors(f))
    p = "model.layers.0."
    for name in ("self_attn.o_proj", "mlp.down_proj"):
        dtype, shape, _ = whole[p + name + ".weight_scale"]
        assert dtype == "BF16" and shape[1] == 1, (name, dtype, shape)
    for r in (0, 1):
        eng = _safetensors(convert(spec, ckpt, tmp_path / f"eng{r}", engine_layout=True, tp_rank=r) /
                           "engine.safetensors")
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            _, (n, k), data = whole[p + name + ".weight"]
            want = b"".join(data[i * k + r * k // 2:i * k + (r + 1) * k // 2] for i in range(n))
            dtype, shape, got = eng[p + name + ".weight"]
            assert (dtype, shape) == ("F8_E4M3", [n, k // 2]), (name, dtype, shape)
            assert got == want, name
            _, _, scale = whole[p + name + ".weight_scale"]
            f32 = struct.pack(f"<{n}I", *(h << 16 for h in struct.unpack(f"<{n}H", scale)))
            assert eng[p + name + ".weight_scale"] == ("F32", [n, 1], f32), name
        # Column-parallel qkv: this rank's rows of each member, scales with them.
        dtype, shape, scale = eng[p + "self_attn.qkv_proj.weight_scale"]
        assert dtype == "F32" and shape[1] == 1 and shape[0] * 4 == len(scale), (dtype, shape)


def test_trtllm_layout_pads_gpt_oss_20b_widths(tmp_path):
    """gpt_oss_mxfp4_trtllm.yaml at gpt-oss-20b's widths (hidden and intermediate 2880; one layer of
    two experts): the engine holds the experts padded to 3072 as vLLM/SGLang allocate them, and
    shuffle_matrix_sf_a finds whole 128-row blocks (2880 rows alone are not)."""
    import json
    import struct
    import sys
    from conftest import MAKE
    ckpt = tmp_path / "ckpt"
    sizes = {"hidden_size": 2880, "intermediate_size": 2880, "num_local_experts": 2, "num_hidden_layers": 1,
             "layer_types": ["sliding_attention"]}
    subprocess.run([sys.executable, str(MAKE), "gpt_oss_trtllm", str(ckpt), "--seed", "1",
                    *[a for k, v in sizes.items() for a in ("--set", f"{k}={json.dumps(v)}")]], check=True)
    out = convert(str(MODELS / "gpt_oss_mxfp4_trtllm.yaml"), ckpt, tmp_path / "conv", engine_layout=True)
    with open(out / "engine.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    p = "model.layers.0.mlp.experts."
    shapes = {k[len(p):]: v["shape"] for k, v in header.items() if k.startswith(p)}
    assert shapes == {
        # _blocks as vLLM holds them: [E, N, K/2] (the checkpoint's [E, N, K/32, 16] bytes).
        "gate_up_proj_blocks": [2, 6144, 1536], "gate_up_proj_scales": [2, 6144, 96], "gate_up_proj_bias": [2, 6144],
        "down_proj_blocks": [2, 3072, 1536], "down_proj_scales": [2, 3072, 96], "down_proj_bias": [2, 3072],
    }, shapes
    # The shuffled E8M0 scale bytes as the F8_E4M3 view vLLM and SGLang register (view_dtype).
    dtypes = {k[len(p):]: v["dtype"] for k, v in header.items() if k.startswith(p) and "_bias" not in k}
    assert dtypes == {"gate_up_proj_blocks": "U8", "gate_up_proj_scales": "F8_E4M3",
                      "down_proj_blocks": "U8", "down_proj_scales": "F8_E4M3"}, dtypes


VIEW_STEP = "      - {op: view_dtype, dtype: F8_E4M3, on: _scales}\n"


@pytest.mark.parametrize("engine_dtype", ["U8", "F8_E5M2"])
def test_trtllm_scales_of_a_dtype_the_spec_does_not_state_are_refused(engine_dtype, tmp_path):
    """refitd with the shipped gpt_oss_mxfp4_trtllm.yaml (scales viewed as F8_E4M3) against an engine
    that registers the shuffled scales as another dtype (its spec without the view, or viewing them
    as F8_E5M2): the refit is refused naming the parameter and both dtypes, and no engine byte
    changes. The same bytes under the stated dtype refit (test_family_refits_match_refitctl_convert)."""
    shipped = MODELS / "gpt_oss_mxfp4_trtllm.yaml"
    text = shipped.read_text()
    assert text.count(VIEW_STEP) == 2
    engine_spec = tmp_path / "engine_spec.yaml"
    engine_spec.write_text(text.replace(VIEW_STEP, "" if engine_dtype == "U8" else
                                        VIEW_STEP.replace("F8_E4M3", engine_dtype)))
    ckpt = make_checkpoint("gpt_oss_trtllm", tmp_path / "ckpt", 0)
    sock = tmp_path / "refitd.sock"
    address = f"unix:{sock}"
    cfg = tmp_path / "refitd.yaml"
    cfg.write_text(f"listen: {address}\nlog_level: debug\nmodel_config: {ckpt / 'config.json'}\n")
    daemon = engines = shms = None
    try:
        daemon = h.start_refitd(cfg, tmp_path / "refitd.log", "--model-spec", shipped, ready=sock.exists)
        engines, shms, _ = h.start_rank_engines(tmp_path, address, engine_spec, ckpt, shm_kind="spec", tp_size=1)
        before = h.shm_digest(*shms)
        p, lines = h.run_trainer(address, "--spec", shipped, "--checkpoint", ckpt, timeout=120)
        assert p.returncode == 4 and lines[0]["outcome"] == "refused", p.stdout + p.stderr
        error = lines[0]["error"]
        for name in ("gate_up_proj_scales", "down_proj_scales"):
            assert (f"mismatch: engine parameter 'model.layers.0.mlp.experts.{name}' would be F8_E4M3"
                    in error), error
        assert f"registered as {engine_dtype}[" in error, error
        assert h.shm_digest(*shms) == before
    finally:
        for proc in (*(engines or ()), daemon):
            h.kill(proc)
        h.unlink_shm(*(shms or ()))


def test_incompatible_checkpoint_layout_is_rejected_at_startup(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("""model: m
checkpoint:
  quantization_config: {quant_method: fp8, weight_block_size: [64, 64]}
rules:
  - match: "**.weight"
    format: checkpoint
""")
    p = subprocess.run([str(REFITD), "--model-spec", str(bad), "--listen", f"unix:{tmp_path}/s.sock"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0
    assert "weight_block_size" in p.stderr + p.stdout and "[64, 64]" in p.stderr + p.stdout, p.stderr
