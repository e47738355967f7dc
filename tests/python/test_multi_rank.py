"""Multi-rank refits from Python: 2-4 trainer processes (ranks_main.py, a torch.distributed gloo
group) each push only their own row/column shards of the toy model into one session through
refit.distributed.refit (rank 0 begins and commits, the others join and detach). The engine's
bytes must equal a single-rank refit of the full tensors; a missing slice is refused naming the
tensor and the missing range; a rank SIGKILLed mid-session aborts the session, engine unchanged."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import HERE, PYTHON_PKG, needs_torch, wait_for

pytestmark = needs_torch


def spawn_ranks(tmp_path, address, world, mode, seed):
    run = tmp_path / f"{mode}-{world}-{seed}"
    run.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PYTHON_PKG), str(HERE), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, str(HERE / "ranks_main.py"), "--rank", str(r), "--world", str(world),
                               "--init", str(run / "store"), "--address", address, "--mode", mode, "--seed", str(seed),
                               "--out", str(run / f"rank{r}.json")],
                              stdout=open(run / f"rank{r}.log", "w"), stderr=subprocess.STDOUT, env=env)
             for r in range(world)]
    return run, procs


def finish(run, procs, timeout=120):
    results = []
    for r, p in enumerate(procs):
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"rank {r} did not finish: " + (run / f"rank{r}.log").read_text())
        out = run / f"rank{r}.json"
        assert p.returncode == 0 and out.exists(), f"rank {r} rc {p.returncode}: " + (run / f"rank{r}.log").read_text()
        results.append(json.loads(out.read_text()))
    return results


def ranks(tmp_path, address, world, mode, seed):
    run, procs = spawn_ranks(tmp_path, address, world, mode, seed)
    try:
        return finish(run, procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def full_refit(address, seed):
    import models
    import refit

    with refit.TrainerClient(address) as client:
        return client.refit(models.TOY, models.build(models.TOY, seed).named_parameters())


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ranks_pushing_their_shards_equal_a_single_rank_refit(node, tmp_path, world):
    import torch

    import models

    daemon, engine = node(models.TOY)
    before = engine.shm_digest()
    out = ranks(tmp_path, daemon.address, world, "helper", seed=31)
    reports = [o.get("report") for o in out]
    assert all(r is not None for r in reports), out
    assert reports[0]["outcome"] == "committed" and reports[0]["version"] == 1
    assert reports[0]["tensors"] == len(list(models.build(models.TOY, 31).parameters()))  # assembled, whole
    assert all(r == reports[0] for r in reports), reports  # every rank returns the same report
    sharded = engine.shm_digest()
    assert sharded != before
    want = {n: p.detach() for n, p in models.build(models.TOY, 31).named_parameters()}
    snap = engine.snapshot(1)["params"]
    for name in want:
        assert torch.equal(snap[name], want[name]), f"parameter '{name}' differs"
    # A single-rank refit of the full tensors: other weights, then the same ones again.
    assert full_refit(daemon.address, 32).version == 2
    assert engine.shm_digest() != sharded
    assert full_refit(daemon.address, 31).version == 3
    assert engine.shm_digest() == sharded
    log = daemon.log.read_text()
    assert log.count("event=session_join") == world - 1
    assert log.count("event=session_detach") == world - 1


def test_a_missing_slice_is_refused_naming_the_tensor_and_range(node, tmp_path):
    import models

    daemon, engine = node(models.TOY)
    before = engine.shm_digest()
    out = ranks(tmp_path, daemon.address, 2, "missing", seed=41)
    errors = [o.get("error") for o in out]
    assert all(e is not None for e in errors), out
    for e in errors:  # every rank raises the refusal, with its code
        assert e["type"] == "RefitRefused" and e["code_name"] == "FAILED_PRECONDITION", e
        # rank 1's columns of proj.weight [48, 48]: torch.tensor_split(48, 2) -> [24, 48)
        assert "tensor 'proj.weight'" in e["message"] and "missing [24, 48)" in e["message"], e
        assert "dimension 1" in e["message"], e
    assert engine.shm_digest() == before
    # The next refit is unaffected.
    out = ranks(tmp_path, daemon.address, 2, "helper", seed=42)
    assert all(o.get("report", {}).get("outcome") == "committed" for o in out), out


def test_a_rank_killed_mid_session_aborts_and_leaves_the_engine(node, tmp_path):
    import models
    import refit

    daemon, engine = node(models.TOY)
    assert full_refit(daemon.address, 51).version == 1
    before = engine.shm_digest()
    run, procs = spawn_ranks(tmp_path, daemon.address, 2, "kill", seed=52)
    try:
        check_killed_rank(run, procs, daemon, engine, before)
    finally:
        for p in procs:  # nothing outlives the test, whatever failed
            if p.poll() is None:
                p.kill()
                p.wait()


def check_killed_rank(run, procs, daemon, engine, before):
    import refit

    pushed = run / "rank1.json.pushed"
    wait_for(lambda: pushed.exists() or procs[1].poll() is not None or procs[0].poll() is not None, timeout=120,
             what="rank 1 pushing")
    assert pushed.exists(), (run / "rank1.log").read_text() + (run / "rank0.log").read_text()
    time.sleep(0.2)  # rank 0 is committing: its commit waits for rank 1's detach
    procs[1].send_signal(signal.SIGKILL)
    procs[1].wait(timeout=30)
    assert procs[1].returncode == -signal.SIGKILL
    procs[0].wait(timeout=120)
    assert procs[0].returncode == 0, (run / "rank0.log").read_text()
    result = json.loads((run / "rank0.json").read_text())
    err = result.get("error")
    assert err is not None, result
    assert err["type"] == "RefitAborted" and err["code_name"] == "ABORTED", err
    assert "a joined trainer rank disconnected before detaching" in err["message"], err
    assert engine.shm_digest() == before
    with refit.TrainerClient(daemon.address) as client:
        status = client.status()
        assert status.version == 1 and status.active_session == 0 and status.aborted == 1
    assert full_refit(daemon.address, 53).version == 2
    assert engine.shm_digest() != before


def test_single_process_join_detach_and_refusals(node):
    """join/detach/slices from one process with two clients (each its own connection and data
    plane), and the refusals a user meets on the way, none of which ends the session: joining a
    session that is not active, commit from a joined rank, detach from the beginning rank, a slice
    outside its tensor."""
    import torch

    import models
    import refit

    daemon, engine = node(models.TOY)
    params = {n: p.detach() for n, p in models.build(models.TOY, 61).named_parameters()}
    w, emb = params["proj.weight"], params["embed.weight"]
    with refit.TrainerClient(daemon.address) as c0, refit.TrainerClient(daemon.address) as c1:
        with pytest.raises(refit.RefitRefused) as e:
            c1.join(12345)
        assert e.value.code_name == "FAILED_PRECONDITION" and "session 12345 is not active" in str(e.value)
        with c0.session(models.TOY, params) as s0:
            with c1.join(s0.id) as s1:
                assert s1.joined and not s0.joined and s1.id == s0.id and s1.ids == s0.ids == [s0.id]
                with pytest.raises(refit.RefitRefused) as e:
                    s1.commit()
                assert e.value.code_name == "FAILED_PRECONDITION" and "detaches" in str(e.value)
                with pytest.raises(refit.RefitRefused) as e:
                    s0.detach()
                assert e.value.code_name == "FAILED_PRECONDITION" and "detach is for joined ranks" in str(e.value)
                with pytest.raises(refit.RefitInvalidArgument) as e:
                    s1.push("embed.weight", emb[:10], dim=0, start=45, full_shape=emb.shape)
                assert e.value.code_name == "INVALID_ARGUMENT" and "tensor 'embed.weight'" in str(e.value)
                assert "[45, 55) of dimension 0 lies outside its 50 rows" in str(e.value)
                with pytest.raises(ValueError):
                    s1.push("embed.weight", emb[:10], dim=0)
                s1.push("proj.weight", w[:, 16:], dim=-1, start=16, full_shape=w.shape)
                s1.push_slice("embed.weight", emb[20:], 0, 20, emb.shape)
            # leaving the joined block detached it
            s0.push("proj.weight", w[:, :16], dim=1, start=0, full_shape=w.shape)
            s0.push("embed.weight", emb[:20], dim=0, start=0, full_shape=emb.shape)
            for name in ("proj.bias", "norm.weight", "norm.bias", "head.weight"):
                s0.push(name, params[name])
        assert s0.report.outcome == "committed" and s0.report.version == 1
    snap = engine.snapshot(1)["params"]
    for name in params:
        assert torch.equal(snap[name], params[name]), name


def test_fanout_ranks_join_with_one_id_per_daemon(node):
    """Fan-out: two ranks, each a fan-out client of the same two daemons; rank 1 joins with
    rank 0's `ids` (one per daemon, in client order) and pushes its slices to both."""
    import torch

    import models
    import refit

    daemons, engines = zip(*(node(models.TOY, subdir=sub) for sub in ("a", "b")))
    addresses = [d.address for d in daemons]
    params = {n: p.detach() for n, p in models.build(models.TOY, 71).named_parameters()}
    head = params["head.weight"]
    with refit.TrainerClient(addresses) as c0, refit.TrainerClient(addresses) as c1:
        with c0.session(models.TOY, params) as s0:
            assert len(s0.ids) == 2
            with pytest.raises(refit.RefitInvalidArgument) as e:
                c1.join(s0.ids[0])
            assert "one session id per daemon" in str(e.value)
            with c1.join(s0.ids) as s1:
                assert s1.ids == s0.ids
                s1.push("head.weight", head[10:], dim=0, start=10, full_shape=head.shape)
            s0.push("head.weight", head[:10], dim=0, start=0, full_shape=head.shape)
            for name, p in params.items():
                if name != "head.weight":
                    s0.push(name, p)
        assert s0.report.outcome == "committed" and s0.report.version == 1
    for e in engines:
        snap = e.snapshot(1)["params"]
        for name in params:
            assert torch.equal(snap[name], params[name]), name


def test_commit_waits_for_a_joined_rank_until_the_deadline(node):
    """A joined rank that neither detaches nor dies: rank 0's commit waits for it until the
    session deadline, then fails DEADLINE_EXCEEDED; the engine keeps its weights."""
    import models
    import refit

    daemon, engine = node(models.TOY)
    before = engine.shm_digest()
    params = {n: p.detach() for n, p in models.build(models.TOY, 81).named_parameters()}
    with refit.TrainerClient(daemon.address) as c0, refit.TrainerClient(daemon.address) as c1:
        s0 = c0.session(models.TOY, params, deadline_ms=800)
        s1 = c1.join(s0.id)  # joined, never detaches
        s0.push_all(params)
        t0 = time.monotonic()
        with pytest.raises(refit.RefitError) as e:
            s0.commit()
        waited = time.monotonic() - t0
        assert e.value.code_name == "DEADLINE_EXCEEDED", e.value
        assert "session deadline passed" in str(e.value)
        assert 0.4 < waited < 10, waited
        s0.close()
        s1.close()
        assert c0.status().version == 0
    assert engine.shm_digest() == before


def test_manifest_of_the_ranks_descriptions_and_disagreements():
    """refit.distributed builds rank 0's manifest from every rank's (name, dtype, full shape,
    slice); ranks that disagree on a tensor are refused naming it and both ranks."""
    import torch

    from refit.distributed import Shard, _describe, manifest_of

    t = torch.zeros(4, 6)
    s = Shard.even(t[:, :3], dim=-1, index=1, count=2)
    assert (s.dim, s.start, s.full_shape) == (1, 3, (4, 6))
    gathered = [[_describe("a", Shard.even(t[:, :3], 1, 0, 2)), _describe("n", torch.zeros(6))], [_describe("a", s)]]
    assert manifest_of(gathered) == [("a", ("F32", (4, 6))), ("n", ("F32", (6,)))]
    gathered[1].append(_describe("n", torch.zeros(6, dtype=torch.bfloat16)))
    with pytest.raises(ValueError) as e:
        manifest_of(gathered)
    assert "tensor 'n': rank 0 pushes F32[6] but rank 1 pushes BF16[6]" in str(e.value)


def test_a_rank_dying_inside_the_helper_aborts_and_the_others_raise(node, tmp_path):
    """refit.distributed.refit with rank 1 SIGKILLing itself mid-push: refitd aborts the session
    (engine unchanged) and rank 0 raises RefitAborted instead of hanging."""
    import models

    daemon, engine = node(models.TOY)
    before = engine.shm_digest()
    run, procs = spawn_ranks(tmp_path, daemon.address, 2, "die", seed=91)
    try:
        procs[1].wait(timeout=120)
        assert procs[1].returncode == -signal.SIGKILL, (run / "rank1.log").read_text()
        procs[0].wait(timeout=120)
        log0 = (run / "rank0.log").read_text()
        assert procs[0].returncode == 0, log0
        err = json.loads((run / "rank0.json").read_text()).get("error")
        assert err is not None and err["code_name"] == "ABORTED", (err, log0)
        # Its push returns while its bucket is still sent in the background: when it dies with
        # the bucket on the wire, refitd names that bucket's failed receive instead.
        msg = err["message"]
        assert "a joined trainer rank disconnected before detaching" in msg or (
            "receiving bucket" in msg and "failed" in msg), err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert engine.shm_digest() == before
    out = ranks(tmp_path, daemon.address, 2, "helper", seed=92)  # the next refit is unaffected
    assert all(o.get("report", {}).get("outcome") == "committed" for o in out), out


ENGINE_OF_THE_EXAMPLE = """
import signal, sys, threading, torch, refit
m = torch.nn.Module()
names = {"model.layers.0.mlp.up_proj.weight": (1024, 256), "model.layers.0.mlp.down_proj.weight": (256, 1024),
         "model.layers.0.post_attention_layernorm.weight": (256,)}
params = [(n, torch.nn.Parameter(torch.zeros(*s, dtype=torch.bfloat16))) for n, s in names.items()]
for i, (_, p) in enumerate(params):
    m.register_parameter(f"p{i}", p)
e = refit.ModuleEngine(sys.argv[1], m, named_params=params)
print("registered", flush=True)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
stop.wait()
e.close()
"""


def test_the_docs_example_runs(tmp_path):
    """python/examples/refit_tp.py (the multi-rank example of docs/python.md), 2 ranks launched
    as torchrun would (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): three refits, and the engine
    holds the concatenation of the ranks' shards."""
    import socket

    import torch

    import refit
    from conftest import Daemon

    example = PYTHON_PKG / "examples" / "refit_tp.py"
    # docs/python.md shows this file as it is
    assert "```python\n" + example.read_text() + "```" in (PYTHON_PKG.parent / "docs" / "python.md").read_text()
    daemon = Daemon(tmp_path, "my-model")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PYTHON_PKG), os.environ.get("PYTHONPATH", "")]))
    engine = subprocess.Popen([sys.executable, "-c", ENGINE_OF_THE_EXAMPLE, daemon.address], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    procs = []
    try:
        assert engine.stdout.readline().strip() == "registered"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for rank in range(2):
            procs.append(subprocess.Popen(
                [sys.executable, str(example), daemon.address], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, env=dict(env, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))))
        outs = [p.communicate(timeout=120)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
        assert "step 2: engine at version 3" in outs[0], outs
        ups, downs = [], []
        for rank in range(2):  # what the example's ranks hold after three steps
            torch.manual_seed(rank)
            up, down = torch.randn(512, 256).bfloat16(), torch.randn(256, 512).bfloat16()
            for _ in range(3):
                up.mul_(0.5)
                down.add_(1.0)
            ups.append(up)
            downs.append(down)
        want = {"model.layers.0.mlp.up_proj.weight": torch.cat(ups, 0),
                "model.layers.0.mlp.down_proj.weight": torch.cat(downs, 1),
                "model.layers.0.post_attention_layernorm.weight": torch.ones(256).bfloat16()}
        with refit.TrainerClient(daemon.address) as client:
            version, sums = client.checksums()
        assert version == 3
        assert sums == {n: (refit.checksum(t), t.numel() * 2) for n, t in want.items()}
    finally:
        for p in procs + [engine]:
            if p.poll() is None:
                p.kill()
                p.wait()
        daemon.stop()
