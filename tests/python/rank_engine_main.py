"""One rank of an engine of several ranks (test_engine_ranks.py starts one process per rank):
registers its parameters (zeros, in its own POSIX shm object) with the node's one refitd giving
its tensor-parallel rank, and, with --barrier, serves "forward steps" in lockstep with the other
ranks, logging the version each step used.

Lockstep (what a TP/EP engine's collectives make of its ranks): the ranks run rounds over a
shared-memory barrier (--barrier, a file in /dev/shm: one arrival counter per rank, then two flag
bytes per rank). In round k each rank publishes whether it has a pause pending or is paused, then
waits for every rank to arrive at k. A round in which any rank's flag is set runs no step on any
rank (it is the step boundary where a pause takes effect; the pausing rank acknowledges its pause
there); otherwise every rank runs the round's step with the weights it holds and logs
"<step> <version>". Steps are numbered by the rounds that ran one, so step n is the same forward
step on every rank, and a step that mixed versions shows as two versions for one n.

Sleep and wake on command: SIGUSR1 sleeps (the agent's sleep, then the rank
keeps a private copy of its weights and releases its shm object, or its CUDA allocation with
--device, as an engine that offloads its weights does), SIGUSR2 wakes (the weights copied into a
new shm object, <shm>-w<n>, or a new CUDA allocation, and the agent's wake with its parameters).

Events (JSON lines on stdout): registered, paused, resumed {version}, asleep, awake {shm, committed}.
"""
import argparse
import json
import mmap
import os
import queue
import signal
import struct
import sys
import threading
import time

import torch

import refit

TORCH = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "I32": torch.int32,
         "U8": torch.uint8, "I8": torch.int8}


def emit(**kw):
    print(json.dumps(kw), flush=True)


class Gate:
    def __init__(self, serving: bool):
        self.serving = serving
        self.requested = False
        self.acknowledged = threading.Event()
        self.version = 0

    def pause(self):
        if self.serving:
            self.acknowledged.clear()
            self.requested = True
            self.acknowledged.wait()  # the loop is at a round no rank steps in
        emit(event="paused")

    def resume(self, version):
        self.version = version
        self.requested = False
        emit(event="resumed", version=version)


def serve(gate: Gate, rank: int, size: int, barrier: str, steps_log: str, stop: threading.Event):
    fd = os.open(barrier, os.O_RDWR)
    mm = mmap.mmap(fd, 8 * size + 2 * size)
    flags = 8 * size
    out = open(steps_log, "w", buffering=1)
    k, step = 0, 0
    while not stop.is_set():
        k += 1
        flag = 1 if gate.requested else 0
        mm[flags + 2 * rank + k % 2] = flag
        struct.pack_into("<Q", mm, 8 * rank, k)
        while not stop.is_set() and any(struct.unpack_from("<Q", mm, 8 * j)[0] < k for j in range(size)):
            time.sleep(0.0001)
        if stop.is_set():
            break
        if any(mm[flags + 2 * j + k % 2] for j in range(size)):
            if flag:
                gate.acknowledged.set()
            continue
        out.write(f"{step} {gate.version}\n")  # a forward step with the weights this rank holds
        step += 1


def write_layout(region, path):
    with open(path, "w") as f:
        json.dump({p.name: [p.offset, p.nbytes] for p in region.params}, f)


def sleep_and_wake(agent, held, commands, args, dtypes):
    """Runs the sleep and wake commands the signal handlers queue (None: stop). `held["region"]`
    is the rank's shm object while it is awake."""
    wakes = 0
    saved = None
    while (command := commands.get()) is not None:
        if command == "sleep" and held["region"] is not None:
            agent.sleep()  # refitd dropped its mapping of this rank's weights
            saved = {n: t.clone() for n, t in held["region"].tensors.items()}
            if args.device < 0:
                held["region"].close()
            held["region"] = None  # a CUDA allocation goes back to the caching allocator
            emit(event="asleep")
        elif command == "wake" and held["region"] is None:
            wakes += 1
            if args.device >= 0:
                shm = ""
                region = refit.CudaParams.from_tensors(saved, f"cuda:{args.device}", dtypes)
            else:
                shm = f"{args.shm}-w{wakes}"
                region = refit.SharedParams.from_tensors(saved, shm, dtypes)
                write_layout(region, args.layout)
            held["region"] = region
            committed = agent.wake(region.params)  # a refit staged meanwhile commits first
            emit(event="awake", shm=shm, committed=committed)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--address", required=True)
    ap.add_argument("--model", default="")
    ap.add_argument("--tp-rank", type=int, required=True)
    ap.add_argument("--tp-size", type=int, required=True)
    ap.add_argument("--ep-size", type=int, default=0)
    ap.add_argument("--params", required=True, help="JSON [[name, dtype, shape], ...]")
    ap.add_argument("--shm", required=True)
    ap.add_argument("--layout", required=True, help="written: {name: [offset, nbytes]}")
    ap.add_argument("--barrier", default="")
    ap.add_argument("--steps", default="")
    ap.add_argument("--device", type=int, default=-1, help="CUDA device: parameters by CUDA IPC")
    ap.add_argument("--snapshots", default="", help="after each resume: <dir>/v<version>.pt of every parameter")
    args = ap.parse_args()

    tensors, dtypes = {}, {}
    for name, dtype, shape in json.load(open(args.params)):
        if dtype not in TORCH:
            dtypes[name] = dtype  # one-byte formats (F8_E4M3, F8_E8M0) held as uint8
        tensors[name] = torch.zeros(shape, dtype=TORCH.get(dtype, torch.uint8))
    if args.device >= 0:
        region = refit.CudaParams.from_tensors(tensors, f"cuda:{args.device}", dtypes)
    else:
        region = refit.SharedParams.from_tensors(tensors, args.shm, dtypes)
        write_layout(region, args.layout)
    gate = Gate(bool(args.barrier))
    held = {"region": region}  # the rank's weights while it is awake (a wake brings new ones)
    if args.snapshots:
        resume = gate.resume

        def snapshot_then_resume(version):
            path = os.path.join(args.snapshots, f"v{version}.pt")
            tensors = held["region"].tensors
            torch.save({n: t.cpu().contiguous().view(torch.uint8).reshape(-1) for n, t in tensors.items()},
                       path + ".tmp")
            os.replace(path + ".tmp", path)
            resume(version)

        gate.resume = snapshot_then_resume
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    ep = args.ep_size > 1
    commands = queue.SimpleQueue()
    signal.signal(signal.SIGUSR1, lambda *_: commands.put("sleep"))
    signal.signal(signal.SIGUSR2, lambda *_: commands.put("wake"))
    agent = refit.EngineAgent(args.address, region.params, on_pause=gate.pause, on_resume=gate.resume,
                              tp_rank=args.tp_rank, tp_size=args.tp_size, ep_rank=args.tp_rank if ep else 0,
                              ep_size=args.ep_size, device=args.device, model=args.model)
    del region  # held["region"] from here on
    sleeper = threading.Thread(target=sleep_and_wake, args=(agent, held, commands, args, dtypes),
                               daemon=True)
    sleeper.start()
    emit(event="registered")
    if args.barrier:
        serve(gate, args.tp_rank, args.tp_size, args.barrier, args.steps, stop)
    else:
        stop.wait()
    commands.put(None)
    sleeper.join()
    agent.stop()
    emit(event="exit")


if __name__ == "__main__":
    sys.exit(main())
