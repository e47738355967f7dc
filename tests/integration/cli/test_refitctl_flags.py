"""refitctl's command line: --help, per-command help, --version and `version`, usage errors that
print the usage and name what is wrong (exit 2), flags before or after arguments."""
import json
import struct

from conftest import REFITCTL, SRC, run

COMMANDS = ["status", "refit", "commit", "rollback", "versions", "abort", "verify", "quantize", "convert", "spec lint",
            "version"]


def test_help_lists_every_command():
    for args in [["--help"], ["-h"], ["help"]]:
        p = run(REFITCTL, *args)
        assert p.returncode == 0, p.stderr
        for c in COMMANDS:
            assert f"  {c}\n" in p.stdout, c


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
    assert "refitctl " in p.stdout and "unreachable" in p.stdout


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
