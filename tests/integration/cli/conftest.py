"""Paths of the built binaries (tests/harness/refit_harness.py) and a helper that runs one."""
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "harness"))
from refit_harness import BIN, REFITCTL, REFITD, SRC  # noqa: E402,F401


def run(binary: Path, *args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **(env or {})))
