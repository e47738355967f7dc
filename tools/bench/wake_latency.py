#!/usr/bin/env python3
"""How long a sleeping thread takes to wake on this machine: the round trip of one byte between two
processes over a Unix socket pair, the peer blocked in recv (its CPU idle between messages) or
spinning on a non-blocking recv, after gaps of 0, 2 and 50 ms between messages. A refit crosses
refitd, the engine and the trainer many times; each hop to a thread that slept for milliseconds
costs what the blocked rows show over the spinning ones (docs/operations.md "Busy polling").

  python3 tools/bench/wake_latency.py [--count 150]

Prints one line per row: median, 10th and 90th percentile round trip in microseconds.
"""
import argparse
import os
import socket
import statistics
import time


def row(spin, gap_s, count):
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        a.close()
        if spin:
            b.setblocking(False)
        while True:
            try:
                d = b.recv(1)
            except BlockingIOError:
                continue
            if not d or d == b"q":
                os._exit(0)
            b.send(d)
    b.close()
    rtts = []
    for _ in range(count):
        time.sleep(gap_s)
        t = time.perf_counter_ns()
        a.send(b"x")
        a.recv(1)
        rtts.append((time.perf_counter_ns() - t) / 1000)
    a.send(b"q")
    os.waitpid(pid, 0)
    rtts.sort()
    return (f"peer={'spinning' if spin else 'blocked'} gap_ms={gap_s * 1000:.0f} rtt_us median={statistics.median(rtts):.1f} "
            f"p10={rtts[len(rtts) // 10]:.1f} p90={rtts[len(rtts) * 9 // 10]:.1f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=150, help="round trips per row")
    args = ap.parse_args()
    for spin in (False, True):
        for gap in (0.0, 0.002, 0.05):
            print(row(spin, gap, args.count), flush=True)


if __name__ == "__main__":
    main()
