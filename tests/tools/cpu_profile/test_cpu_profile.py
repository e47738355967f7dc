"""REFIT_CPU_PROFILE in a real process: session_bench (the real Session on the CPU) profiled,
its profile symbolized by tools/cpu_profile.py against the build, naming the session's threads and
the functions where the conversion spends its time; no variable, no profile."""
import os
import re
import subprocess
import sys
from pathlib import Path

SRC = Path(os.environ.get("REFIT_SOURCE_DIR", Path(__file__).resolve().parents[3]))
BUILD = Path(os.environ.get("REFIT_BINARY_DIR", SRC / "build"))
BENCH = BUILD / "tools/bench/session_bench"
TOOL = SRC / "tools/cpu_profile.py"


def run_bench(tmp_path, env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("REFIT_CPU_PROFILE")}
    env.update(env_extra)
    out = subprocess.run([str(BENCH), "--model", "moe", "--spec", "nvfp4", "--iters", "2"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    return out


def test_a_profiled_process_names_its_threads_and_functions(tmp_path):
    run_bench(tmp_path, {"REFIT_CPU_PROFILE": str(tmp_path / "bench.%p.prof"), "REFIT_CPU_PROFILE_HZ": "2000"})
    files = list(tmp_path.glob("bench.*.prof"))
    assert len(files) == 1 and files[0].name != "bench.%p.prof", files
    text = files[0].read_text()
    assert text.startswith("refit-cpu-profile 1\n") and "\nmaps\n" in text
    samples = [line for line in text.splitlines() if line.startswith("s ")]
    assert len(samples) >= 50, len(samples)  # a second of CPU time at 2 kHz, at least
    report = subprocess.run([sys.executable, str(TOOL), str(files[0]), "--build", str(BUILD), "--top", "200"],
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    out = report.stdout
    assert "session_bench" in out.split("by self time")[0]  # the main thread, by name
    inclusive = out.split("by inclusive time:")[1]
    # The session's converter loop and the reference NVFP4 quantizer it runs, symbolized.
    assert "refit::Session::Convert(" in inclusive, inclusive
    assert "refit::formats::nvfp4::QuantizeModelOpt" in inclusive, inclusive
    under = subprocess.run([sys.executable, str(TOOL), str(files[0]), "--build", str(BUILD), "--under",
                            "Session::ConvertLoop"], capture_output=True, text=True, timeout=120)
    assert under.returncode == 0, under.stderr
    kept = int(under.stdout.split(" samples of all threads, under")[0].rsplit("\n", 1)[-1])
    assert 0 < kept < len(samples), under.stdout


def test_the_wall_clock_samples_threads_where_they_wait(tmp_path):
    # The session's receive loop spends most of a run blocked (waiting for an announce or a ring
    # slot): on the CPU clock it is hardly sampled, on the wall clock it is, inside its waits.
    run_bench(tmp_path, {"REFIT_CPU_PROFILE": str(tmp_path / "wall.%p.prof"), "REFIT_CPU_PROFILE_CLOCK": "wall",
                         "REFIT_CPU_PROFILE_HZ": "2000"})
    files = list(tmp_path.glob("wall.*.prof"))
    assert len(files) == 1, files
    assert files[0].read_text().startswith("refit-cpu-profile 1\nclock wall\n")
    under = subprocess.run([sys.executable, str(TOOL), str(files[0]), "--build", str(BUILD), "--under",
                            "Session::ReceiveLoop", "--top", "50"], capture_output=True, text=True, timeout=120)
    assert under.returncode == 0, under.stderr
    assert "clock wall" in under.stdout
    kept = int(under.stdout.split(" samples of all threads, under")[0].rsplit("\n", 1)[-1])
    assert kept >= 10, under.stdout
    inclusive = under.stdout.split("by inclusive time:")[1]
    assert "BucketRing::Acquire" in inclusive or "libabsl_synchronization" in inclusive, inclusive
    # The waits end in the C library, which has no debug information: its exported functions name
    # those samples ("[libc.so.6:NAME]" or "[libc.so.6:after NAME]"), not the bare library.
    assert re.search(r"\[libc\.so\.6:(after )?\w+\]", inclusive), inclusive


def test_a_profile_with_a_duration_is_written_when_it_has_passed(tmp_path):
    # REFIT_CPU_PROFILE_SECONDS: the ticker writes the profile itself once the time has passed
    # (the exit then writes nothing more): the samples of the first 0.02 s only.
    run_bench(tmp_path, {"REFIT_CPU_PROFILE": str(tmp_path / "d.%p.prof"), "REFIT_CPU_PROFILE_CLOCK": "wall",
                         "REFIT_CPU_PROFILE_HZ": "2000", "REFIT_CPU_PROFILE_SECONDS": "0.02"})
    files = list(tmp_path.glob("d.*.prof"))
    assert len(files) == 1, files
    text = files[0].read_text()
    n = int(text.split("\nsamples ")[1].split()[0])
    # At 2 kHz, 0.02 s is 40 ticks of at most ~20 threads; the whole run gives over 2000.
    assert 0 < n < 1200, n
    assert "\nmaps\n" in text


def test_without_the_variable_nothing_is_written(tmp_path):
    run_bench(tmp_path, {})
    assert not list(tmp_path.iterdir())
