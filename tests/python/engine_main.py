"""An engine process for the Python tests: builds a model, registers it with refitd through
refit.ModuleEngine, and serves it from a thread (each request under engine.serving()). After
registration and after each refit it saves its outputs and parameters to OUT/v{version}.pt and
prints one JSON line: {"event":"registered"|"resumed"|"exit", ...}. `mixed` counts requests that
saw outputs differing from the first request of the same version: it must be 0.

  engine_main.py --address unix:PATH --model toy|tiny-llama --out DIR [--seed S] [--dtype f32|bf16]
                 [--shm /NAME]
"""
import argparse
import json
import signal
import sys
import threading
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import models  # noqa: E402
import refit  # noqa: E402
import refit.hf  # noqa: E402


def emit(**kw):
    print(json.dumps(kw), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--address", required=True)
    ap.add_argument("--model", default=models.TOY)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="f32")
    ap.add_argument("--shm")
    a = ap.parse_args()
    torch.set_num_threads(1)  # bitwise-reproducible outputs
    out = Path(a.out)
    model = models.build(a.model, a.seed, torch.bfloat16 if a.dtype == "bf16" else torch.float32)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    engine = (refit.hf.attach if a.model == models.TINY_LLAMA else refit.ModuleEngine)(
        a.address, model, shm_name=a.shm)

    def snapshot():
        with engine.serving():
            version = engine.version
            y = models.outputs(a.model, model)
            params = {n: p.detach().clone() for n, p in model.named_parameters()}
        torch.save({"version": version, "out": y, "params": params}, out / f"v{version}.pt")
        return version

    snapshot()
    emit(event="registered", shm=engine.shared.shm_name, params=len(engine.shared.params),
         bytes=engine.shared.nbytes)

    counts = {"requests": 0, "mixed": 0}
    first = {}

    def serve():
        while not stop.is_set():
            with engine.serving(timeout=30):
                v = engine.version
                with torch.no_grad():
                    y = models.outputs(a.model, model)
            ref = first.setdefault(v, y)
            counts["requests"] += 1
            if not torch.equal(ref, y):
                counts["mixed"] += 1

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    seen = engine.version
    while not stop.is_set():
        try:
            engine.wait_for_version(seen + 1, timeout=0.2)
        except TimeoutError:
            continue
        seen = snapshot()
        emit(event="resumed", version=seen, tag=engine.tag)
    server.join(timeout=30)
    dirty = engine.dirty
    engine.close()
    emit(event="exit", versions=sorted(first), dirty=dirty, **counts)
    return 0 if counts["mixed"] == 0 else 3


if __name__ == "__main__":
    sys.exit(main())
