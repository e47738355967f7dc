"""refitctl's command line: --help, per-command help, --version and `version`, usage errors that
print the usage and name what is wrong (exit 2), flags before or after arguments."""
import json
import struct
import subprocess
import sys

from conftest import REFITCTL, REFITD, SRC, run

COMMANDS = ["status", "refit", "commit", "rollback", "versions", "abort", "verify", "quantize", "formats", "convert",
            "spec lint", "spec init", "version"]


def test_help_lists_every_command():
    for args in [["--help"], ["-h"], ["help"]]:
        p = run(REFITCTL, *args)
        assert p.returncode == 0, p.stderr
        for c in COMMANDS:
            assert f"  {c}\n" in p.stdout, c


def test_formats_lists_the_format_table():
    p = run(REFITCTL, "formats", "--json")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    names = [r["name"] for r in rows]
    assert len(set(names)) == len(names)
    assert {"bf16", "fp16", "fp32", "fp8_block128", "nvfp4", "mxfp4"} <= set(names)
    nvfp4 = rows[names.index("nvfp4")]
    assert nvfp4["quantized"] and nvfp4["global_amax"] and nvfp4["block"] == [1, 16]
    assert [o["suffix"] for o in nvfp4["outputs"]] == ["", "_scale", "_scale_2"]
    assert not rows[names.index("bf16")]["quantized"]
    text = run(REFITCTL, "formats")
    assert text.returncode == 0, text.stderr
    assert [line.split()[0] for line in text.stdout.splitlines()] == names


def test_no_command_is_a_usage_error():
    p = run(REFITCTL)
    assert p.returncode == 2 and "usage: refitctl" in p.stderr
    p = run(REFITCTL, "frobnicate")
    assert p.returncode == 2 and "unknown command 'frobnicate'" in p.stderr


def test_per_command_help():
    for c in COMMANDS:
        p = run(REFITCTL, *c.split(), "--help")
        assert p.returncode == 0, (c, p.stderr)
        assert p.stdout.startswith(f"usage: refitctl {c}"), p.stdout
        q = run(REFITCTL, "help", *c.split())
        assert q.returncode == 0 and q.stdout == p.stdout
    p = run(REFITCTL, "status", "--help")
    assert "--address=ADDRESS" in p.stdout and "$REFITD_ADDRESS" in p.stdout and "--json" in p.stdout


def test_missing_argument_names_it():
    p = run(REFITCTL, "refit")
    assert p.returncode == 2
    assert "refitctl refit: missing CHECKPOINT" in p.stderr and "usage: refitctl refit " in p.stderr
    p = run(REFITCTL, "convert", "--spec", "x.yaml", "in")
    assert p.returncode == 2 and "missing OUT_DIR" in p.stderr


def test_unknown_flag_and_missing_value_name_the_flag():
    p = run(REFITCTL, "status", "--bogus")
    assert p.returncode == 2 and "unknown flag '--bogus'" in p.stderr and "usage: refitctl status" in p.stderr
    # --strict is verify's: status does not take it.
    p = run(REFITCTL, "status", "--strict")
    assert p.returncode == 2 and "unknown flag '--strict'" in p.stderr
    p = run(REFITCTL, "status", "--address")
    assert p.returncode == 2 and "--address needs a value" in p.stderr
    p = run(REFITCTL, "status", "extra")
    assert p.returncode == 2 and "unexpected argument 'extra'" in p.stderr
    p = run(REFITCTL, "quantize", "a", "b")
    assert p.returncode == 2 and "--format is required" in p.stderr


def test_both_value_forms_reach_the_daemon_address(tmp_path):
    for args in [["--address", "unix:/nonexistent/sock"], ["--address=unix:/nonexistent/sock"]]:
        p = run(REFITCTL, "status", *args)
        assert p.returncode == 1 and "unix:/nonexistent/sock" in p.stderr, p.stderr
    p = run(REFITCTL, "status", env={"REFITD_ADDRESS": "unix:/nonexistent/env-sock"})
    assert p.returncode == 1 and "env-sock" in p.stderr


def test_version():
    p = run(REFITCTL, "--version")
    assert p.returncode == 0 and p.stdout.startswith("refitctl "), p.stdout
    p = run(REFITCTL, "version", "--json", "--address", "unix:/nonexistent/sock")
    assert p.returncode == 1
    out = json.loads(p.stdout)
    assert out["client"]["version"] and out["daemon"] == {
        "address": "unix:/nonexistent/sock", "reachable": False, "error": out["daemon"]["error"]}
    p = run(REFITCTL, "version", "--address", "unix:/nonexistent/sock")
    assert p.returncode == 1
    assert p.stdout.startswith("refitctl ") and "refitd   unreachable at unix:/nonexistent/sock" in p.stdout
    assert "only the client version is known" in p.stdout


def test_version_shows_the_daemon_version(tmp_path):
    """A live refitd reports its build version and commit over the control plane."""
    import subprocess
    import time
    sock = tmp_path / "refitd.sock"
    log = open(tmp_path / "refitd.log", "w")
    daemon = subprocess.Popen([str(REFITD), "--listen", f"unix:{sock}", "--admin-listen", "127.0.0.1:0"],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        # Listening once it says so: the socket's file exists a moment before the listen.
        listening = lambda: "event=listening" in (tmp_path / "refitd.log").read_text()  # noqa: E731
        while not listening() and daemon.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert listening(), (tmp_path / "refitd.log").read_text()
        client = run(REFITCTL, "--version").stdout.split()[1]
        daemon_version = run(REFITD, "--version").stdout
        p = run(REFITCTL, "version", "--json", "--address", f"unix:{sock}")
        assert p.returncode == 0, p.stdout + p.stderr
        out = json.loads(p.stdout)
        assert out["ok"] and out["client"]["version"] == client
        assert out["daemon"]["reachable"] and out["daemon"]["model"] == "demo-llama"
        assert out["daemon"]["version"] == client and out["daemon"]["version"] in daemon_version
        assert out["daemon"]["commit"] == out["client"]["commit"] and out["daemon"]["commit"]
        p = run(REFITCTL, "version", "--address", f"unix:{sock}")
        assert p.returncode == 0
        lines = p.stdout.splitlines()
        assert lines[0].startswith(f"refitctl {client} (commit ")
        assert lines[1].startswith(f"refitd   {client} (commit {out['daemon']['commit']}) at unix:{sock}"), lines
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        log.close()


def write_safetensors(path, names):
    header, offset = {}, 0
    for n in names:
        header[n] = {"dtype": "BF16", "shape": [2, 2], "data_offsets": [offset, offset + 8]}
        offset += 8
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + b"\0" * offset)


def test_spec_lint(tmp_path):
    spec = SRC / "deploy/models/demo-llama.yaml"
    p = run(REFITCTL, "spec", "lint", spec)
    assert p.returncode == 0 and "model demo-llama" in p.stdout, p.stderr
    layer = "model.layers.0"
    full = [f"{layer}.self_attn.{x}_proj.weight" for x in "qkvo"] + \
        [f"{layer}.mlp.{x}_proj.weight" for x in ["gate", "up", "down"]] + ["model.norm.weight"]
    write_safetensors(tmp_path / "full.safetensors", full)
    p = run(REFITCTL, "spec", "lint", spec, "--checkpoint", tmp_path / "full.safetensors", "--json")
    out = json.loads(p.stdout)
    assert p.returncode == 0 and out["ok"], p.stdout
    assert out["tensors_taking_defaults"] == ["model.norm.weight"] and out["rules_matching_nothing"] == []
    # No MLP tensors: the MLP rule matches nothing.
    write_safetensors(tmp_path / "attn.safetensors", full[:4])
    p = run(REFITCTL, "spec", "lint", f"--checkpoint={tmp_path / 'attn.safetensors'}", spec)
    assert p.returncode == 1 and "rule matches no tensor: line" in p.stdout and "mlp" in p.stdout, p.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: x\nrules:\n  - match: \"a.{L}.w\"\n    format: fp9\n")
    p = run(REFITCTL, "spec", "lint", bad)
    assert p.returncode == 1 and "fp9" in p.stderr, p.stderr
    p = run(REFITCTL, "spec", "lint")
    assert p.returncode == 2 and "missing SPEC" in p.stderr


def test_spec_init_from_a_checkpoint_lints_clean(tmp_path):
    """spec init writes a skeleton whose rules cover every tensor of the checkpoint, one rule per
    family of names ({L} layers, {E} experts, alternations), and spec lint passes it."""
    layers, experts = 3, 4
    names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    for l in range(layers):
        p = f"model.layers.{l}"
        names += [f"{p}.self_attn.{x}_proj.weight" for x in "qkvo"]
        names += [f"{p}.{n}.weight" for n in ["input_layernorm", "post_attention_layernorm"]]
        names += [f"{p}.mlp.gate.weight"]
        names += [f"{p}.mlp.experts.{e}.{x}_proj.weight" for e in range(experts) for x in ["gate", "up", "down"]]
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    # Two shards with an index, as HF writes them.
    half = len(names) // 2
    write_safetensors(ckpt / "model-00001-of-00002.safetensors", names[:half])
    write_safetensors(ckpt / "model-00002-of-00002.safetensors", names[half:])
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        n: f"model-0000{1 if i < half else 2}-of-00002.safetensors" for i, n in enumerate(names)}}))
    spec = tmp_path / "spec.yaml"
    p = run(REFITCTL, "spec", "init", "--checkpoint", ckpt, "--model", "tiny-moe", "--output", spec)
    assert p.returncode == 0, p.stderr
    text = spec.read_text()
    matches = [l.split('"')[1] for l in text.splitlines() if l.strip().startswith("- match:")]
    assert "model.layers.{L}.mlp.experts.{E}.{down_proj,gate_proj,up_proj}.weight" in matches, matches
    assert "model.layers.{L}.self_attn.{k_proj,o_proj,q_proj,v_proj}.weight" in matches, matches
    assert len(matches) <= 6, matches  # families, not one rule per tensor
    assert 'model: "tiny-moe"' in text
    p = run(REFITCTL, "spec", "lint", spec, "--checkpoint", ckpt, "--json")
    out = json.loads(p.stdout)
    assert p.returncode == 0 and out["ok"], p.stdout + p.stderr
    assert out["tensors"] == len(names)
    assert out["rules_matching_nothing"] == [] and out["conflicts"] == [] and out["tensors_taking_defaults"] == []
    # refitd loads it too.
    p = run(REFITD, "--model-spec", spec, "--listen", "unix:/nonexistent/x.sock", "--print-config")
    assert p.returncode == 0 and "model: tiny-moe" in p.stdout, p.stdout + p.stderr
    # Without --output it prints the same spec.
    p = run(REFITCTL, "spec", "init", "--checkpoint", ckpt, "--model", "tiny-moe")
    assert p.returncode == 0 and p.stdout == text


def test_spec_init_from_the_demo_checkpoint(tmp_path):
    trainer = REFITCTL.parent / "examples/example_trainer"
    p = run(trainer, "--dump", tmp_path, "--seed", "1")
    assert p.returncode == 0, p.stderr
    spec = tmp_path / "spec.yaml"
    p = run(REFITCTL, "spec", "init", "--checkpoint", tmp_path / "model.safetensors", "--output", spec)
    assert p.returncode == 0, p.stderr
    p = run(REFITCTL, "spec", "lint", spec, "--checkpoint", tmp_path / "model.safetensors", "--json")
    out = json.loads(p.stdout)
    assert p.returncode == 0 and out["ok"] and out["tensors_taking_defaults"] == [], p.stdout


def test_spec_init_errors(tmp_path):
    p = run(REFITCTL, "spec", "init")
    assert p.returncode == 2 and "give --checkpoint, --engine, or both" in p.stderr
    p = run(REFITCTL, "spec", "init", "--checkpoint", tmp_path / "missing")
    assert p.returncode == 1 and "missing" in p.stderr
    write_safetensors(tmp_path / "odd.safetensors", ["a.{x}.weight"])
    p = run(REFITCTL, "spec", "init", "--checkpoint", tmp_path / "odd.safetensors")
    assert p.returncode == 1 and "tensor 'a.{x}.weight'" in p.stderr, p.stderr
    p = run(REFITCTL, "spec", "init", "--engine", "--address", "unix:/nonexistent/sock")
    assert p.returncode == 1 and "/nonexistent/sock" in p.stderr


def engine_shapes(out_dir):
    """{name: shape} of the engine.safetensors `convert --engine-layout` wrote into `out_dir`."""
    raw = (out_dir / "engine.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return {k: v["shape"] for k, v in json.loads(raw[8:8 + n]).items() if k != "__metadata__"}


def test_a_spec_that_leaves_the_size_to_the_engine_lints_converts_and_prints(tmp_path):
    """The shipped llama3_fp8.yaml states no tensor-parallel size (tensor_parallel: {size: engine}):
    spec lint and refitd --print-config say so; convert --engine-layout writes one engine holding
    every parameter whole, or with --tp-size N --tp-rank R rank R's part, and --tp-rank alone is
    refused naming --tp-size; a spec that states its size refuses another --tp-size."""
    spec = SRC / "deploy/models/llama3_fp8.yaml"
    p = run(REFITCTL, "spec", "lint", spec, "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["ok"] and out["tensor_parallel"] == "engine", out
    p = run(REFITCTL, "spec", "lint", spec)
    assert p.returncode == 0 and "tensor_parallel.size: engine" in p.stdout, p.stdout + p.stderr
    p = run(REFITD, "--model-spec", spec, "--listen", "unix:/nonexistent/x.sock", "--print-config")
    assert p.returncode == 0 and "tensor_parallel: engine\n" in p.stdout, p.stdout + p.stderr

    ckpt = tmp_path / "ckpt"
    subprocess.run([sys.executable, str(SRC / "tests/integration/specs/make_checkpoints.py"), "llama3", str(ckpt),
                    "--seed", "1"], check=True)
    qkv = "model.layers.0.self_attn.qkv_proj.weight"
    o = "model.layers.0.self_attn.o_proj.weight"
    p = run(REFITCTL, "convert", "--spec", spec, "--engine-layout", ckpt, tmp_path / "whole")
    assert p.returncode == 0, p.stderr
    whole = engine_shapes(tmp_path / "whole")
    p = run(REFITCTL, "convert", "--spec", spec, "--engine-layout", "--tp-size", "2", "--tp-rank", "1", ckpt,
            tmp_path / "rank1")
    assert p.returncode == 0, p.stderr
    rank1 = engine_shapes(tmp_path / "rank1")
    assert rank1[qkv] == [whole[qkv][0] // 2, whole[qkv][1]], (whole[qkv], rank1[qkv])
    assert rank1[o] == [whole[o][0], whole[o][1] // 2], (whole[o], rank1[o])
    p = run(REFITCTL, "convert", "--spec", spec, "--engine-layout", "--tp-rank", "1", ckpt, tmp_path / "norank")
    assert p.returncode == 1 and "give the engine's size with --tp-size" in p.stderr, p.stderr
    p = run(REFITCTL, "convert", "--spec", spec, "--engine-layout", "--tp-size", "2", "--tp-rank", "2", ckpt,
            tmp_path / "outside")
    assert p.returncode == 1 and "--tp-rank: tp_rank 2 is outside tensor_parallel.size 2" in p.stderr, p.stderr

    stated = tmp_path / "tp2.yaml"
    stated.write_text(spec.read_text().replace("tensor_parallel: {size: engine}", "tensor_parallel: {size: 2}"))
    p = run(REFITCTL, "convert", "--spec", stated, "--engine-layout", "--tp-size", "4", "--tp-rank", "1", ckpt,
            tmp_path / "mismatch")
    assert p.returncode == 1 and "tp_size: the engine has tensor-parallel size 4, the spec's tensor_parallel.size " \
        "is 2" in p.stderr, p.stderr
    p = run(REFITCTL, "convert", "--spec", stated, "--engine-layout", "--tp-rank", "1", ckpt, tmp_path / "stated")
    assert p.returncode == 0, p.stderr
    assert engine_shapes(tmp_path / "stated") == rank1
