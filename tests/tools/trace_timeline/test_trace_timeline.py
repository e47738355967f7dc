"""tools/trace_timeline.py on traces written by hand: each step's time from the refit's begin, the
pipeline's shape with the GPU converter's timing points, --range over a file of two runs, and a
commit that waits for joined trainer ranks timed from the last detach."""
import json
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(os.environ.get("REFIT_SOURCE_DIR", Path(__file__).resolve().parents[3]))
TOOL = SRC / "tools/trace_timeline.py"


def refit(t0, scale=1.0):
    """One refit of two buckets ("pid us label [value]" lines), its steps at t0 + scale * offset."""
    steps = [(1, 0, "trainer.begin_sent"), (2, 300, "daemon.begin_received"),
             (2, 1000, "daemon.bucket_received", 0), (2, 1040, "daemon.bucket_first_launch"),
             (2, 1200, "daemon.bucket_issued", 0), (2, 1300, "daemon.bucket_received", 1),
             (2, 1500, "daemon.bucket_issued", 1),
             # bucket 0: the GPU worked 900 µs up to its end at 2000, so it started at 1100: 60 µs
             # after its first work was enqueued; the wait before it counts from the refit before.
             (2, 2000, "daemon.gpu_bucket_us", 900), (2, 2000, "daemon.gpu_wait_us", 5000000),
             (2, 2000, "daemon.bucket_converted", 0),
             (2, 2600, "daemon.gpu_bucket_us", 600), (2, 2600, "daemon.gpu_wait_us", 40),
             (2, 2600, "daemon.bucket_converted", 1), (1, 3000, "trainer.commit_answered")]
    lines = []
    for pid, off, label, *value in steps:
        lines.append(" ".join([str(pid), str(int(t0 + scale * off)), label] + [str(v) for v in value]))
    return lines


def run(path, *args):
    out = subprocess.run([sys.executable, str(TOOL), str(path), "--json", *args], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)


def test_steps_and_the_pipeline_with_gpu_timing(tmp_path):
    trace = tmp_path / "refit.trace"
    trace.write_text("\n".join(l for k in range(4) for l in refit(1_000_000 + k * 100_000)) + "\n")
    t = run(trace)  # all but the first two
    assert t["refits"] == 2
    assert t["steps_ms"]["daemon.begin_received"] == 0.3
    assert t["steps_ms"]["daemon.bucket_issued.first"] == 1.2 and t["steps_ms"]["daemon.bucket_issued.last"] == 1.5
    p = t["pipeline_ms"]
    assert p["before_first_kernel"] == 1.2
    assert abs(p["conversion_span"] - 1.4) < 1e-9 and abs(p["after_last_kernel"] - 0.4) < 1e-9
    assert abs(p["bucket_issue"] - 0.2) < 1e-9  # 0.2 and 0.2
    assert abs(p["gpu_idle"] - 0.04) < 1e-9  # the first bucket's wait is left out
    assert abs(p["first_work_delay"] - 0.06) < 1e-9


def test_range_reads_one_run_of_a_file_of_two(tmp_path):
    # Two runs in one file: three refits at the scale 1, then three twice as slow.
    trace = tmp_path / "two.trace"
    lines = [l for k in range(3) for l in refit(1_000_000 + k * 100_000)]
    lines += [l for k in range(3) for l in refit(2_000_000 + k * 100_000, scale=2.0)]
    trace.write_text("\n".join(lines) + "\n")
    first, second = run(trace, "--range", "1:3"), run(trace, "--range", "4:6")
    assert first["refits"] == second["refits"] == 2
    assert first["steps_ms"]["trainer.commit_answered"] == 3.0
    assert second["steps_ms"]["trainer.commit_answered"] == 6.0
    err = subprocess.run([sys.executable, str(TOOL), str(trace), "--range", "7:9"], capture_output=True, text=True)
    assert err.returncode == 1 and "no refit in range 7:9 (6 refits)" in err.stderr


def test_a_commit_waiting_for_joined_ranks_is_timed_from_the_last_detach(tmp_path):
    # Two joined ranks detach at 2.0 and 2.5 ms; the commit came at 1.5 and started at 2.6: 0.1 ms
    # after the last detach. A commit that came after every detach is not counted.
    def session(t0, commit_at):
        steps = [(1, 0, "trainer.begin_sent"), (2, 1500 if commit_at is None else commit_at, "daemon.commit_received"),
                 (2, 2000, "daemon.detach_received"), (2, 2500, "daemon.detach_received"),
                 (2, 2600 if commit_at is None else commit_at + 10, "daemon.commit_started"),
                 (1, 4000, "trainer.commit_answered")]
        return [f"{pid} {t0 + off} {label}" for pid, off, label in sorted(steps, key=lambda x: x[1])]

    trace = tmp_path / "ranks.trace"
    trace.write_text("\n".join(session(1_000_000, None) + session(1_100_000, None)) + "\n")
    t = run(trace, "--skip", "0")
    assert abs(t["pipeline_ms"]["commit_start_after_last_detach"] - 0.1) < 1e-9
    assert t["steps_ms"]["daemon.detach_received.count"] == 2
    late = tmp_path / "late.trace"
    late.write_text("\n".join(session(1_000_000, 3000)) + "\n")
    assert "commit_start_after_last_detach" not in run(late, "--skip", "0")["pipeline_ms"]


def test_every_trace_label_in_the_sources_is_documented():
    """Each TracePoint label of the trainer, refitd and the engine agent has a row in
    docs/operations.md's table of steps, so a trace can be read from the docs alone."""
    import re

    labels = set()
    for path in (SRC / "src").rglob("*.cc"):
        labels.update(re.findall(r'TracePoint\("([a-z_]+\.[a-z_]+)"', path.read_text()))
    assert len(labels) > 30, sorted(labels)
    docs = (SRC / "docs/operations.md").read_text()
    missing = sorted(l for l in labels if f"`{l}`" not in docs)
    assert missing == [], f"trace labels without a row in docs/operations.md: {missing}"
