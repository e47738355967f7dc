"""Real refitd, example engine and example trainer processes for the pytest suites (tests/python,
tests/integration/*, tests/deploy): where the built binaries are, starting a process with its
output in a log and waiting until it says it is ready, the example engine's bytes read straight
from its POSIX shm, the trainer's JSON report lines, and stopping. Each suite's conftest.py puts
this directory on sys.path, builds its node classes from these pieces and re-exports the names its
tests import. Standard library only (tests/python runs it under the torch venv's interpreter).

REFIT_SOURCE_DIR and REFIT_BINARY_DIR (set by ctest, tests/**/CMakeLists.txt) say where the source
and build trees are; without them, this checkout and its build/."""
import hashlib
import json
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

SRC = Path(os.environ.get("REFIT_SOURCE_DIR", Path(__file__).resolve().parents[2]))
BIN = Path(os.environ.get("REFIT_BINARY_DIR", SRC / "build"))
# REFIT_REFITD runs the tests against another refitd, e.g. one installed from the package.
REFITD = Path(os.environ.get("REFIT_REFITD", BIN / "src/server/refitd"))
ENGINE = BIN / "tools/examples/example_engine"
TRAINER = BIN / "tools/examples/example_trainer"
REFITCTL = BIN / "tools/refitctl"


def wait_for(pred, timeout=30.0, what="condition"):
    """Polls `pred` every 20 ms until it holds; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def nccl_placement(gpus: int, monkeypatch) -> dict:
    """Where an NCCL test puts refitd and its trainers on a machine with `gpus` GPUs (at least one):
    {"device": refitd's GPU, "trainer_gpu": the trainers', "env": refitd's extra environment or
    None}. With two or more, GPU 1 and GPU 0. With one, both on GPU 0, each process with its own
    NCCL_HOSTID over loopback sockets (NCCL_SOCKET_IFNAME=lo), so that NCCL takes them for separate
    hosts and uses its socket transport instead of refusing several ranks on one device: such runs
    check correctness only, their times are socket times. The trainers inherit this process's
    environment, which `monkeypatch` (pytest's) sets for the test; refitd gets its own host id."""
    if gpus >= 2:
        return {"device": 1, "trainer_gpu": 0, "env": None}
    monkeypatch.setenv("NCCL_HOSTID", f"refit-trainer-{os.getpid()}")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "lo")
    return {"device": 0, "trainer_gpu": 0, "env": {"NCCL_HOSTID": f"refit-daemon-{os.getpid()}"}}


def json_lines(text: str) -> list:
    """The JSON objects among `text`'s lines (the example programs' reports)."""
    return [json.loads(l) for l in text.splitlines() if l.startswith("{")]


# The engine's size the tests run a spec whose tensor_parallel.size is `engine` at, unless they say.
ENGINE_TP_SIZE = 2


def spec_tp_size(spec, engine: int = ENGINE_TP_SIZE) -> int:
    """A spec's tensor_parallel.size (1 without one); `engine` when the spec leaves it to the
    engine's registrations (tensor_parallel: {size: engine})."""
    m = re.search(r"^tensor_parallel:\s*\{size:\s*(\d+|engine)\s*\}", Path(spec).read_text(), re.M)
    if not m:
        return 1
    return engine if m.group(1) == "engine" else int(m.group(1))


def new_shm(kind: str) -> str:
    """A fresh POSIX shm name for one engine."""
    return f"/refit-{kind}-{uuid.uuid4().hex[:12]}"


def shm_digest(*shms: str) -> str:
    """sha256 of the engines' bytes, read from their shared memory directly (not through refitd)."""
    h = hashlib.sha256()
    for shm in shms:
        h.update(Path("/dev/shm" + shm).read_bytes())
    return h.hexdigest()


def unlink_shm(*shms: str):
    for shm in shms:
        Path("/dev/shm" + shm).unlink(missing_ok=True)


# refitd skips Abseil's lock-order (deadlock) detector unless this is set (src/server/main.cc); the
# tests' daemons keep it, so that a lock taken out of order aborts a test run.
os.environ.setdefault("REFIT_LOCK_ORDER_CHECK", "1")


def start(args, log: Path, ready, what: str, env=None, timeout=30.0, logs=()) -> subprocess.Popen:
    """Starts `args` with stdout and stderr in `log` and waits until `ready()` holds; fails the test,
    showing `log` (then `logs`), when the process exits first."""
    proc = subprocess.Popen([str(a) for a in args], stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
    wait_for(lambda: ready() or proc.poll() is not None, timeout=timeout, what=what)
    assert proc.poll() is None, "".join(p.read_text() for p in (log, *logs))
    return proc


def start_refitd(config: Path, log: Path, *args, env=None, ready=None, timeout=30.0) -> subprocess.Popen:
    """refitd --config `config` `args`; ready once it logs event=listening and `ready()` (if given)
    holds. The log line comes first because a unix socket's file exists from its bind on, a moment
    before the listen: a connect in between is refused."""
    listening = lambda: "event=listening" in log.read_text()  # noqa: E731
    both = listening if ready is None else (lambda: listening() and ready())
    return start([REFITD, "--config", config, *args], log, both, "refitd listening", env=env, timeout=timeout)


def start_engine(address: str, log: Path, *args, env=None, marker="registered", timeout=30.0,
                 logs=()) -> subprocess.Popen:
    """The example engine on `address` with `args`; ready once its log holds `marker`."""
    return start([ENGINE, "--address", address, *args], log, lambda: marker in log.read_text(),
                 "engine registration", env=env, timeout=timeout, logs=logs)


def start_rank_engines(tmp: Path, address: str, spec, checkpoint: Path, name="engine", shm_kind="engine", extra=(),
                       tp_size=None):
    """The example engine holding `checkpoint` in `spec`'s engine layout, one process per engine rank
    of the spec's tensor_parallel.size (`tp_size` when given, or spec_tp_size's for a spec that
    leaves it to the engine), each registering its rank and that size; POSIX shm each, or `extra`
    (e.g. ["--gpu", 0]: CUDA memory) added to every rank's arguments. Returns (processes, shm
    names, logs), rank order; none left running when one fails to start."""
    procs, shms, logs = [], [], []
    ranks = tp_size or spec_tp_size(spec)
    try:
        for r in range(ranks):
            shm = new_shm(shm_kind)
            log = tmp / (f"{name}{r}.log" if ranks > 1 else f"{name}.log")
            args = ["--shm", shm, "--spec", spec, "--checkpoint", checkpoint, *extra]
            if ranks > 1:
                args += ["--tp-rank", r, "--tp-size", ranks]
            shms.append(shm)
            procs.append(start_engine(address, log, *args))
            logs.append(log)
    except BaseException:
        for p in procs:
            kill(p)
        unlink_shm(*shms)
        raise
    return procs, shms, logs


def run_trainer(address: str, *args, timeout=60, env=None, **kwargs):
    """Runs the example trainer to its end: (CompletedProcess, its JSON report lines)."""
    p = subprocess.run([str(TRAINER), "--address", address, *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, env=env, **kwargs)
    return p, json_lines(p.stdout)


def stop(proc, timeout=20, kill_on_timeout=False):
    """SIGTERM and wait; with `kill_on_timeout`, SIGKILL when it outlives `timeout`."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        if not kill_on_timeout:
            raise
        kill(proc)


def kill(proc):
    """SIGKILL and reap, for a fixture's teardown."""
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
