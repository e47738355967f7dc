"""refitd --help / --version exit 0; usage errors exit 2 with the usage and the offending flag;
--flag=value and --flag value; the spellings tests, tools/demo and the units use keep working."""
import re

from conftest import REFITD, SRC, run


def test_help_exits_0_and_lists_every_flag():
    p = run(REFITD, "--help")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("refitd: ")
    for flag in ["--config", "--listen", "--model-spec", "--admin-listen", "--print-config", "--version"]:
        assert flag in p.stdout, flag


def test_version_exits_0():
    p = run(REFITD, "--version")
    version = re.search(r"project\(refitd VERSION (\S+)", (SRC / "CMakeLists.txt").read_text()).group(1)
    assert p.returncode == 0 and p.stdout.startswith(f"refitd {version} (commit "), p.stdout
    # The test build compiles failpoints in, and says so (a release build says "compiled out").
    assert "failpoints: compiled in" in p.stdout


def test_usage_errors_exit_2_naming_the_flag():
    for args, named in [(["--bogus"], "unknown flag '--bogus'"), (["--listen"], "--listen needs a value"),
                        (["--print-config=maybe"], "--print-config"), (["stray"], "unexpected argument 'stray'")]:
        p = run(REFITD, *args)
        assert p.returncode == 2, (args, p.stderr)
        assert named in p.stderr and "usage: refitd " in p.stderr, (args, p.stderr)


def test_both_value_forms_and_spellings(tmp_path):
    spec = SRC / "deploy/models/demo-llama.yaml"
    sock = f"unix:{tmp_path}/r.sock"
    for args in [["--listen", sock, "--model-spec", spec], [f"--listen={sock}", f"--model-spec={spec}"],
                 [f"--listen={sock}", f"--model_spec={spec}"]]:
        p = run(REFITD, *args, "--print-config")
        assert p.returncode == 0, (args, p.stderr)
        assert f"listen: {sock}" in p.stdout and "model: demo-llama" in p.stdout


def test_admin_listen_overrides_the_config(tmp_path):
    cfg = tmp_path / "refitd.yaml"
    cfg.write_text("admin:\n  listen: 127.0.0.1:1\n")
    p = run(REFITD, "--config", cfg, "--admin-listen", "127.0.0.1:0", "--print-config")
    assert p.returncode == 0, p.stderr
