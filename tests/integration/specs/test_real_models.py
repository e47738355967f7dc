"""Every shipped spec fits the real model it names (docs/config.md, "Sizes come from the model"):
`refitctl spec lint --checkpoint` passes each deploy/models/ spec against a checkpoint laid out
from that model's config.json (tests/models/) at its real shapes, its sizes read from the
checkpoint's config.json. The checkpoints are headers only (sparse files): lint plans every tensor
from its header. A spec sized for tests, or one without the model's config, is refused."""
import json
import os
import subprocess

import pytest

from conftest import REFITCTL, SRC, make_real_checkpoint

MODELS = SRC / "deploy/models"

# shipped spec -> (family of make_checkpoints.py, tensors of the real model's trainer checkpoint as
# make_checkpoints.py lays it out; Meta-Llama-3-8B's 291 are its Hugging Face checkpoint's)
SPECS = {
    "llama3_fp8.yaml": ("llama3", 291),                    # Meta-Llama-3-8B
    "llama3_fp8_ue8m0.yaml": ("llama3", 291),              # Meta-Llama-3-8B, as vLLM holds it
    "qwen3_moe_nvfp4.yaml": ("qwen3_moe", 18867),          # Qwen3-30B-A3B: 48 layers x 128 experts
    "deepseek_v3_fp8_ue8m0.yaml": ("deepseek_v3", 46183),  # DeepSeek-V3, with its MTP layer 61
    "gpt_oss_mxfp4.yaml": ("gpt_oss", 411),                # gpt-oss-20b, BF16 experts
    "qwen35_mxfp8.yaml": ("qwen35", 866),                  # Qwen3.5-27B text model and MTP layer
    "llama3_ct_fp8_dynamic.yaml": ("llama3", 291),         # Meta-Llama-3-8B
    "deepseek_v3_fp8_absorbed.yaml": ("deepseek_v3", 46183),  # DeepSeek-V3, w_kc / w_vc of 62 layers
    "gpt_oss_mxfp4_trtllm.yaml": ("gpt_oss", 411),         # gpt-oss-20b (its padded layout: test_families.py)
}


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    made = {}

    def get(family):
        if family not in made:
            made[family] = make_real_checkpoint(family, tmp_path_factory.mktemp(family))
        return made[family]

    return get


def lint(spec, *args):
    p = subprocess.run([str(REFITCTL), "spec", "lint", str(spec), "--json", *map(str, args)],
                       capture_output=True, text=True, timeout=60)
    return p.returncode, json.loads(p.stdout)


def test_every_shipped_model_spec_is_checked():
    shipped = {p.name for p in MODELS.glob("*.yaml")} - {"demo-llama.yaml"}
    assert shipped == set(SPECS)


@pytest.mark.parametrize("spec_file", sorted(SPECS))
def test_shipped_spec_fits_its_real_model(spec_file, real):
    family, tensors = SPECS[spec_file]
    ckpt = real(family)
    # Real sizes, a few megabytes of disk (DeepSeek-V3 in BF16 is 1.3 TB).
    files = list(ckpt.iterdir())
    assert sum(f.stat().st_size for f in files) > 10**10
    assert sum(f.stat().st_blocks * 512 for f in files) < 64 << 20
    rc, out = lint(MODELS / spec_file, "--checkpoint", ckpt)
    assert rc == 0 and out["ok"], json.dumps(out)[:4000]
    assert out["tensors"] == tensors
    assert out["model_config"] == str(ckpt / "config.json")
    assert out["rules_matching_nothing"] == [] and out["conflicts"] == [] and out["problem_count"] == 0
    # The engine's own calibrated input scales are no trainer tensor: that rule matches nothing, and may.
    never = out["never_rules_matching_nothing"]
    if family == "qwen3_moe":
        assert len(never) == 1 and "input_scale" in never[0], never
    else:
        assert never == []


def test_a_spec_sized_for_tests_is_refused_against_the_real_model(real, tmp_path):
    """What users met before: a count copied into the spec (4 experts) against Qwen3-30B-A3B."""
    ckpt = real("qwen3_moe")
    text = (MODELS / "qwen3_moe_nvfp4.yaml").read_text()
    sized = tmp_path / "qwen3_moe_test_sized.yaml"
    sized.write_text(text.replace("stack: {capture: E}", "stack: {capture: E, count: 4}"))
    rc, out = lint(sized, "--checkpoint", ckpt)
    assert rc == 1 and not out["ok"]
    assert "rules[1].stack.count: 4, but the model config" in out["error"], out
    assert "gives num_experts 128" in out["error"], out
    # Without a model config the stated count stands, and the experts beyond it do not fit.
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ckpt.iterdir():
        if f.name != "config.json":
            os.symlink(f, bare / f.name)
    sized.write_text(text.replace("stack: {capture: E}", "stack: {capture: E, count: 4}")
                     .replace("source: {layout: megatron}\n", ""))
    rc, out = lint(sized, "--checkpoint", bare)
    assert rc == 1 and not out["ok"]
    assert out["problem_count"] == 48 * 124 * 3, out["problem_count"]
    assert "is not an index below 4" in out["problems"][0], out["problems"][0]


def test_sizes_left_to_the_model_need_its_config(real, tmp_path):
    ckpt = real("deepseek_v3")
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ckpt.iterdir():
        if f.name != "config.json":
            os.symlink(f, bare / f.name)
    rc, out = lint(MODELS / "deepseek_v3_fp8_ue8m0.yaml", "--checkpoint", bare)
    assert rc == 1 and "rules[6].stack.count (line 62)" in out["error"], out
    assert "no model config was given" in out["error"], out
    # --model-config names it explicitly.
    rc, out = lint(MODELS / "deepseek_v3_fp8_ue8m0.yaml", "--checkpoint", bare,
                   "--model-config", SRC / "tests/models/DeepSeek-V3/config.json")
    assert rc == 0 and out["ok"], json.dumps(out)[:2000]
    # The spec's text alone: loads, and lists what the model config will give.
    rc, out = lint(MODELS / "deepseek_v3_fp8_ue8m0.yaml")
    assert rc == 0 and out["ok"] and "rules[6].stack.count (line 62)" in out["sizes_from_the_model_config"], out
