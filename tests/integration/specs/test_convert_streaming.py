"""`refitctl convert` at checkpoint scale, on every family of deploy/models/: the output is byte
for byte the same for any worker count, sharded output holds exactly the one-file output's
tensors with an index naming each one's shard, and --json prints progress lines."""
import hashlib
import re
import json
import subprocess

import pytest

from conftest import REFITCTL, make_checkpoint
from test_families import FAMILIES, MODELS

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "golden"))
import st_io  # noqa: E402


def run_convert(spec, checkpoint, out, *flags):
    p = subprocess.run([str(REFITCTL), "convert", "--spec", str(spec), *flags, str(checkpoint), str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return p


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_threads_and_shards_give_the_same_tensors(family, tmp_path):
    spec = MODELS / FAMILIES[family][0]
    ckpt = make_checkpoint(family, tmp_path / "ckpt", seed=5)
    one = tmp_path / "one"
    run_convert(spec, ckpt, one, "--threads", "1")
    many = tmp_path / "many"
    run_convert(spec, ckpt, many, "--threads=4")
    files = sorted(p.name for p in one.iterdir())
    assert "model.safetensors" in files
    assert sorted(p.name for p in many.iterdir()) == files
    for f in files:
        assert digest(one / f) == digest(many / f), f

    # Shards of at most 64 KB of tensor data.
    sharded = tmp_path / "sharded"
    p = run_convert(spec, ckpt, sharded, "--max-shard-size", "64KB", "--json", "--threads", "3")
    lines = [json.loads(l) for l in p.stdout.splitlines()]
    assert lines[-1]["ok"] and lines[-1]["threads"] == 3
    progress = [l for l in lines if l.get("event") == "progress"]
    assert progress and progress[-1]["tensors_done"] == progress[-1]["tensors"] == lines[-1]["tensors"]
    assert not (sharded / "model.safetensors").exists()
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    shard_files = sorted(set(index["weight_map"].values()))
    assert len(shard_files) > 1 and shard_files[-1] == f"model-{len(shard_files):05d}-of-{len(shard_files):05d}.safetensors"
    reference, _ = st_io.read(one / "model.safetensors")
    got, total = {}, 0
    for f in shard_files:
        tensors, _ = st_io.read(sharded / f)
        size = sum(len(t[2]) for t in tensors.values())
        assert size <= 64000 or len(tensors) == 1, (f, size)
        for name, t in tensors.items():
            assert index["weight_map"][name] == f
            got[name] = t
            total += len(t[2])
    assert index["metadata"]["total_size"] == total
    assert got.keys() == reference.keys()
    for name in reference:
        assert got[name] == reference[name], name
    for f in files:
        if f != "model.safetensors":
            assert digest(sharded / f) == digest(one / f), f


def test_usage_errors(tmp_path):
    p = subprocess.run([str(REFITCTL), "convert", "--spec", "x.yaml", "--max-shard-size", "5XB", "a", "b"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "--max-shard-size: '5XB' is not a size" in p.stderr
    p = subprocess.run([str(REFITCTL), "convert", "--spec", "x.yaml", "--threads", "-1", "a", "b"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "--threads" in p.stderr


def test_progress_line_and_listing(tmp_path):
    spec = MODELS / FAMILIES["llama3"][0]
    ckpt = make_checkpoint("llama3", tmp_path / "ckpt", seed=2)
    p = run_convert(spec, ckpt, tmp_path / "out", "--progress")
    # A status line rewritten in place on stderr, ending with every tensor written; the output
    # tensors are listed on stdout.
    lines = [l for l in re.split(r"[\r\n]+", p.stderr) if l.strip()]  # text mode turns \r into \n
    last = lines[-1]
    listed = [l for l in p.stdout.splitlines() if l]
    assert last.startswith(f"converting: {len(listed)}/{len(listed)} tensors"), p.stderr
    assert "shard 1/1" in last and "GB/s" in last
    assert listed == sorted(listed) and listed[0].split()[0] in p.stdout


@pytest.mark.parametrize("family", ["llama3", "qwen3_moe"])
def test_output_config_is_the_models_with_the_conversions_quantization_config(family, tmp_path):
    # The output directory loads in an engine as it is: its config.json is the model's own (the
    # checkpoint's, or --model-config's) with the conversion's quantization_config in place of
    # any the model had.
    spec = MODELS / FAMILIES[family][0]
    ckpt = make_checkpoint(family, tmp_path / "ckpt", seed=3)
    model = json.loads((ckpt / "config.json").read_text())
    model["quantization_config"] = {"quant_method": "stale"}
    (ckpt / "config.json").write_text(json.dumps(model))
    run_convert(spec, ckpt, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert {k: v for k, v in written.items() if k != "quantization_config"} == \
        {k: v for k, v in model.items() if k != "quantization_config"}
    qc = written["quantization_config"]
    if family == "llama3":
        assert qc["quant_method"] == "fp8" and qc["weight_block_size"] == [128, 128], qc
    else:
        assert qc["quant_method"] == "modelopt" and (tmp_path / "out" / "hf_quant_config.json").exists(), qc
    other = dict(model, architectures=["OtherForCausalLM"])
    (tmp_path / "other.json").write_text(json.dumps(other))
    run_convert(spec, ckpt, tmp_path / "out2", "--model-config", str(tmp_path / "other.json"))
    assert json.loads((tmp_path / "out2" / "config.json").read_text())["architectures"] == ["OtherForCausalLM"]
