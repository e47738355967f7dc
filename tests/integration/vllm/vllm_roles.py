"""The processes of the vLLM refit test (test_vllm_refit.py), each run as `python3 vllm_roles.py ROLE ...`:

  model DIR SEED                 a tiny Llama-3-shaped checkpoint: DIR/config.json and BF16
                                 DIR/model.safetensors, random from SEED (CPU, so any machine
                                 writes the same bytes)
  reference CKPT OUT             a fresh vLLM from CKPT (CUDA graphs on): greedy tokens and
                                 logprobs of PROMPTS -> OUT (JSON)
  trainer ADDRESS MODEL CKPT TAG pushes CKPT's BF16 tensors from the GPU (in place, as a colocated
                                 trainer does) to refitd, commits; prints the report as JSON
  engine PLAN OUT                vLLM serving the FP8 checkpoint of version 0, attached to refitd
                                 (refit.vllm.RefitWorker); for each version of PLAN: a trainer
                                 process refits it while vLLM keeps generating, then its tokens,
                                 logprobs, parameter bytes and addresses and the CUDA graphs
                                 captured are recorded; then the same versions through vLLM's own
                                 in-place reload (reload_weights), timed -> OUT (JSON)

vLLM runs its engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so collective_rpc
reaches the worker's model and vLLM's compilation counters are this process's.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = Path(os.environ.get("REFIT_SOURCE_DIR", HERE.parents[2]))
sys.path.insert(0, str(SRC / "python"))
sys.path.insert(0, str(SRC / "tests" / "golden"))
import st_io  # noqa: E402

# Head dim 128 and every projection a whole number of 128-row blocks, as Llama-3's are; a
# vocabulary vLLM does not pad (a multiple of 64).
CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 2048, "hidden_size": 512,
    "intermediate_size": 1536, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 128, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "hidden_act": "silu", "attention_bias": False,
    "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2,
}
PROMPTS = [[1, 17 + 31 * i, 400 + 7 * i, 1000 + 13 * i, 5 + i] for i in range(6)]
MAX_TOKENS = 12


def llm_kwargs():
    """One set of vLLM settings for every vLLM of the test, so that refitted and fresh engines run
    the same kernels, graphs and batch."""
    # A fixed KV cache: vLLM's memory profiling reads the device's free memory, which the other
    # vLLMs starting beside this one change.
    return dict(skip_tokenizer_init=True, max_model_len=256, max_num_seqs=8, gpu_memory_utilization=0.15,
                kv_cache_memory_bytes=1 << 30,
                enable_prefix_caching=False, seed=0, compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 8]})


def tensors_of(cfg):
    """(name, shape) of the Hugging Face Llama checkpoint tensors."""
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    out = [("model.embed_tokens.weight", (v, h))]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        out += [(p + "input_layernorm.weight", (h,)), (p + "self_attn.q_proj.weight", (q, h)),
                (p + "self_attn.k_proj.weight", (kv, h)), (p + "self_attn.v_proj.weight", (kv, h)),
                (p + "self_attn.o_proj.weight", (h, q)), (p + "post_attention_layernorm.weight", (h,)),
                (p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h)),
                (p + "mlp.down_proj.weight", (h, i))]
    return out + [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]


def write_model(out: Path, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in tensors_of(CONFIG):
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:  # large enough that greedy decoding is far from ties
            t = torch.randn(shape, generator=g) * (0.5 if "embed" in name else 0.06)
        tensors[name] = t.to(torch.bfloat16)
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(CONFIG, indent=1))


def safetensors_bytes(path: Path) -> dict:
    """{name: raw bytes} of a .safetensors file."""
    return {name: data for name, (_dtype, _shape, data) in st_io.read(path)[0].items()}


def digest(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()[:16]


def generate(llm):
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=0, ignore_eos=True, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], sp, use_tqdm=False)
    result = []
    for o in outs:
        c = o.outputs[0]
        lps = [float(lp[t].logprob) for t, lp in zip(c.token_ids, c.logprobs)]
        result.append({"tokens": list(c.token_ids), "logprobs": lps})
    return result


def start_llm(ckpt: str, **extra):
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM

    return LLM(model=ckpt, **llm_kwargs(), **extra)


def role_reference(ckpt: str, out: str) -> None:
    t0 = time.monotonic()
    llm = start_llm(ckpt)
    started = time.monotonic() - t0
    Path(out).write_text(json.dumps({"outputs": generate(llm), "start_s": started}))


def role_trainer(address: str, model: str, ckpt: str, tag: str) -> None:
    import torch
    from safetensors.torch import load_file

    import refit

    tensors = {k: v.to("cuda") for k, v in load_file(str(Path(ckpt) / "model.safetensors")).items()}
    torch.cuda.synchronize()
    with refit.TrainerClient(address) as client:
        t0 = time.monotonic()
        report = client.refit(model, tensors, in_place=True, tag=tag)
        wall_ms = (time.monotonic() - t0) * 1e3
    print(json.dumps({"outcome": report.outcome, "version": report.version, "reason": report.reason,
                      "wall_ms": wall_ms, "times_ms": report.times_ms, "bytes_in": report.bytes_in,
                      "bytes_out": report.bytes_out}), flush=True)


def _worker_digests(worker):
    import torch

    torch.cuda.synchronize()
    return {n: hashlib.sha256(p.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()[:16]
            for n, p in worker.model_runner.model.named_parameters()}


def _worker_layout(worker):
    return {n: [str(p.dtype), list(p.shape), list(p.stride()), p.is_contiguous()]
            for n, p in worker.model_runner.model.named_parameters()}


def role_engine(plan_file: str, out: str) -> None:
    import torch
    from safetensors.torch import load_file
    from vllm.compilation.counter import compilation_counter

    plan = json.loads(Path(plan_file).read_text())
    record = {"versions": [], "vllm_reload": []}

    def save():
        Path(out).write_text(json.dumps(record, indent=1))

    t0 = time.monotonic()
    llm = start_llm(plan["fp8"][0], worker_extension_cls="refit.vllm.RefitWorker")
    record["start_s"] = time.monotonic() - t0
    record["layout"] = llm.collective_rpc(_worker_layout)[0]
    save()
    expected0 = {k: digest(v) for k, v in safetensors_bytes(Path(plan["engine_layout"][0])).items()}
    loaded = llm.collective_rpc(_worker_digests)[0]
    record["loaded_equals_engine_layout"] = loaded == expected0
    record["loaded_differing"] = sorted(n for n in set(expected0) | set(loaded) if loaded.get(n) != expected0.get(n))
    record["outputs0"] = generate(llm)
    status = llm.collective_rpc("refit_attach", args=(plan["address"], plan["model"]))[0]
    record["attached"] = status
    addresses = llm.collective_rpc("refit_param_addresses")[0]
    graphs = compilation_counter.num_cudagraph_captured
    record["graphs_after_start"] = graphs
    save()
    for k in range(1, len(plan["bf16"])):
        env = dict(os.environ)
        trainer = subprocess.Popen([sys.executable, __file__, "trainer", plan["address"], plan["model"], plan["bf16"][k],
                                    f"v{k}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        during = 0
        while trainer.poll() is None:  # rollouts go on while the trainer pushes; the commit pauses them
            generate(llm)
            during += 1
        stdout, stderr = trainer.communicate()
        lines = [json.loads(l) for l in stdout.splitlines() if l.startswith("{")]
        entry = {"k": k, "trainer_rc": trainer.returncode, "trainer": lines[-1] if lines else None,
                 "trainer_stderr": stderr[-3000:] if trainer.returncode else "", "generates_during_refit": during}
        record["versions"].append(entry)
        save()
        if trainer.returncode != 0 or not lines or lines[-1]["outcome"] != "committed":
            break
        llm.collective_rpc("refit_wait_for_version", args=(lines[-1]["version"], 60.0))
        entry["status"] = llm.collective_rpc("refit_status")[0]
        entry["outputs"] = generate(llm)
        expected = {kk: digest(v) for kk, v in safetensors_bytes(Path(plan["engine_layout"][k])).items()}
        got = llm.collective_rpc(_worker_digests)[0]
        entry["params_equal_engine_layout"] = got == expected
        entry["params_differing"] = sorted(n for n in expected if got.get(n) != expected[n])[:10]
        entry["addresses_unchanged"] = llm.collective_rpc("refit_param_addresses")[0] == addresses
        entry["graphs_captured"] = compilation_counter.num_cudagraph_captured
        save()
    # vLLM's own path for the same versions: the FP8 checkpoint's tensors already on the GPU,
    # through reload_weights (layerwise reload: load_weights, process_weights_after_loading,
    # copied back into the original storage).
    for k in range(1, len(plan["fp8"])):
        weights = [(n, t.to("cuda")) for n, t in load_file(str(Path(plan["fp8"][k]) / "model.safetensors")).items()]
        torch.cuda.synchronize()
        t1 = time.monotonic()
        llm.collective_rpc(lambda w, ws=weights: w.model_runner.reload_weights(weights_iterator=iter(ws)))
        torch.cuda.synchronize()
        ms = (time.monotonic() - t1) * 1e3
        entry = {"k": k, "reload_ms": ms, "outputs": generate(llm)}
        expected = {kk: digest(v) for kk, v in safetensors_bytes(Path(plan["engine_layout"][k])).items()}
        entry["params_equal_engine_layout"] = llm.collective_rpc(_worker_digests)[0] == expected
        entry["addresses_unchanged"] = llm.collective_rpc("refit_param_addresses")[0] == addresses
        entry["graphs_captured"] = compilation_counter.num_cudagraph_captured
        record["vllm_reload"].append(entry)
        save()
    llm.collective_rpc("refit_detach")
    record["done"] = True
    save()


def main(argv):
    role = argv[1]
    if role == "model":
        write_model(Path(argv[2]), int(argv[3]))
    elif role == "reference":
        role_reference(argv[2], argv[3])
    elif role == "trainer":
        role_trainer(*argv[2:6])
    elif role == "engine":
        role_engine(argv[2], argv[3])
    else:
        raise SystemExit(f"unknown role {role!r}: model, reference, trainer or engine")


if __name__ == "__main__":
    main(sys.argv)
