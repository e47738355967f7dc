"""The CUDA IPC data plane end to end on one GPU, as colocated RL runs it: the example trainer,
refitd (bucket ring, GPU converter, staging) and the engine all on GPU 0. The trainer's two
device bucket buffers are exported once each and mapped once by refitd; three refits are compared
byte for byte with the offline conversion (also pushed in place: RefitSession::PushInPlace sends
the trainer's weights from its own allocation, which refitd's converter reads there); a trainer
killed mid-refit (packing or pushing in place), and one that stalls, end in an abort within the
session deadline with the engine's bytes unchanged, and the next refit lands.
Skips, saying why, without a CUDA device or without a CUDA build."""
import json
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import REFITCTL, SRC, TRAINER, node_fixture, wait_for


@pytest.fixture
def node_factory(tmp_path, require_gpu):
    yield from node_fixture(tmp_path, transport="cuda_ipc", device=0, trainer_gpu=0)


def test_three_cuda_ipc_refits_on_one_gpu_match_offline_conversion(node_factory):
    node = node_factory()
    p, lines = node.trainer("--refits", "3")
    assert p.returncode == 0, p.stdout + p.stderr + node.log.read_text()
    assert [l["outcome"] for l in lines] == ["committed"] * 3
    assert all(l["engine_matches_expected"] for l in lines), lines
    assert "data=cuda_ipc:@refitd-cuda-ipc-" in node.log.read_text()
    # Independently of the trainer's own check: refitctl reads the engine back against the
    # offline conversion of the last refit's weights.
    node.engine.send_signal(signal.SIGTERM)
    node.engine.wait(timeout=30)
    assert json.loads(node.engine_log.read_text().splitlines()[-1])["mixed"] == 0
    print(json.dumps(lines))


def test_refits_pushed_in_place_match_offline_conversion(node_factory):
    node = node_factory()
    p, lines = node.trainer("--refits", "3", "--in-place")
    assert p.returncode == 0, p.stdout + p.stderr + node.log.read_text()[-3000:]
    assert [l["outcome"] for l in lines] == ["committed"] * 3
    assert all(l["engine_matches_expected"] for l in lines), lines
    # And after a packed refit, in place again: the same connection serves both.
    p, lines = node.trainer("--refits", "1", "--seed", "4")
    assert p.returncode == 0 and lines[0]["engine_matches_expected"], p.stdout + p.stderr
    p, lines = node.trainer("--refits", "1", "--seed", "5", "--in-place")
    assert p.returncode == 0 and lines[0]["engine_matches_expected"], p.stdout + p.stderr
    assert node.engine_matches(5)["ok"]


def test_shipped_llama3_spec_fused_engine_layout_matches_offline_conversion(node_factory, tmp_path):
    # deploy/models/llama3_fp8.yaml as one engine on one GPU: the engine holds fused qkv_proj and
    # gate_up_proj, which the commit writes piece by piece from staging; packed and in place.
    text = (SRC / "deploy/models/llama3_fp8.yaml").read_text()
    spec = tmp_path / "llama3_tp1.yaml"
    spec.write_text(re.sub(r"^tensor_parallel:.*$", "tensor_parallel: {size: 1}", text, flags=re.M))
    node = node_factory(spec=str(spec))
    for flags in ([], ["--in-place"]):
        p, lines = node.trainer("--refits", "2", *flags)
        assert p.returncode == 0, p.stdout + p.stderr + node.log.read_text()[-3000:]
        assert [l["outcome"] for l in lines] == ["committed"] * 2
        assert all(l["engine_matches_expected"] for l in lines), lines


@pytest.mark.parametrize("engine_memory", ["ipc", "vmm"])
def test_staging_direct_converts_into_the_engine_packed_and_in_place(node_factory, tmp_path, engine_memory):
    # staging: direct with the shipped llama3 spec (one engine on one GPU): the engine pauses at
    # begin and every tensor is converted into its fused qkv_proj / gate_up_proj in place; the
    # engine's bytes equal the offline conversion, packed and pushed in place. A trainer killed
    # while pushing in place: the session aborts, the engine is left paused and dirty (refitd wrote
    # into it) or resumed at what it held (nothing of the session reached refitd; the trainer's last
    # runs are sent in the background, so which one is a race), and the next refit lands. The
    # engine's weights in a cudaMalloc registered by IPC handle, or in CUDA virtual memory
    # registered in place (example_engine --vmm).
    text = (SRC / "deploy/models/llama3_fp8.yaml").read_text()
    spec = tmp_path / "llama3_tp1.yaml"
    spec.write_text(re.sub(r"^tensor_parallel:.*$", "tensor_parallel: {size: 1}", text, flags=re.M))
    node = node_factory(spec=str(spec), staging="direct", deadline_ms=20000,
                        engine_args=["--vmm"] if engine_memory == "vmm" else [])
    for flags in ([], ["--in-place"]):
        p, lines = node.trainer("--refits", "2", *flags)
        assert p.returncode == 0, p.stdout + p.stderr + node.log.read_text()[-3000:]
        assert [l["outcome"] for l in lines] == ["committed"] * 2
        assert all(l["engine_matches_expected"] for l in lines), lines
        assert all(l["bytes_in_place"] == l["bytes_out"] > 0 for l in lines), lines
    p, _ = node.trainer("--refits", "1", "--seed", "6", "--fault", "die-mid-bucket", "--in-place")
    assert p.returncode == 9, p.stderr
    wait_for(lambda: "outcome=aborted" in node.log.read_text(), timeout=20, what="abort after trainer death")
    aborted = next(l for l in node.log.read_text().splitlines() if "outcome=aborted" in l)
    status = json.loads(subprocess.run([str(REFITCTL), "status", "--address", node.address, "--json"],
                                       capture_output=True, text=True, check=True).stdout)
    if "stays paused and dirty" in aborted:
        assert status["engine_dirty"] is True, status
    else:
        assert "nothing was written in place: the engine was resumed" in aborted, aborted
        assert status["engine_dirty"] is False and status["version"] == 4, status
    p, lines = node.trainer("--refits", "1", "--seed", "7", "--in-place")
    assert p.returncode == 0 and lines[0]["outcome"] == "committed" and lines[0]["engine_matches_expected"], \
        p.stdout + p.stderr + node.log.read_text()[-3000:]


@pytest.mark.parametrize("staging", ["device", "direct"])
def test_trainer_weights_in_virtual_memory_go_as_descriptors(node_factory, tmp_path, staging):
    # The trainer's weights in CUDA virtual memory (example_trainer --vmm, as PyTorch's expandable
    # segments allocate them), pushed in place: the data plane sends POSIX descriptors of the
    # allocation's pieces, which refitd imports and converts from, staged or straight into a VMM engine;
    # the engine's bytes equal the offline conversion. A trainer killed mid-push: the session
    # aborts (refitd drops the imported memory) and the next refit lands.
    text = (SRC / "deploy/models/llama3_fp8.yaml").read_text()
    spec = tmp_path / "llama3_tp1.yaml"
    spec.write_text(re.sub(r"^tensor_parallel:.*$", "tensor_parallel: {size: 1}", text, flags=re.M))
    node = node_factory(spec=str(spec), staging=staging, deadline_ms=20000, engine_args=["--vmm"])
    # One allocation, then pieces of 2 MiB (as expandable segments map memory): tensors and runs
    # cross pieces.
    for pieces in ([], ["--vmm-piece-mib", "2"]):
        p, lines = node.trainer("--refits", "2", "--in-place", "--vmm", *pieces)
        assert p.returncode == 0, p.stdout + p.stderr + node.log.read_text()[-3000:]
        assert [l["outcome"] for l in lines] == ["committed"] * 2
        assert all(l["engine_matches_expected"] for l in lines), lines
        # Every tensor went from where it lies, none packed (bytes_in also counts the alignment
        # gaps inside runs, under 256 bytes a tensor).
        assert all(l["pushed_in_place_bytes"] >= 0.99 * l["bytes_in"] for l in lines), lines
    p, _ = node.trainer("--refits", "1", "--seed", "6", "--fault", "die-mid-bucket", "--in-place", "--vmm")
    assert p.returncode == 9, p.stderr
    wait_for(lambda: "outcome=aborted" in node.log.read_text(), timeout=20, what="abort after trainer death")
    p, lines = node.trainer("--refits", "1", "--seed", "7", "--in-place", "--vmm")
    assert p.returncode == 0 and lines[0]["outcome"] == "committed" and lines[0]["engine_matches_expected"], \
        p.stdout + p.stderr + node.log.read_text()[-3000:]


def test_the_colocated_loop_sleeps_the_engine_between_refits_and_wakes_it_for_each(node_factory, tmp_path):
    # The colocated loop on one GPU, three times: trainer step, the engine wakes (new memory at the
    # same addresses), refit over CUDA IPC straight into the engine's CUDA virtual memory (the
    # shipped llama3 spec), rollout, the engine sleeps and gives its weights' memory back
    # (example_engine and example_trainer --sleep-wake). Every refit's bytes equal the offline
    # conversion; the memory each sleep gives back is the engine's weights.
    text = (SRC / "deploy/models/llama3_fp8.yaml").read_text()
    spec = tmp_path / "llama3_tp1.yaml"
    spec.write_text(re.sub(r"^tensor_parallel:.*$", "tensor_parallel: {size: 1}", text, flags=re.M))
    loop = tmp_path / "loop"
    os.mkfifo(f"{loop}.ctl")
    os.mkfifo(f"{loop}.ack")
    node = node_factory(spec=str(spec), staging="direct", engine_args=["--vmm", "--sleep-wake", str(loop)])
    registered = next(json.loads(l) for l in node.engine_log.read_text().splitlines() if '"registered"' in l)
    p, lines = node.trainer("--refits", "3", "--in-place", "--vmm", "--sleep-wake", str(loop))
    assert p.returncode == 0, p.stdout + p.stderr + node.log.read_text()[-3000:] + node.engine_log.read_text()[-2000:]
    assert [l["outcome"] for l in lines] == ["committed"] * 3
    assert all(l["engine_matches_expected"] for l in lines), lines
    events = [json.loads(l) for l in node.engine_log.read_text().splitlines() if l.startswith("{")]
    asleep = [e for e in events if e["event"] == "asleep"]
    awake = [e for e in events if e["event"] == "awake"]
    # Asleep after refits 1 and 2 (version 1, 2), woken before refits 2 and 3 with nothing staged.
    assert [e["version"] for e in asleep] == [1, 2], events
    assert [e["committed"] for e in awake] == [False, False], events
    # The weights' memory (rounded up to the allocation granularity) is what a sleep gives back.
    assert all(registered["bytes"] <= e["freed_bytes"] <= registered["bytes"] + (64 << 20) for e in asleep), \
        (registered, asleep)
    # refitd saw two sleeps and two wakes, and the engine serves the last version.
    log = node.log.read_text()
    assert log.count("engine_asleep") == 2 and log.count("engine_awake") == 2, log[-3000:]
    node.engine.send_signal(signal.SIGTERM)
    node.engine.wait(timeout=30)
    assert json.loads(node.engine_log.read_text().splitlines()[-1])["mixed"] == 0


def test_trainer_killed_while_pushing_in_place_aborts_and_engine_is_unchanged(node_factory):
    # refitd's converter may be reading the dead trainer's own memory: the abort must still come,
    # refitd must stay healthy, and the next refit lands.
    node = node_factory(deadline_ms=20000)
    p, lines = node.trainer("--refits", "1", "--seed", "5", "--in-place")
    assert p.returncode == 0 and lines[0]["outcome"] == "committed", p.stdout + p.stderr
    p, _ = node.trainer("--refits", "1", "--seed", "6", "--fault", "die-mid-bucket", "--in-place")
    assert p.returncode == 9, p.stderr
    wait_for(lambda: "outcome=aborted" in node.log.read_text(), timeout=20, what="abort after trainer death")
    verdict = node.engine_matches(5)
    assert verdict["ok"] and verdict["version"] == 1, verdict
    p, lines = node.trainer("--refits", "1", "--seed", "7", "--in-place")
    assert p.returncode == 0 and lines[0]["outcome"] == "committed" and lines[0]["engine_matches_expected"], \
        p.stdout + p.stderr + node.log.read_text()[-3000:]


def test_refit_over_a_filesystem_socket_matches_offline_conversion(node_factory, tmp_path):
    node = node_factory(socket=str(tmp_path / "ipc.sock"))
    p, lines = node.trainer("--refits", "1", "--seed", "3")
    assert p.returncode == 0 and lines[0]["outcome"] == "committed", p.stdout + p.stderr + node.log.read_text()
    assert f"data=cuda_ipc:{tmp_path / 'ipc.sock'}" in node.log.read_text()
    verdict = node.engine_matches(3)
    assert verdict["ok"] and verdict["version"] == 1, verdict
    assert (tmp_path / "ipc.sock").stat().st_mode & 0o077 == 0, "the data socket is private to refitd's user"


def test_trainer_killed_mid_refit_aborts_within_deadline_and_engine_is_unchanged(node_factory):
    deadline_s = 20
    node = node_factory(deadline_ms=deadline_s * 1000)
    p, lines = node.trainer("--refits", "1", "--seed", "5")
    assert p.returncode == 0 and lines[0]["outcome"] == "committed", p.stdout + p.stderr
    assert node.engine_matches(5)["ok"]
    started = time.monotonic()
    p, _ = node.trainer("--refits", "1", "--seed", "6", "--fault", "die-mid-bucket")
    assert p.returncode == 9, p.stderr  # _exit mid-refit, after some buckets went out over CUDA IPC
    wait_for(lambda: "outcome=aborted" in node.log.read_text(), timeout=deadline_s, what="abort after trainer death")
    elapsed = time.monotonic() - started
    assert elapsed < deadline_s, elapsed
    verdict = node.engine_matches(5)
    assert verdict["ok"] and verdict["version"] == 1, verdict  # the old bytes, untouched
    print(json.dumps({"abort_after_kill_s": elapsed}))
    p, lines = node.trainer("--refits", "1", "--seed", "7")
    assert p.returncode == 0 and lines[0]["outcome"] == "committed" and lines[0]["engine_matches_expected"], \
        p.stdout + p.stderr + node.log.read_text()[-3000:]


def test_stalled_trainer_is_aborted_at_the_session_deadline(node_factory):
    node = node_factory(deadline_ms=3000)
    p, lines = node.trainer("--refits", "1", "--seed", "5")
    assert p.returncode == 0 and lines[0]["outcome"] == "committed", p.stdout + p.stderr
    stalled = subprocess.Popen([str(TRAINER), "--address", node.address, "--gpu", "0", "--seed", "8",
                                "--fault", "stall"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: "outcome=aborted" in node.log.read_text(), timeout=30, what="deadline abort")
        assert "session deadline passed" in node.log.read_text()
        assert node.engine_matches(5)["ok"]
    finally:
        stalled.kill()
        stalled.wait()
    p, lines = node.trainer("--refits", "1", "--seed", "9")
    assert p.returncode == 0 and lines[0]["outcome"] == "committed", p.stdout + p.stderr + node.log.read_text()[-3000:]


PIPELINED = {"REFIT_PIPELINED_BEGIN": "1", "REFIT_SEND_BEFORE_BEGIN": "1"}


def trace_refits(trace):
    """A REFIT_TRACE_FILE's labels ("pid us label [value]" lines), one list per refit: from each
    trainer.begin_sent to the next."""
    refits = []
    for line in trace.read_text().splitlines():
        label = line.split()[2]
        if label == "trainer.begin_sent":
            refits.append([])
        if refits:
            refits[-1].append(label)
    return refits


def test_a_pipelined_begins_first_buckets_go_before_its_answer(node_factory, tmp_path):
    # REFIT_PIPELINED_BEGIN=1 with REFIT_SEND_BEFORE_BEGIN=1: from a trainer's second refit on, it
    # takes the begin as promised and sends its first buckets' bytes before refitd answers. Here
    # refitd reads every begin 300 ms late (failpoint begin_received=delay:300), so the bytes wait
    # in its data plane for their session; with `staging: direct` they are converted into the
    # engine once it paused. Packed and pushed in place, every refit equals the offline conversion.
    text = (SRC / "deploy/models/llama3_fp8.yaml").read_text()
    spec = tmp_path / "llama3_tp1.yaml"
    spec.write_text(re.sub(r"^tensor_parallel:.*$", "tensor_parallel: {size: 1}", text, flags=re.M))
    node = node_factory(tmp=tmp_path / "late", spec=str(spec), staging="direct", deadline_ms=20000,
                        env={"REFIT_FAILPOINTS": "begin_received=delay:300"})
    trace = tmp_path / "trainer.trace"
    for flags in ([], ["--in-place"]):
        trace.unlink(missing_ok=True)
        p, lines = node.trainer("--refits", "3", *flags, env={**PIPELINED, "REFIT_TRACE_FILE": str(trace)})
        assert p.returncode == 0, p.stdout + p.stderr + node.log.read_text()[-3000:]
        assert [l["outcome"] for l in lines] == ["committed"] * 3
        assert all(l["engine_matches_expected"] for l in lines), lines
        # The trainer's trace ("pid us label [seq]"), one refit from each begin_sent: the first
        # begin waits for its answer; the later ones send a bucket before it.
        refits = trace_refits(trace)
        assert len(refits) == 3, trace.read_text()
        assert refits[0].index("trainer.begin_answered") < refits[0].index("trainer.bucket_sent"), refits[0]
        for r in refits[1:]:
            assert r.index("trainer.bucket_sent") < r.index("trainer.begin_answered"), r
    assert "event=session_begin" in node.log.read_text() and "manifest_by_key=true" in node.log.read_text()


def test_announces_taken_while_the_engine_pauses_are_converted_into_it(node_factory, tmp_path):
    # refitd hands a begin's session over (promise pipelining) before the engine has paused, so a
    # pipelined begin's announces reach it while the engine takes 300 ms to pause (example_engine
    # --pause-ms 300). Their buckets are received meanwhile and none is converted before the pause
    # (Session::Options::await_placement): every byte is converted into the engine's memory, and
    # each refit equals the offline conversion.
    trace = tmp_path / "refit.trace"
    node = node_factory(tmp=tmp_path / "slow", staging="direct", deadline_ms=20000, engine_args=["--pause-ms", "300"],
                        env={"REFIT_TRACE_FILE": str(trace)})
    p, lines = node.trainer("--refits", "3", "--in-place", env={**PIPELINED, "REFIT_TRACE_FILE": str(trace)})
    assert p.returncode == 0, p.stdout + p.stderr + node.log.read_text()[-3000:]
    assert [l["outcome"] for l in lines] == ["committed"] * 3
    assert all(l["engine_matches_expected"] for l in lines), lines
    assert all(l["bytes_in_place"] == l["bytes_out"] > 0 for l in lines), lines
    refits = trace_refits(trace)
    assert len(refits) == 3, trace.read_text()
    for r in refits[1:]:  # the pipelined begins (the first one goes by its whole manifest)
        assert r.index("daemon.announce_received") < r.index("daemon.engine_paused"), r
        assert r.index("daemon.engine_paused") < r.index("daemon.bucket_issued"), r


def test_a_refused_pipelined_begin_drops_the_bytes_sent_before_its_answer(node_factory, tmp_path):
    # The third begin is refused (failpoint begin_received=error@3) after the trainer, pushing in
    # place, may have sent its first runs for it: that refit fails with the begin's error and
    # nothing of it is written (the fourth lands as version 3, equal to its offline conversion);
    # refitd drops the refused session's bytes and releases the trainer's memory.
    node = node_factory(tmp=tmp_path / "refused", env={"REFIT_FAILPOINTS": "begin_received=error@3"})
    p, lines = node.trainer("--refits", "4", "--in-place", env=PIPELINED)
    assert [l["outcome"] for l in lines] == ["committed", "committed", "refused", "committed"], \
        p.stdout + p.stderr + node.log.read_text()[-3000:]
    assert "failpoint 'begin_received' triggered" in lines[2]["error"], lines[2]
    assert all(lines[i]["engine_matches_expected"] for i in (0, 1, 3)), lines
    assert [lines[i]["version"] for i in (0, 1, 3)] == [1, 2, 3], lines
    verdict = json.loads(subprocess.run([str(REFITCTL), "status", "--address", node.address, "--json"],
                                        capture_output=True, text=True, check=True).stdout)
    assert verdict["engine_dirty"] is False and verdict["version"] == 3, verdict
