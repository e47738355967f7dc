"""vLLM's load-time requantization leaves llama3_fp8_ue8m0.yaml's checkpoint byte for byte as it is,
and changes llama3_fp8.yaml's (float scales). On Hopper and Blackwell vLLM 0.25 runs block-FP8
linears on DeepGEMM and, with VLLM_USE_DEEP_GEMM_E8M0=1 (its default), requantizes each loaded
weight: vllm/model_executor/layers/quantization/utils/fp8_utils.py `requant_weight_ue8m0_inplace`
(dequantize with the checkpoint's scales, then `per_block_cast_to_fp8(..., use_ue8m0=True)` of
vllm/utils/deep_gemm.py, whose `_ceil_to_ue8m0` is `2 ** ceil(log2(x))`), transcribed below in
torch on the CPU. The GPU test (test_vllm_refit.py) checks the same against a real vLLM.
Skips without a torch that has float8_e4m3fn (2.1 and later)."""
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "harness"))
from refit_harness import REFITCTL, SRC  # noqa: E402

sys.path.insert(0, str(HERE.parents[1] / "golden"))
import st_io  # noqa: E402

torch = pytest.importorskip("torch")
if not hasattr(torch, "float8_e4m3fn"):
    pytest.skip(f"torch {torch.__version__} has no float8_e4m3fn", allow_module_level=True)
ROLES = HERE / "vllm_roles.py"


def _ceil_to_ue8m0(x):
    return torch.pow(2.0, torch.ceil(torch.log2(x.abs())))


def _per_block_cast_to_fp8(x, block=128):
    m, n = x.shape
    pm, pn = -(-m // block) * block, -(-n // block) * block
    padded = torch.zeros((pm, pn), dtype=x.dtype)
    padded[:m, :n] = x
    view = padded.view(-1, block, pn // block, block)
    amax = view.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4)
    sf = _ceil_to_ue8m0(amax / 448.0)
    q = (view * (1.0 / sf)).to(torch.float8_e4m3fn)
    return q.view_as(padded)[:m, :n].contiguous(), sf.view(view.size(0), view.size(2))


def _requant(w, s, block=128):
    expanded = torch.repeat_interleave(torch.repeat_interleave(s.float(), block, 0), block, 1)
    return _per_block_cast_to_fp8(w.float() * expanded[:w.shape[0], :w.shape[1]], block)


def _load(path):
    dtypes = {"F8_E4M3": torch.float8_e4m3fn, "F32": torch.float32, "BF16": torch.bfloat16}
    return {name: torch.frombuffer(bytearray(data), dtype=dtypes[dtype]).reshape(shape)
            for name, (dtype, shape, data) in st_io.read(path)[0].items()}


def _changed_by_requant(tensors):
    changed = []
    for name, w in tensors.items():
        if w.dtype != torch.float8_e4m3fn:
            continue
        s = tensors[name + "_scale_inv"]
        w2, s2 = _requant(w, s)
        if not (torch.equal(w2.view(torch.uint8), w.view(torch.uint8)) and torch.equal(s2, s)):
            changed.append(name)
    return changed


@pytest.mark.parametrize("spec_file,unchanged", [("llama3_fp8_ue8m0.yaml", True), ("llama3_fp8.yaml", False)])
def test_vllm_requantization_keeps_the_ue8m0_checkpoint_as_it_is(spec_file, unchanged, tmp_path):
    ckpt = tmp_path / "bf16"
    subprocess.run([sys.executable, str(ROLES), "model", str(ckpt), "7"], check=True)
    spec = SRC / "deploy/models" / spec_file  # as shipped: without --tp-rank, one engine holding every parameter
    out = tmp_path / "out"
    p = subprocess.run([str(REFITCTL), "convert", "--engine-layout", "--spec", str(spec), str(ckpt), str(out)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    for f in ("model.safetensors", "engine.safetensors"):
        tensors = _load(out / f)
        assert sum(t.dtype == torch.float8_e4m3fn for t in tensors.values()) >= 8, f
        changed = _changed_by_requant(tensors)
        if unchanged:
            assert changed == [], f"{f}: vLLM's requantization changes {changed}"
        else:
            assert len(changed) == sum(t.dtype == torch.float8_e4m3fn for t in tensors.values()), (f, changed)
