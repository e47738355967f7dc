"""The CUDA-graph engine of python/examples/graph_engine.py and the colocated loop of
python/examples/colocated_graphs_refit.py. On the CPU: the static-KV decode step (eager) against
the transformers forward, for an FP32 model and the FP8 engine model, batch sizes 2 and
1, and a sleep/wake cycle that leaves generation unchanged. On a GPU (skipping, with the reason,
without one or without a CUDA build): the colocated loop end to end — three policies pushed over
CUDA IPC into the weights the captured graphs read; tokens and logits equal to an engine built
from `refitctl convert` output (tolerance 0), no re-capture, the refits staged while the engine
slept and committed by its wake, and the KV pool and the weights released while asleep."""
import json
import os
import subprocess
import sys

import pytest

from conftest import BIN, SRC_DIR, needs_torch, needs_transformers

EXAMPLES = SRC_DIR / "python" / "examples"
sys.path.insert(0, str(EXAMPLES))

pytestmark = [needs_torch, needs_transformers]

PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8]]


def cuda_ready():
    """(True, "") where the GPU test can run, else (False, why)."""
    import torch

    if not torch.cuda.is_available():
        return False, f"no CUDA device visible to torch {torch.__version__}"
    cache = BIN / "CMakeCache.txt"
    text = cache.read_text() if cache.exists() else ""
    if "REFIT_CUDA:BOOL=ON" not in text:
        return False, f"refitd at {BIN} was not built with CUDA (no CUDA IPC data plane)"
    return True, ""


def reference_logits(model, ids, start, n):
    """[n, b, vocab] float32 logits of the transformers forward at positions start .. start+n-1."""
    import torch

    with torch.no_grad():
        return model(ids).logits.float()[:, start:start + n].transpose(0, 1)


def test_decode_step_equals_the_transformers_forward():
    import torch
    from transformers import LlamaForCausalLM

    import llama_fp8 as L
    from graph_engine import GraphEngine

    torch.set_num_threads(1)
    torch.manual_seed(3)
    model = LlamaForCausalLM(L.llama_config("tiny")).float().eval()
    engine = GraphEngine(model, max_len=16, batch_sizes=(2, 1))
    ids, logits = engine.generate(PROMPTS, 5)
    assert ids.shape == (2, 13) and logits.shape == (5, 2, 320)
    assert torch.equal(ids[:, :8], torch.tensor(PROMPTS))
    want = reference_logits(model, ids, 7, 5)
    assert float((want - logits).abs().max()) < 1e-4
    assert torch.equal(want.argmax(-1).transpose(0, 1), ids[:, 8:])  # greedy
    one_ids, one_logits = engine.generate(PROMPTS[:1], 5)  # batch size 1: the same sequence
    assert torch.equal(one_ids, ids[:1])  # (CPU matmuls may round another batch size differently)
    assert float((one_logits - logits[:, :1]).abs().max()) < 1e-5
    with pytest.raises(ValueError, match="exceed"):
        engine.generate(PROMPTS, 9)


def test_fp8_engine_decode_and_sleep_wake_on_the_host():
    """The FP8 engine model (Fp8Linear projections over codes and scales) decodes like its own
    transformers forward; sleep() then wake() leaves the next generation bit-identical."""
    import torch

    import llama_fp8 as L
    from graph_engine import GraphEngine

    torch.set_num_threads(1)
    bf16 = L.build_bf16("tiny", 5)
    table = L.engine_table(bf16)
    g = torch.Generator().manual_seed(9)
    tensors = L.initial_tensors(bf16, table)
    for name, dtype, shape in table:
        if dtype == L.FP8:
            codes = torch.randint(0, 256, shape, generator=g, dtype=torch.int64)
            codes[(codes & 0x7F) == 0x7F] = 0x3F  # no NaN codes
            tensors[name] = codes.to(torch.uint8)
        elif name.endswith(".weight_scale_inv"):
            tensors[name] = torch.rand(shape, generator=g) * 1e-2 + 1e-3
    model = L.fp8_engine_model(bf16, tensors)
    engine = GraphEngine(model, max_len=16, batch_sizes=(2, 1), kv_pool_bytes=1 << 20)
    assert engine.kv.nbytes == 1 << 20 and engine.cache_bytes < engine.kv.nbytes and not engine.kv_is_vmm
    ids, logits = engine.generate(PROMPTS, 4)
    assert torch.isfinite(logits).all()
    want = reference_logits(model, ids, 7, 4)
    cos = torch.nn.functional.cosine_similarity(want.flatten(), logits.flatten(), dim=0)
    assert float(cos) > 0.999  # BF16 activations: the two orders of operations round differently
    ptrs = engine.tensor_ptrs()
    assert ptrs["model.layers.0.self_attn.q_proj.weight"] == tensors["model.layers.0.self_attn.q_proj.weight"].data_ptr()
    engine.sleep()
    engine.wake()
    again_ids, again_logits = engine.generate(PROMPTS, 4)
    assert torch.equal(again_ids, ids) and torch.equal(again_logits, logits)
    assert engine.tensor_ptrs() == ptrs and engine.captures == 0
    with pytest.raises(RuntimeError, match="CUDA device"):
        engine.capture()


def run_loop(tmp_path, *args, timeout):
    out = tmp_path / "summary.json"
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    p = subprocess.run([sys.executable, str(EXAMPLES / "colocated_graphs_refit.py"), "--build", str(BIN),
                        "--policies", "3", "--workdir", str(tmp_path / "work"), "--out", str(out), *args],
                       capture_output=True, text=True, timeout=timeout, env=env)
    assert out.exists(), p.stdout[-4000:] + p.stderr[-6000:]
    return p, json.loads(out.read_text())


def test_colocated_loop_on_the_host_matches_the_offline_conversion(tmp_path):
    """The loop's driver on the CPU (shm engine, UCX data plane, the decode step run eagerly):
    three policies, each equal to the engine built from `refitctl convert` output."""
    p, summary = run_loop(tmp_path, "--engine-device", "cpu", "--size", "tiny", "--tokens", "4", "--prompt-len", "8",
                          "--kv-pool-mib", "1", "--bucket-bytes", "262144", timeout=240)
    assert p.returncode == 0 and summary["ok"], p.stderr[-6000:]
    rows = summary["policies"]
    assert [r["version"] for r in rows] == [1, 2, 3] and summary["data_plane"] == "host"
    assert [r["change"] for r in rows] == ["gradient", "noise", "gradient"]
    for r in rows:
        # Pushed while the engine slept: staged, then committed by its wake.
        assert r["outcome"] == "staged" and r["wake_committed"]
        assert r["engine_bytes_equal_reference"] and r["tokens_equal"] and r["logits_equal"]
        assert r["same_data_ptrs"] and r["captures"] == 0
    assert all(r["logits_changed_vs_previous"] for r in rows[1:])


def test_colocated_graph_engine_refits_over_cuda_ipc(tmp_path):
    ready, why = cuda_ready()
    if not ready:
        pytest.skip(why)
    p, summary = run_loop(tmp_path, timeout=420)
    print(json.dumps(summary))
    for r in summary["policies"]:
        print(json.dumps({k: r[k] for k in ("policy", "change", "version", "wall_ms", "tokens_equal", "logits_equal",
                                            "max_logit_diff", "same_graphs", "same_data_ptrs", "captures",
                                            "memory_awake", "memory_asleep", "released_bytes",
                                            "device_released_bytes", "wake_ms") if k in r}))
    assert p.returncode == 0 and summary["ok"], p.stderr[-6000:]
    rows = summary["policies"]
    assert [r["version"] for r in rows] == [1, 2, 3]
    assert summary["data_plane_cuda_ipc"] and summary["engine"]["graphs"] == [1, 2]
    for r in rows:
        assert r["outcome"] == "staged" and r["wake_committed"] and r["engine_bytes_equal_reference"]
        assert r["tokens_equal"] and r["logits_equal"] and r["max_logit_diff"] == 0.0
        assert r["same_graphs"] and r["same_data_ptrs"] and r["captures"] == 2 and not r["host_staged"]
    assert all(r["logits_changed_vs_previous"] for r in rows[1:])
    if summary["engine"]["kv_pool_vmm"]:
        assert all(r["released_bytes"] >= 0.9 * summary["engine"]["kv_pool_bytes"] for r in rows)
        assert all(r["memory_asleep"]["kv_pool_mapped"] == 0 for r in rows)
    # The weights too (shareable CUDA virtual memory, registered in place): released while asleep,
    # by the engine and by refitd (the device's used memory drops by them as well), and a wake
    # maps new memory at the same addresses that the staged refit fills.
    assert summary["weights_released_while_asleep"], summary.get("weights_vmm_error")
    weights = summary["engine"]["weight_bytes"]
    for r in rows:
        assert r["memory_asleep"]["weights_mapped"] == 0 and r["memory_awake"]["weights_mapped"] >= weights
        assert r["released_bytes"] >= 0.9 * (summary["engine"]["kv_pool_bytes"] + weights)
        # Beyond what torch's cache gave back: the KV pool and the weights, refitd's mapping of
        # them included (a mapping refitd kept would hold the weights' memory).
        by_torch = r["memory_awake"]["torch_reserved"] - r["memory_asleep"]["torch_reserved"]
        assert r["device_released_bytes"] - by_torch >= 0.9 * (summary["engine"]["kv_pool_bytes"] + weights), r
    first = summary["memory_before_loop"]  # the first sleep, right after the registration
    by_torch = first["awake"]["torch_reserved"] - first["asleep"]["torch_reserved"]
    assert first["asleep"]["weights_mapped"] == 0
    freed = first["awake"]["device_used"] - first["asleep"]["device_used"] - by_torch
    assert freed >= 0.9 * (summary["engine"]["kv_pool_bytes"] + weights), f"first sleep, after registering: {first}"
