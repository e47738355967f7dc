"""Wire format checkpoint end to end (real refitd, example engine and example trainer over the
host path): the trainer converts the tensors refitd's wire plan lists (FP8/FP4 bytes plus scales
on the wire) and the engine ends up holding exactly the bytes a BF16-wire refit gives, which are
`refitctl convert`'s engine layout of the same checkpoint; spoiled outputs are refused naming the
tensor, before any engine byte changes."""
import pytest

from conftest import convert, make_checkpoint, SRC

MODELS = SRC / "deploy/models"

# family -> (spec, format the trainer converts at least one tensor to)
FAMILIES = {
    "llama3": ("llama3_fp8.yaml", "fp8_block128"),
    "deepseek_v3": ("deepseek_v3_fp8_ue8m0.yaml", "fp8_block128_ue8m0"),
    "qwen35": ("qwen35_mxfp8.yaml", "mxfp8"),
    "qwen3_moe": ("qwen3_moe_nvfp4.yaml", "nvfp4"),
    "gpt_oss": ("gpt_oss_mxfp4.yaml", "mxfp4"),
    "llama3_ct": ("llama3_ct_fp8_dynamic.yaml", "ct_fp8_channel"),
    "deepseek_v3_absorbed": ("deepseek_v3_fp8_absorbed.yaml", "fp8_block128"),
    "gpt_oss_trtllm": ("gpt_oss_mxfp4_trtllm.yaml", "mxfp4"),
}


def _refit(node, ckpt, conv, wire):
    p, lines = node.trainer(ckpt, "--expected", str(conv), "--wire", wire)
    assert p.returncode == 0, p.stdout + p.stderr
    line = lines[0]
    assert line["outcome"] == "committed" and line["engine_matches_expected"], line
    assert line["wire_format"] == wire
    return line


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_checkpoint_wire_equals_bf16_wire_and_convert(family, family_node, tmp_path):
    spec_file, fmt = FAMILIES[family]
    spec = str(MODELS / spec_file)
    ckpts = [make_checkpoint(family, tmp_path / f"ckpt{s}", s) for s in range(2)]
    conv = [convert(spec, c, tmp_path / f"conv{i}") for i, c in enumerate(ckpts)]
    node = family_node(spec, ckpts[0])
    bf16 = _refit(node, ckpts[1], conv[1], "bf16")
    assert bf16["trainer_converted"] == 0
    digest = node.shm_digest()
    # Other weights in between, so the checkpoint-wire refit must rewrite every byte.
    _refit(node, ckpts[0], conv[0], "checkpoint")
    ckpt = _refit(node, ckpts[1], conv[1], "checkpoint")
    assert ckpt["trainer_converted"] > 0, ckpt
    assert node.shm_digest() == digest
    assert ckpt["bytes_in"] < bf16["bytes_in"], (ckpt["bytes_in"], bf16["bytes_in"])
    print(f"{family} ({fmt}): bytes on the wire bf16 {bf16['bytes_in']} checkpoint {ckpt['bytes_in']} "
          f"({ckpt['bytes_in'] / bf16['bytes_in']:.3f}); trainer converted {ckpt['trainer_converted']} tensors")
    node.stop()


# (family, kind, tensor, text the refusal must contain besides the tensor's name)
FAULTS = [
    ("llama3", "wrong-scale-shape", "model.layers.0.self_attn.o_proj.weight",
     "'model.layers.0.self_attn.o_proj.weight_scale_inv' arrived as F32[5,4]"),
    ("llama3", "nan-scale", "model.layers.0.self_attn.o_proj.weight",
     "scale 'model.layers.0.self_attn.o_proj.weight_scale_inv' is not finite at flat index 0"),
    ("llama3", "wrong-format", "model.layers.1.mlp.down_proj.weight",
     "the session's plan converts the tensor to fp8_block128"),
    ("llama3", "raw", "model.layers.0.self_attn.q_proj.weight",
     "'model.layers.0.self_attn.q_proj.weight' arrived as BF16[512,512]; the session's plan converts the tensor to "
     "fp8_block128, whose output '(data)' is F8_E4M3[512,512]"),
    ("gpt_oss", "raw", "model.layers.0.mlp.experts.down_proj",
     "the session's plan has the trainer convert it to mxfp4"),
    ("qwen3_moe", "nan-scale", "model.layers.1.mlp.experts.2.down_proj.weight",
     "scale 'model.layers.1.mlp.experts.2.down_proj.weight_scale' is not finite"),
    ("qwen35", "nan-scale", "model.layers.0.mlp.down_proj.weight",
     "scale 'model.layers.0.mlp.down_proj.weight_scale_inv' is not finite"),
    # A fused gate/up member encoded against its own amax: its weight_scale_2 differs from gate's.
    ("qwen3_moe", "group-amax", "model.layers.1.mlp.experts.2.up_proj.weight",
     "differs from fused group member 'model.layers.1.mlp.experts.2.gate_proj.weight'"),
    # Two slices encoded against different amax (ranks that did not reduce it): refitd refuses.
    ("qwen3_moe", "slice-amax", "model.layers.1.mlp.experts.2.down_proj.weight",
     "trainer ranks sent different global scales 'model.layers.1.mlp.experts.2.down_proj.weight_scale_2'"),
    # A fused member pushed alone without the group's amax: the client refuses it.
    ("qwen3_moe", "no-amax", "model.layers.0.mlp.experts.1.gate_proj.weight",
     "pushed without an amax; it is a member of the fused NVFP4 group"),
]


@pytest.mark.parametrize("family,kind,tensor,text", FAULTS, ids=[f"{f}-{k}" for f, k, _, _ in FAULTS])
def test_spoiled_checkpoint_outputs_are_refused_naming_the_tensor(family, kind, tensor, text, family_node, tmp_path):
    spec = str(MODELS / FAMILIES[family][0])
    ckpts = [make_checkpoint(family, tmp_path / f"ckpt{s}", s) for s in range(2)]
    node = family_node(spec, ckpts[0])
    before = node.shm_digest()
    p, lines = node.trainer(ckpts[1], "--wire", "checkpoint", "--wire-fault", f"{kind}:{tensor}")
    assert p.returncode == 0, p.stdout + p.stderr
    assert lines[0]["outcome"] == "refused", lines
    error = lines[0]["error"]
    assert f"tensor '{tensor}'" in error and text in error, error
    assert node.shm_digest() == before
    node.stop()


@pytest.mark.parametrize("family", ["llama3", "deepseek_v3", "qwen35", "gpt_oss", "qwen3_moe"])
def test_block_aligned_slices_convert_on_the_trainer(family, family_node, tmp_path):
    """Each matrix pushed as two slices split on a block boundary: each slice converts on its own
    on the trainer, refitd assembles the outputs, the engine matches `refitctl convert`. NVFP4
    slices (qwen3_moe, fused gate/up groups too) carry the whole tensor's or group's amax; every
    slice sends the same global scale."""
    spec = str(MODELS / FAMILIES[family][0])
    ckpts = [make_checkpoint(family, tmp_path / f"ckpt{s}", s) for s in range(2)]
    conv = convert(spec, ckpts[1], tmp_path / "conv1")
    node = family_node(spec, ckpts[0])
    p, lines = node.trainer(ckpts[1], "--expected", str(conv), "--wire", "checkpoint", "--slices", "2")
    assert p.returncode == 0, p.stdout + p.stderr
    assert lines[0]["outcome"] == "committed" and lines[0]["engine_matches_expected"], lines
    assert lines[0]["trainer_converted"] > 0
    node.stop()


def test_nvfp4_slice_without_amax_is_refused_on_the_trainer(family_node, tmp_path):
    spec = str(MODELS / "qwen3_moe_nvfp4.yaml")
    tensor = "model.layers.1.mlp.experts.2.down_proj.weight"
    ckpts = [make_checkpoint("qwen3_moe", tmp_path / f"ckpt{s}", s) for s in range(2)]
    node = family_node(spec, ckpts[0])
    before = node.shm_digest()
    p, lines = node.trainer(ckpts[1], "--wire", "checkpoint", "--wire-fault", f"slice:{tensor}")
    assert p.returncode == 0, p.stdout + p.stderr
    error = lines[0]["error"]
    assert lines[0]["outcome"] == "refused" and f"tensor '{tensor}'" in error, lines
    assert "pushed without an amax; it is a slice of an NVFP4 tensor" in error, error
    assert node.shm_digest() == before
    node.stop()


def _gpu_reason():
    """Empty when the example trainer can push from GPU 0, else why not."""
    import shutil
    import subprocess
    if shutil.which("nvidia-smi") is None:
        return "no GPU: nvidia-smi is not on PATH"
    p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    if p.returncode != 0 or "GPU 0" not in p.stdout:
        return f"no GPU: nvidia-smi -L says {p.stdout.strip() or p.stderr.strip()!r}"
    return ""


@pytest.mark.parametrize("family", ["llama3", "qwen3_moe", "gpt_oss", "qwen35", "deepseek_v3"])
def test_trainer_converts_device_tensors_on_the_gpu(family, family_node, tmp_path):
    """The weights live on GPU 0; the client converts the listed tensors there with the kernels
    (UCX host data plane, refitd on the CPU) and the engine matches `refitctl convert`."""
    reason = _gpu_reason()
    if reason:
        print(f"skipped: {reason}")
        pytest.skip(reason)
    spec = str(MODELS / FAMILIES[family][0])
    ckpts = [make_checkpoint(family, tmp_path / f"ckpt{s}", s) for s in range(2)]
    conv = convert(spec, ckpts[1], tmp_path / "conv1")
    node = family_node(spec, ckpts[0])
    p, lines = node.trainer(ckpts[1], "--expected", str(conv), "--wire", "checkpoint", "--gpu", "0")
    assert p.returncode == 0, p.stdout + p.stderr
    assert lines[0]["outcome"] == "committed" and lines[0]["engine_matches_expected"], lines
    assert lines[0]["trainer_converted"] > 0
    node.stop()
