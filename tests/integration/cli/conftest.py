"""Paths of the built binaries and a helper that runs one."""
import os
import subprocess
from pathlib import Path

BIN = Path(os.environ.get("REFIT_BINARY_DIR", "build"))
SRC = Path(os.environ.get("REFIT_SOURCE_DIR", Path(__file__).resolve().parents[3]))
REFITD = BIN / "src/server/refitd"
REFITCTL = BIN / "tools/refitctl"


def run(binary: Path, *args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **(env or {})))
