"""The processes of the SGLang refit test (test_sglang_refit.py), each run as
`python3 sglang_roles.py ROLE ...`:

  model DIR SEED                 the vLLM test's tiny Llama-3-shaped BF16 checkpoint
                                 (tests/integration/vllm/vllm_roles.py: engine-agnostic)
  trainer ADDRESS MODEL CKPT TAG the vLLM test's trainer: pushes CKPT's BF16 tensors from the GPU
                                 to refitd, commits; prints the report as JSON
  reference CKPT OUT             a fresh SGLang Engine from CKPT (decode CUDA graphs on): greedy
                                 tokens and logprobs of PROMPTS -> OUT (JSON)
  engine PLAN OUT                SGLang serving the FP8 checkpoint of version 0, attached to refitd
                                 (refit.sglang); for each version of PLAN: a trainer process
                                 refits it while SGLang keeps generating, then its tokens,
                                 logprobs, parameter bytes and addresses and the CUDA graphs alive
                                 are recorded; then the same versions through SGLang's own
                                 update_weights_from_tensor (the FP8 checkpoint's tensors on the
                                 GPU), timed -> OUT (JSON)

SGLang runs its scheduler (the TP worker, the model) in a process of its own; the functions
below named `worker_*` run there through refit.sglang.run, so this file's directory and the
project's python/ are put on PYTHONPATH before the Engine starts.
"""
from __future__ import annotations

import gc
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = Path(os.environ.get("REFIT_SOURCE_DIR", HERE.parents[2]))
for p in (SRC / "python", SRC / "tests" / "integration" / "vllm", HERE):
    sys.path.insert(0, str(p))
import vllm_roles as common  # noqa: E402  (imports no vLLM at module level)

PROMPTS, MAX_TOKENS = common.PROMPTS, common.MAX_TOKENS


def engine_kwargs():
    """One set of SGLang settings for every SGLang of the test, so that refitted and fresh engines
    run the same kernels, graphs and batches."""
    import refit.sglang as rs

    # A fixed KV pool (max_total_tokens): SGLang sizes it from the device's free memory, which
    # the other SGLang starting beside this one changes. Prefill runs eagerly (its piecewise
    # graphs compile with torch.compile); decode replays CUDA graphs of 1, 2, 4 and 8 requests.
    return dict(skip_tokenizer_init=True, context_length=256, max_running_requests=8, max_total_tokens=4096,
                mem_fraction_static=0.3, disable_radix_cache=True, random_seed=0, cuda_graph_bs_decode=[1, 2, 4, 8],
                disable_prefill_cuda_graph=True, log_level="warning", **rs.engine_kwargs())


def start_engine(ckpt: str):
    # The scheduler processes import refit.sglang (the custom weight loader) and this module.
    paths = [str(SRC / "python"), str(HERE), str(SRC / "tests" / "integration" / "vllm")]
    old = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + ([old] if old else []))
    # FlashAttention-3 from sglang-kernel, not from the Hub (the GPU machine has no network).
    os.environ.setdefault("SGLANG_USE_SGL_FA3_KERNEL", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # DeepGEMM compiles each GEMM shape when first run instead of warming up every batch size at
    # start (about 5 minutes on an H100); every SGLang of the test runs the same kernels either way.
    os.environ.setdefault("SGLANG_JIT_DEEPGEMM_PRECOMPILE", "0")
    import sglang as sgl

    import refit.sglang as rs

    engine = sgl.Engine(model_path=ckpt, **engine_kwargs())
    BLOCK_SCALES_SET[:] = rs.run(engine, "sglang_roles:worker_load_block_scales", ckpt)[0]
    return engine


# The scale parameters start_engine set after SGLang's own load (worker_load_block_scales).
BLOCK_SCALES_SET: list = []


def generate(engine):
    outs = engine.generate(input_ids=PROMPTS, sampling_params={"temperature": 0.0, "max_new_tokens": MAX_TOKENS,
                                                               "ignore_eos": True}, return_logprob=True)
    result = []
    for o in outs:
        lps = o["meta_info"]["output_token_logprobs"]  # (logprob, token id, text) per token
        result.append({"tokens": [int(t[1]) for t in lps], "logprobs": [float(t[0]) for t in lps]})
    return result


# In SGLang's scheduler process, through refit.sglang.run(engine, "sglang_roles:worker_...").

FUSED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


def worker_load_block_scales(runner, ckpt):
    """Loads the block-FP8 scales SGLang's own load drops. SGLang 0.5.16's
    LlamaForCausalLM.load_weights (sglang/srt/models/llama.py) renames every `.weight_scale_inv`
    to `.weight_scale`, while its block-FP8 linear method (Fp8LinearMethod.create_weights,
    layers/quantization/fp8.py) registers `weight_scale_inv`: each scale is skipped with a
    "not found in params_dict" warning and the layers keep uninitialized scales. The same holds
    for update_weights_from_tensor, which goes through load_weights. Here each scale parameter
    gets the checkpoint's scales, a fused parameter's (qkv_proj, gate_up_proj) its parts' rows
    one after another, as SGLang's weight loader stacks the weights. Returns the names set."""
    import torch
    from safetensors.torch import load_file

    tensors = {}
    for f in sorted(Path(ckpt).glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    done = []
    with torch.no_grad():
        for name, p in runner.model.named_parameters():
            if not name.endswith(".weight_scale_inv"):
                continue
            parent, leaf = name[: -len(".weight_scale_inv")].rsplit(".", 1)
            parts = [tensors[f"{parent}.{x}.weight_scale_inv"] for x in FUSED.get(leaf, [leaf])]
            whole = torch.cat(parts, dim=0)
            assert whole.shape == p.shape and whole.dtype == p.dtype, (name, whole.shape, p.shape, whole.dtype)
            p.copy_(whole.to(p.device))
            done.append(name)
    torch.cuda.synchronize()
    return done

def worker_digests(runner):
    """The registered parameters' bytes (refit.sglang.registered_params: less the KV-cache scales)."""
    import torch

    import refit.sglang as rs

    torch.cuda.synchronize()
    return {n: hashlib.sha256(p.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()[:16]
            for n, p in rs.registered_params(runner.model)}


def worker_layout(runner):
    """Every parameter SGLang holds (registered or not) and the KV-cache scales' values."""
    return {n: [str(p.dtype), list(p.shape), list(p.stride()), p.is_contiguous()]
            + ([float(p)] if p.numel() == 1 else [])
            for n, p in runner.model.named_parameters()}


def worker_graphs(runner):
    """The CUDA graphs alive in this process (ids): a recapture replaces them."""
    import torch

    return sorted(id(o) for o in gc.get_objects() if isinstance(o, torch.cuda.CUDAGraph))


def role_reference(ckpt: str, out: str) -> None:
    t0 = time.monotonic()
    engine = start_engine(ckpt)
    started = time.monotonic() - t0
    try:
        Path(out).write_text(json.dumps({"outputs": generate(engine), "start_s": started,
                                         "block_scales_set": len(BLOCK_SCALES_SET)}))
    finally:
        engine.shutdown()


def role_engine(plan_file: str, out: str) -> None:
    import torch
    from safetensors.torch import load_file

    import refit.sglang as rs

    plan = json.loads(Path(plan_file).read_text())
    record = {"versions": [], "sglang_update": []}

    def save():
        Path(out).write_text(json.dumps(record, indent=1))

    def expected(k):
        return {n: common.digest(b) for n, b in common.safetensors_bytes(Path(plan["engine_layout"][k])).items()}

    def worker(fn, *args):
        return rs.run(engine, f"sglang_roles:{fn}", *args)[0]

    t0 = time.monotonic()
    engine = start_engine(plan["fp8"][0])
    try:
        record["start_s"] = time.monotonic() - t0
        record["block_scales_set"] = list(BLOCK_SCALES_SET)
        record["layout"] = worker("worker_layout")
        save()
        expected0, loaded = expected(0), worker("worker_digests")
        record["loaded_equals_engine_layout"] = loaded == expected0
        record["loaded_differing"] = sorted(n for n in set(expected0) | set(loaded) if loaded.get(n) != expected0.get(n))
        record["outputs0"] = generate(engine)
        record["attached"] = rs.attach(engine, plan["address"], plan["model"])[0]
        addresses = rs.param_addresses(engine)[0]
        graphs = worker("worker_graphs")
        record["graphs_after_start"] = len(graphs)
        save()
        for k in range(1, len(plan["bf16"])):
            trainer = subprocess.Popen([sys.executable, __file__, "trainer", plan["address"], plan["model"],
                                        plan["bf16"][k], f"v{k}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True)
            during = 0
            while trainer.poll() is None:  # rollouts go on while the trainer pushes; the commit pauses them
                generate(engine)
                during += 1
            stdout, stderr = trainer.communicate()
            lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
            entry = {"k": k, "trainer_rc": trainer.returncode, "trainer": lines[-1] if lines else None,
                     "trainer_stderr": stderr[-3000:] if trainer.returncode else "", "generates_during_refit": during}
            record["versions"].append(entry)
            save()
            if trainer.returncode != 0 or not lines or lines[-1]["outcome"] != "committed":
                break
            rs.wait_for_version(engine, lines[-1]["version"], 60.0)
            entry["status"] = rs.status(engine)[0]
            entry["outputs"] = generate(engine)
            want, got = expected(k), worker("worker_digests")
            entry["params_equal_engine_layout"] = got == want
            entry["params_differing"] = sorted(n for n in want if got.get(n) != want[n])[:10]
            entry["addresses_unchanged"] = rs.param_addresses(engine)[0] == addresses
            entry["graphs_unchanged"] = worker("worker_graphs") == graphs
            save()
        rs.detach(engine)
        # SGLang's own path for the same versions: the FP8 checkpoint's tensors already on the GPU,
        # through update_weights_from_tensor (the model's load_weights; CUDA IPC to the scheduler).
        for k in range(1, len(plan["fp8"])):
            weights = [(n, t.to("cuda")) for n, t in load_file(str(Path(plan["fp8"][k]) / "model.safetensors")).items()]
            torch.cuda.synchronize()
            t1 = time.monotonic()
            ok, message = engine.update_weights_from_tensor(weights)[:2]
            ms = (time.monotonic() - t1) * 1e3
            entry = {"k": k, "ok": ok, "message": message, "update_ms": ms, "outputs": generate(engine)}
            want, got = expected(k), worker("worker_digests")
            entry["params_equal_engine_layout"] = got == want
            # The parameters its update left as they were (SGLang 0.5.16: the block-FP8 scales,
            # worker_load_block_scales).
            entry["params_differing"] = sorted(n for n in want if got.get(n) != want[n])
            entry["addresses_unchanged"] = rs.param_addresses(engine)[0] == addresses
            entry["graphs_unchanged"] = worker("worker_graphs") == graphs
            record["sglang_update"].append(entry)
            del weights
            save()
        record["done"] = True
        save()
    finally:
        engine.shutdown()


def main(argv):
    role = argv[1]
    if role == "model":
        common.write_model(Path(argv[2]), int(argv[3]))
    elif role == "reference":
        role_reference(argv[2], argv[3])
    elif role == "trainer":
        common.role_trainer(*argv[2:6])
    elif role == "engine":
        role_engine(argv[2], argv[3])
    else:
        raise SystemExit(f"unknown role {role!r}: model, reference, trainer or engine")


if __name__ == "__main__":
    main(sys.argv)
