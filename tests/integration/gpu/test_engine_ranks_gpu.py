"""Engine ranks on the GPU path under the shipped specs: refitd with deploy/models llama3_fp8 as
shipped (its tensor_parallel.size is the engine's: the ranks register TP=2, or TP=4, and the same
file serves both) and qwen3_moe_nvfp4 (TP=2 x EP=2, stated), its sizes from a small checkpoint's
config.json (sizes whose shards fall on whole blocks), one example engine process per rank, every
rank on GPU 0 with its own CUDA memory (CUDA IPC), `staging: device` and `staging: direct` (and the
same ranks in POSIX shm with `staging: host`, which runs without a GPU). The
example trainer pushes three fresh checkpoints; after each refit every rank's bytes, read back
through refitd rank by rank, equal `refitctl convert`'s. A second GPU is not needed: the ranks
share one, as the daemon allows. Skips without a CUDA device."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import gpu_count

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "harness"))
import refit_harness as h  # noqa: E402

MAKE = ROOT / "tests" / "integration" / "specs" / "make_checkpoints.py"
MODELS = ROOT / "deploy" / "models"

# case -> (shipped spec, checkpoint family, config overrides, tensor_parallel.size, expert_parallel.size)
CASES = {
    "llama3-tp2": ("llama3_fp8.yaml", "llama3", {}, 2, 1),
    # 4 key/value heads of 128 and an intermediate size of 1024: every rank's q/k/v and gate/up
    # rows, and o/down columns, are whole 128-blocks.
    "llama3-tp4": ("llama3_fp8.yaml", "llama3", {"num_key_value_heads": 4, "intermediate_size": 1024}, 4, 1),
    "qwen3moe-tp2-ep2": ("qwen3_moe_nvfp4.yaml", "qwen3_moe", {}, 2, 2),
}


def spec_for(tmp: Path, spec_file: str, tp: int, ep: int) -> Path:
    """The shipped spec as it is when it leaves the engine's size to the engine's registrations
    (tensor_parallel: {size: engine}: each rank registers tp); otherwise with the engine's parallel
    sizes (a deployment choice) stated."""
    if ep == 1 and re.search(r"^tensor_parallel: \{size: engine\}", (MODELS / spec_file).read_text(), re.M):
        return MODELS / spec_file
    lines = [l for l in (MODELS / spec_file).read_text().splitlines()
             if not l.startswith(("tensor_parallel:", "expert_parallel:"))]
    lines.append(f"tensor_parallel: {{size: {tp}}}")
    if ep > 1:
        lines.append(f"expert_parallel: {{size: {ep}}}")
    out = tmp / spec_file
    out.write_text("\n".join(lines) + "\n")
    return out


@pytest.mark.parametrize("staging", ["host", "host-direct", "device", "direct", "device-vmm"])
@pytest.mark.parametrize("case", list(CASES))
def test_engine_ranks_on_one_gpu_refit_byte_equal_to_offline(case, staging, tmp_path):
    # staging: host runs the same ranks in POSIX shm (the CPU path, no GPU needed), host-direct
    # those ranks with staging: direct (each rank's rows converted straight into its shm);
    # device-vmm is staging: device with every rank's weights in CUDA virtual memory (registered
    # by descriptors).
    gpu = None
    if not staging.startswith("host"):
        n, why = gpu_count()
        if n == 0:
            pytest.skip(f"no CUDA device: {why}")
        gpu = 0
    if staging == "device-vmm" and case != "llama3-tp4":
        pytest.skip("one case is enough for the registration kind")
    mode = "direct" if staging == "host-direct" else staging.removesuffix("-vmm")
    refit_three(tmp_path, case, mode, gpu, engine_args=["--vmm"] if "vmm" in staging else [])


@pytest.mark.parametrize("staging", ["device", "direct"])
def test_engine_ranks_refit_over_nccl(nccl_placement, staging, tmp_path):
    """The trainer pushes GPU tensors over NCCL into a TP=4 engine (with one GPU: trainer, refitd and
    every engine rank on GPU 0, refitd and the trainer each with its own NCCL_HOSTID; socket times,
    correctness only)."""
    refit_three(tmp_path, "llama3-tp4", staging, nccl_placement["device"], transport="nccl",
                trainer_gpu=nccl_placement["trainer_gpu"], daemon_env=nccl_placement["env"])


def refit_three(tmp_path, case, staging, gpu, transport="", trainer_gpu=None, daemon_env=None, engine_args=()):
    """Three refits of `case` into its engine ranks (on GPU `gpu`, or in shm when None), each equal to
    refitctl convert rank by rank."""
    spec_file, family, overrides, tp, ep = CASES[case]
    spec = spec_for(tmp_path, spec_file, tp, ep)
    sets = [a for k, v in overrides.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    ckpts, conv = [], []
    for seed in range(4):
        c = tmp_path / f"ckpt{seed}"
        subprocess.run([sys.executable, str(MAKE), family, str(c), "--seed", str(seed), *sets], check=True)
        out = tmp_path / f"conv{seed}"
        p = subprocess.run([str(h.REFITCTL), "convert", "--spec", str(spec), str(c), str(out)],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        ckpts.append(c)
        conv.append(out)
    sock = tmp_path / "refitd.sock"
    address = f"unix:{sock}"
    cfg = tmp_path / "refitd.yaml"
    plane = ""
    if gpu is not None:
        plane = f"data_plane: {{device: {gpu}" + (f", transport: {transport}" if transport else "") + "}\n"
    cfg.write_text(f"listen: {address}\nlog_level: debug\nmodel_config: {ckpts[0] / 'config.json'}\n"
                   f"staging: {staging}\n{plane}")
    log = tmp_path / "refitd.log"
    env = dict(os.environ, **daemon_env) if daemon_env else None
    daemon = h.start_refitd(cfg, log, "--model-spec", str(spec), ready=sock.exists, env=env)
    engines, shms = [], []
    try:
        engines, shms, _ = h.start_rank_engines(tmp_path, address, str(spec), ckpts[0], tp_size=tp,
                                                extra=(["--gpu", gpu] if gpu is not None else []) + list(engine_args))
        assert len(engines) == tp
        pushed = ["--gpu", trainer_gpu] if trainer_gpu is not None else []
        for i in (1, 2, 3):
            p, lines = h.run_trainer(address, "--spec", str(spec), "--tp-size", tp, "--checkpoint", ckpts[i],
                                     "--expected", conv[i], *pushed, timeout=180)
            assert p.returncode == 0, p.stdout + p.stderr + log.read_text()[-3000:]
            r = lines[0]
            assert r["outcome"] == "committed" and r["engine_matches_expected"], r
            if staging == "direct":
                assert 0 < r["bytes_in_place"] <= r["bytes_out"], r
            else:
                assert r["bytes_in_place"] == 0, r
        if transport:
            assert f"data={transport}:" in log.read_text()
        status = json.loads(subprocess.run([str(h.REFITCTL), "status", "--address", address, "--json"],
                                           capture_output=True, text=True).stdout.splitlines()[-1])
        assert [k["version"] for k in status["ranks"]] == [3] * tp, status
        assert not any(k["dirty"] for k in status["ranks"]), status
    finally:
        for e in engines:
            h.kill(e)
        h.kill(daemon)
        h.unlink_shm(*shms)
