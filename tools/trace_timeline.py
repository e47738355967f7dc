#!/usr/bin/env python3
"""Where a refit's time goes, from a REFIT_TRACE_FILE written by the trainer, refitd and the
engine agent together (src/common/trace.h, docs/operations.md "Tracing a refit").

  REFIT_TRACE_FILE=/tmp/refit.trace  (in the environment of all three processes)
  python3 tools/trace_timeline.py /tmp/refit.trace [--refit N] [--skip 2] [--json]

A refit runs from one `trainer.begin_sent` to the next. Without --refit, prints the median over
the refits after the first --skip of each step's time from the begin (per-bucket steps: their
first and last), in order, then the pipeline's shape (median over the same refits):

  before_first_kernel  the begin to the first bucket's conversions issued
  conversion_span      the first bucket issued to the last bucket converted (against the kernels'
                       own time: what the GPU waited for between buckets)
  after_last_kernel    the last bucket converted to the trainer's commit answer
  bucket_issue         per bucket, received to issued (the host's launches; median over buckets)
  gpu_idle             traced GPU converter only: the main stream's idle time between buckets
                       (daemon.gpu_wait_us after the first bucket; 0: the host kept ahead)
  first_work_delay     traced GPU converter only: the refit's first work enqueued
                       (daemon.bucket_first_launch) to the GPU starting it (its bucket's end less
                       daemon.gpu_bucket_us)
  commit_start_after_last_detach
                       joined trainer ranks, a commit sent before the last one detached: that
                       detach read to the commit started (refitd's wait for its joined ranks)

--range A:B takes refits A..B-1 (0 = the first) instead of all but the first --skip: a file that
holds several runs (colocated_refit_bench.py with --runs of two labels) is read one run at a time.

With --refit N, that refit's steps one by one with the time since the step before. --json prints
the medians as JSON ("steps_ms", "pipeline_ms").
"""
import argparse
import json
import signal
import statistics
import sys

BUCKET_STEPS = ("trainer.bucket_ready", "daemon.announce_received", "trainer.bucket_announced", "trainer.bucket_sent",
                "daemon.run_arrived", "daemon.bucket_received", "daemon.bucket_issued", "daemon.bucket_converted")
# Steps a refit passes more than once, each shown as .first/.last/.count: the per-bucket ones and
# the joined trainer ranks' detaches (the last one starts a commit that waits for them).
REPEATED_STEPS = BUCKET_STEPS + ("daemon.detach_received",)


def read(path):
    events = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) < 3:
                continue
            pid, us, label = int(parts[0]), int(parts[1]), parts[2]
            value = int(parts[3]) if len(parts) > 3 else None
            events.append((us, pid, label, value))
    events.sort(key=lambda e: e[0])
    return events


def split_refits(events):
    refits, current = [], None
    for e in events:
        if e[2] == "trainer.begin_sent":
            current = []
            refits.append(current)
        if current is not None:
            current.append(e)
    return refits


def steps(refit):
    """{step: ms since the begin}: the first time of each step; repeated steps as .first/.last."""
    t0 = refit[0][0]
    out = {}
    for us, _, label, _ in refit:
        ms = (us - t0) / 1000.0
        if label in REPEATED_STEPS:
            out.setdefault(label + ".first", ms)
            out[label + ".last"] = ms
            out[label + ".count"] = out.get(label + ".count", 0) + 1
        else:
            out.setdefault(label, ms)
    return out


def pipeline(refit):
    """The pipeline's shape of one refit (ms), from its per-bucket steps; {} without buckets."""
    s = steps(refit)
    out = {}
    # Joined trainer ranks: a commit that came before the last detach starts at it.
    detached = s.get("daemon.detach_received.last")
    if detached is not None and "daemon.commit_started" in s and s.get("daemon.commit_received", detached) < detached:
        out["commit_start_after_last_detach"] = s["daemon.commit_started"] - detached
    if "daemon.bucket_issued.first" not in s or "daemon.bucket_converted.last" not in s:
        return out
    out.update({"before_first_kernel": s["daemon.bucket_issued.first"],
                "conversion_span": s["daemon.bucket_converted.last"] - s["daemon.bucket_issued.first"]})
    if "trainer.commit_answered" in s:
        out["after_last_kernel"] = s["trainer.commit_answered"] - s["daemon.bucket_converted.last"]
    received = {v: us for us, _, label, v in refit if label == "daemon.bucket_received" and v is not None}
    issue = [(us - received[v]) / 1000.0 for us, _, label, v in refit
             if label == "daemon.bucket_issued" and v in received]
    if issue:
        out["bucket_issue"] = statistics.median(issue)
    waits = [v for _, _, label, v in refit if label == "daemon.gpu_wait_us" and v is not None]
    if len(waits) > 1:
        out["gpu_idle"] = sum(waits[1:]) / 1000.0
    launch = next((us for us, _, label, _ in refit if label == "daemon.bucket_first_launch"), None)
    busy = next((v for _, _, label, v in refit if label == "daemon.gpu_bucket_us" and v is not None), None)
    converted = next((us for us, _, label, _ in refit if label == "daemon.bucket_converted"), None)
    if launch is not None and busy is not None and converted is not None:
        out["first_work_delay"] = (converted - busy - launch) / 1000.0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--refit", type=int, help="print this refit's steps (0 = the first)")
    ap.add_argument("--skip", type=int, default=2, help="refits left out of the medians (warm-up)")
    ap.add_argument("--range", help="A:B: refits A..B-1 (0 = the first) instead of all but the first --skip")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    refits = split_refits(read(args.trace))
    if not refits:
        print(f"{args.trace}: no refit (no trainer.begin_sent)", file=sys.stderr)
        return 1
    if args.refit is not None:
        refit = refits[args.refit]
        t0 = prev = refit[0][0]
        for us, pid, label, value in refit:
            extra = "" if value is None else f" {value}"
            print(f"{(us - t0) / 1000:9.3f} {(us - prev) / 1000:8.3f}  {pid:>7}  {label}{extra}")
            prev = us
        return 0
    if args.range:
        a, _, b = args.range.partition(":")
        steady = refits[int(a) if a else 0:int(b) if b else None]
        if not steady:
            print(f"{args.trace}: no refit in range {args.range} ({len(refits)} refits)", file=sys.stderr)
            return 1
    else:
        steady = refits[args.skip:] if len(refits) > args.skip else refits
    per = [steps(r) for r in steady]
    names = sorted({k for p in per for k in p},
                   key=lambda k: (float("inf") if k.endswith(".count") else statistics.median(p[k] for p in per if k in p), k))
    medians = {k: statistics.median(p[k] for p in per if k in p) for k in names}
    shapes = [pipeline(r) for r in steady]
    shape = {k: statistics.median(p[k] for p in shapes if k in p)
             for k in ("before_first_kernel", "conversion_span", "after_last_kernel", "bucket_issue", "gpu_idle",
                       "first_work_delay", "commit_start_after_last_detach")
             if any(k in p for p in shapes)}
    if args.json:
        print(json.dumps({"refits": len(per), "steps_ms": medians, "pipeline_ms": shape}, indent=1))
        return 0
    print(f"{len(per)} refits (median ms from trainer.begin_sent):")
    for k in names:
        print(f"  {medians[k]:9.3f}  {k}")
    if shape:
        print("pipeline (median ms):")
        for k, v in shape.items():
            print(f"  {v:9.3f}  {k}")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # piped into head: end quietly
    raise SystemExit(main())
