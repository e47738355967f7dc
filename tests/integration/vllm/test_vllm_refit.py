"""vLLM as the serving engine, for real: refitd refits a running vLLM (FP8 block-128 Llama, CUDA
graphs on) in place through refit.vllm.RefitWorker, three times, each from a trainer process
pushing BF16 tensors from the GPU, while vLLM keeps generating. After each commit:
  - vLLM's parameters equal `refitctl convert --engine-layout` of the pushed weights byte for byte
    (and, before any refit, vLLM's own load of the converted checkpoint equals it too: the shipped
    spec's engine layout is what vLLM holds after process_weights_after_loading);
  - greedy tokens and logprobs equal a fresh vLLM started from `refitctl convert` of the same
    weights (a process of its own);
  - no parameter address changed and vLLM captured no CUDA graph since it started.
Then the same versions through vLLM's own in-place reload (reload_weights with the converted
tensors on the GPU), checked the same way; both paths' times are printed (docs/benchmarks.md).

The spec is the shipped deploy/models/llama3_fp8_ue8m0.yaml (what vLLM holds on Hopper, where
it requantizes block-FP8 weights to power-of-two scales at load), unedited: its
tensor_parallel.size is the engine's, and a single-GPU vLLM registers as one engine. Skips, saying why, without vLLM, a CUDA device or a
CUDA build of refitd. vLLM itself does not come from the project's setup: on a GPU machine,
tools/vllm/bundle's site directory on PYTHONPATH provides it."""
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "harness"))
import refit_harness as h  # noqa: E402
from refit_harness import BIN, REFITCTL, REFITD, SRC  # noqa: E402

ROLES = HERE / "vllm_roles.py"
VERSIONS = 4  # version 0 is what vLLM starts from; 1..3 are refitted


def _skip_reason():
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not importable (on a GPU machine: tools/vllm/bundle, then PYTHONPATH=its site directory)"
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return f"torch is not importable ({e})"
    if not torch.cuda.is_available():
        return "no CUDA device visible to torch"
    cache = BIN / "CMakeCache.txt"
    if not cache.exists() or "REFIT_CUDA:BOOL=ON" not in cache.read_text():
        return "refitd was built without CUDA"
    return ""


pytestmark = pytest.mark.skipif(bool(_skip_reason()), reason=_skip_reason() or "runs")


def _run(args, **kw):
    p = subprocess.run(args, capture_output=True, text=True, **kw)
    assert p.returncode == 0, f"{args}\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    return p


def _same_outputs(a, b, what):
    assert len(a) == len(b), what
    for i, (x, y) in enumerate(zip(a, b)):
        assert x["tokens"] == y["tokens"], f"{what}: prompt {i} greedy tokens differ: {x['tokens']} vs {y['tokens']}"
        diff = max(abs(p - q) for p, q in zip(x["logprobs"], y["logprobs"]))
        assert diff <= 1e-5, f"{what}: prompt {i} logprobs differ by {diff}"


def test_vllm_refitted_in_place_equals_a_fresh_vllm_of_the_converted_weights(tmp_path):
    spec = SRC / "deploy/models/llama3_fp8_ue8m0.yaml"  # as shipped: the single-GPU vLLM registers as one engine
    bf16, fp8, layout = [], [], []
    for k in range(VERSIONS):
        d = tmp_path / f"bf16-v{k}"
        _run([sys.executable, str(ROLES), "model", str(d), str(100 + k)])
        out = tmp_path / f"fp8-v{k}"
        _run([str(REFITCTL), "convert", "--engine-layout", "--spec", str(spec), str(d), str(out)])
        qc = json.loads((out / "config.json").read_text()).get("quantization_config", {})
        assert qc.get("quant_method") == "fp8" and qc.get("weight_block_size") == [128, 128], qc
        bf16.append(str(d)), fp8.append(str(out)), layout.append(str(out / "engine.safetensors"))

    # Fresh vLLMs of versions 1..3, one process each, all at once beside the refitted one.
    refs, ref_errors = {}, []

    def references():
        procs = {k: subprocess.Popen([sys.executable, str(ROLES), "reference", fp8[k], str(tmp_path / f"reference-v{k}.json")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for k in range(1, VERSIONS)}
        for k, proc in procs.items():
            _, err = proc.communicate(timeout=900)
            if proc.returncode != 0:
                ref_errors.append(f"reference v{k}: {err[-4000:]}")
            else:
                refs[k] = json.loads((tmp_path / f"reference-v{k}.json").read_text())

    ref_thread = threading.Thread(target=references)
    ref_thread.start()

    sock = tmp_path / "refitd.sock"
    cfg = tmp_path / "refitd.yaml"
    cfg.write_text(f"listen: unix:{sock}\nstaging: device\nmodel_spec: {spec}\nmodel_config: {bf16[0]}/config.json\n")
    log = tmp_path / "refitd.log"
    daemon = subprocess.Popen([str(REFITD), "--config", str(cfg)], stdout=open(log, "w"), stderr=subprocess.STDOUT)
    try:
        h.wait_for(lambda: "event=listening" in log.read_text() or daemon.poll() is not None, 30, "refitd listening")
        assert daemon.poll() is None, log.read_text()
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps({"address": f"unix:{sock}", "model": "llama3-fp8-ue8m0", "bf16": bf16, "fp8": fp8,
                                    "engine_layout": layout}))
        result = tmp_path / "engine.json"
        p = subprocess.run([sys.executable, str(ROLES), "engine", str(plan), str(result)], capture_output=True,
                           text=True, timeout=900)
        record = json.loads(result.read_text()) if result.exists() else {}
        out_dir = os.environ.get("REFIT_VLLM_RESULTS")
        if out_dir:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            Path(out_dir, "engine.json").write_text(json.dumps(record, indent=1))
            Path(out_dir, "engine.log").write_text(p.stdout[-200000:] + p.stderr[-200000:])
            Path(out_dir, "refitd.log").write_text(log.read_text()[-200000:])
            ref_thread.join(timeout=900)
            Path(out_dir, "references.json").write_text(json.dumps(refs, indent=1))
        assert p.returncode == 0, f"{p.stderr[-6000:]}\n{log.read_text()[-3000:]}"
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=30)
        ref_thread.join(timeout=900)
    assert not ref_errors, ref_errors
    assert record.get("done"), record

    # vLLM's own load of the converted checkpoint is the spec's engine layout, byte for byte.
    assert record["loaded_equals_engine_layout"], (record["loaded_differing"], record["layout"])
    graphs = record["graphs_after_start"]
    assert graphs > 0, "vLLM captured no CUDA graph: the test would not show graphs staying valid"
    versions = record["versions"]
    assert [v["k"] for v in versions] == [1, 2, 3], versions
    for v in versions:
        k = v["k"]
        assert v["trainer_rc"] == 0 and v["trainer"]["outcome"] == "committed", v
        assert v["status"]["version"] == v["trainer"]["version"] and v["status"]["tag"] == f"v{k}", v["status"]
        assert v["params_equal_engine_layout"], (k, v["params_differing"])
        assert v["addresses_unchanged"], k
        assert v["graphs_captured"] == graphs, (k, v["graphs_captured"], graphs)
        _same_outputs(v["outputs"], refs[k]["outputs"], f"refitd refit to v{k} vs a fresh vLLM of v{k}")
        assert v["outputs"] != record["outputs0"], f"v{k} generates what v0 did: the refit changed nothing visible"
    for v in record["vllm_reload"]:
        k = v["k"]
        assert v["params_equal_engine_layout"], k
        _same_outputs(v["outputs"], refs[k]["outputs"], f"vLLM's own reload of v{k} vs a fresh vLLM of v{k}")
    summary = {"refitd_refit_wall_ms": [v["trainer"]["wall_ms"] for v in versions],
               "refitd_times_ms": [v["trainer"]["times_ms"] for v in versions],
               "refitd_commit_windows_ms": versions[-1]["status"]["commit_windows_ms"],
               "generates_during_refit": [v["generates_during_refit"] for v in versions],
               "vllm_reload_ms": [v["reload_ms"] for v in record["vllm_reload"]],
               "vllm_reload_addresses_unchanged": [v["addresses_unchanged"] for v in record["vllm_reload"]],
               "vllm_reload_graphs_captured": [v["graphs_captured"] - graphs for v in record["vllm_reload"]],
               "vllm_start_s": record["start_s"], "reference_start_s": [refs[k]["start_s"] for k in sorted(refs)]}
    print("vllm-refit-summary " + json.dumps(summary))
