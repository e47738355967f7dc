"""Trainer (this process, refit.TrainerClient) -> real refitd -> engine (another process,
refit.ModuleEngine over POSIX shm): the engine's tensors change in place, and its outputs equal
the trainer's reference outputs bit for bit."""
import pytest

from conftest import needs_torch, needs_transformers

pytestmark = needs_torch


def trainer_model(kind, seed, dtype=None):
    import torch

    import models

    torch.set_num_threads(1)
    return models.build(kind, seed, dtype or torch.float32)


def assert_same_tensors(got: dict, want: dict):
    import torch

    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert torch.equal(got[name], want[name]), f"parameter '{name}' differs"


def named(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_toy_refits_change_engine_and_outputs_match_reference(node):
    import torch

    import models
    import refit

    daemon, engine = node(models.TOY)
    v0 = engine.snapshot(0)
    before = engine.shm_digest()
    with refit.TrainerClient(daemon.address) as client:
        for version, seed in [(1, 11), (2, 22)]:
            trainer = trainer_model(models.TOY, seed)
            report = client.refit(models.TOY, trainer.named_parameters())
            assert report.outcome == "committed" and report.version == version
            assert report.tensors == len(list(trainer.parameters()))
            snap = engine.snapshot(version)
            assert_same_tensors(snap["params"], named(trainer))
            assert torch.equal(snap["out"], models.outputs(models.TOY, trainer))
            assert not torch.equal(snap["out"], v0["out"])
            # refitd reads the same bytes back from the engine's storage.
            sum_version, sums = client.checksums()
            assert sum_version == version
            assert sums == {n: (refit.checksum(p), p.numel() * p.element_size())
                            for n, p in trainer.named_parameters()}
    assert engine.shm_digest() != before
    (exit_report,) = engine.stop()
    assert exit_report["mixed"] == 0 and exit_report["requests"] > 0 and not exit_report["dirty"]
    assert exit_report["versions"][-1] == 2


def test_session_context_pushes_and_commits_on_exit(node):
    import models
    import refit

    daemon, engine = node(models.TOY)
    trainer = trainer_model(models.TOY, 5)
    with refit.TrainerClient(daemon.address) as client:
        with client.session(models.TOY, trainer.named_parameters()) as s:
            assert s.id > 0 and s.bucket_bytes > 0
            for name, p in trainer.named_parameters():
                # Non-contiguous views of 2-D weights: the client sends them dense, row-major.
                s.push(name, p.t().contiguous().t() if p.dim() == 2 else p)
        assert s.report.outcome == "committed" and s.report.version == 1
        assert client.status().version == 1
    assert_same_tensors(engine.snapshot(1)["params"], named(trainer))


def test_in_place_push_of_host_tensors_commits_like_push(node):
    # in_place applies to CUDA tensors on a data plane that sends device memory where it lies;
    # host tensors (and other planes) are pushed as before (the GPU case: test_cuda_ipc_path.py).
    import models
    import refit

    daemon, engine = node(models.TOY)
    trainer = trainer_model(models.TOY, 6)
    with refit.TrainerClient(daemon.address) as client:
        report = client.refit(models.TOY, trainer.named_parameters(), in_place=True)
        assert report.outcome == "committed" and report.version == 1
        # Host tensors were packed, and this daemon stages (ABI 11 fields).
        assert report.bytes_pushed_in_place == 0 and report.bytes_in_place == 0, report
    assert_same_tensors(engine.snapshot(1)["params"], named(trainer))


def test_version_tags_reach_the_report_status_and_engine(node):
    import models
    import refit
    from conftest import events

    daemon, engine = node(models.TOY)
    with refit.TrainerClient(daemon.address) as client:
        trainer = trainer_model(models.TOY, 3)
        report = client.refit(models.TOY, trainer.named_parameters(), tag=1200)  # a training step
        assert report.outcome == "committed" and report.version == 1 and report.tag == "1200"
        assert report.cause == "none"
        status = client.status()
        assert status.version == 1 and status.tag == "1200" and not status.verify_after_commit
        engine.wait_version(1)
        assert [e["tag"] for e in events(engine.log) if e["event"] == "resumed"] == ["1200"]
        report = client.refit(models.TOY, trainer.named_parameters(), tag="run2:step-1300")
        assert report.version == 2 and report.tag == "run2:step-1300"
        assert client.status().tag == "run2:step-1300"
        with pytest.raises(refit.RefitInvalidArgument, match="manifest tag"):
            client.refit(models.TOY, trainer.named_parameters(), tag="step 1400")
        assert client.status().version == 2


def test_stage_only_holds_the_refit_until_refitctl_commits_it(node):
    import subprocess

    import models
    import refit
    from conftest import BIN

    daemon, engine = node(models.TOY, config="hold: 2\n")
    before = engine.shm_digest()
    trainer = trainer_model(models.TOY, 7)
    with refit.TrainerClient(daemon.address) as client:
        report = client.refit(models.TOY, trainer.named_parameters(), tag="step-7", stage_only=True)
        assert report.outcome == "staged" and report.tag == "step-7" and report.version == 0
        assert engine.shm_digest() == before and client.status().version == 0
        with pytest.raises(refit.RefitInvalidArgument, match="needs a tag"):
            client.refit(models.TOY, trainer.named_parameters(), stage_only=True)
        p = subprocess.run([str(BIN / "tools/refitctl"), "commit", "step-7", "--address", daemon.address],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "tag=step-7" in p.stdout
        assert client.status().version == 1 and client.status().tag == "step-7"
    assert_same_tensors(engine.snapshot(1)["params"], named(trainer))


def test_held_versions_commit_out_of_order_and_roll_back_from_python(node):
    import models
    import refit

    daemon, engine = node(models.TOY, config="hold: 2\n")
    trainers = {step: trainer_model(models.TOY, step) for step in (10, 20)}
    with refit.TrainerClient(daemon.address) as client:
        for step, trainer in trainers.items():
            assert client.refit(models.TOY, trainer.named_parameters(), tag=step, stage_only=True).outcome == "staged"
        held = client.versions()
        assert [(v.state, v.tag) for v in held] == [("held", "10"), ("held", "20")]
        assert all(v.bytes > 0 and v.checksum != 0 and v.version == 0 for v in held)
        report = client.commit_version(20)  # the newer one first
        assert report.outcome == "committed" and report.version == 1 and report.tag == "20"
        assert_same_tensors(engine.snapshot(1)["params"], named(trainers[20]))
        report = client.commit_version("10")
        assert report.version == 2 and report.tag == "10"
        assert_same_tensors(engine.snapshot(2)["params"], named(trainers[10]))
        assert [(v.state, v.tag) for v in client.versions()] == [("current", "10"), ("previous", "20")]
        report = client.rollback()
        assert report.version == 3 and report.tag == "20"
        assert_same_tensors(engine.snapshot(3)["params"], named(trainers[20]))
        with pytest.raises(refit.RefitError, match="no held version is tagged '30'"):
            client.commit_version(30)
    (exit_report,) = engine.stop()
    assert exit_report["mixed"] == 0


def test_exception_inside_session_aborts_and_engine_keeps_its_weights(node):
    import models
    import refit

    daemon, engine = node(models.TOY)
    before = engine.shm_digest()
    trainer = trainer_model(models.TOY, 7)
    with refit.TrainerClient(daemon.address) as client:
        with pytest.raises(RuntimeError, match="trainer step failed"):
            with client.session(models.TOY, trainer.named_parameters()) as s:
                for i, (name, p) in enumerate(trainer.named_parameters()):
                    s.push(name, p)
                    if i == 2:
                        s.flush()  # bytes have reached refitd's staging
                        raise RuntimeError("trainer step failed")
        status = client.status()
        assert status.aborted == 1 and status.committed == 0 and status.active_session == 0
        assert status.version == 0
        # refitd is free for the next session, which commits.
        assert client.refit(models.TOY, trainer.named_parameters()).version == 1
    assert engine.snapshot(1)["params"].keys() == named(trainer).keys()
    assert before != engine.shm_digest()


def test_refused_refit_names_missing_and_mismatched_tensors(node):
    import torch

    import models
    import refit

    daemon, engine = node(models.TOY)
    before = engine.shm_digest()
    trainer = trainer_model(models.TOY, 9)
    params = dict(trainer.named_parameters())
    with refit.TrainerClient(daemon.address) as client:
        partial = {n: p for n, p in params.items() if n != "norm.bias"}
        with pytest.raises(refit.RefitRefused, match="norm.bias"):
            client.refit(models.TOY, partial)
        wrong = dict(params, **{"proj.weight": torch.zeros(3, 3)})
        # A manifest refitd cannot plan is a refused refit (typed, not a message prefix).
        with pytest.raises(refit.RefitRefused, match="proj.weight") as e:
            client.refit(models.TOY, wrong)
        assert e.value.code_name == "FAILED_PRECONDITION"
        # A partial refit of tensors the spec does not mark updatable alone: refused.
        with pytest.raises(refit.RefitRefused, match="partial") as e:
            client.refit(models.TOY, {"norm.bias": params["norm.bias"]}, partial=True)
        assert e.value.code_name == "FAILED_PRECONDITION"
        # The wrong model is invalid input.
        with pytest.raises(refit.RefitInvalidArgument, match="this daemon serves .toy.") as e:
            client.refit("other-model", params)
        assert e.value.code_name == "INVALID_ARGUMENT"
        status = client.status()
        assert status.version == 0 and status.committed == 0
    assert engine.shm_digest() == before
    assert engine.stop()[0]["versions"] == [0]


def test_fp32_trainer_into_bf16_engine_casts_round_to_nearest_even(node):
    import torch

    import models
    import refit

    daemon, engine = node(models.TOY, dtype="bf16")
    trainer = trainer_model(models.TOY, 3)  # FP32
    with refit.TrainerClient(daemon.address) as client:
        report = client.refit(models.TOY, trainer.named_parameters())
    assert report.bytes_in == 2 * report.bytes_out
    got = engine.snapshot(1)["params"]
    for name, p in trainer.named_parameters():
        want = _bf16_rne(p.detach())
        assert got[name].dtype == torch.bfloat16
        assert torch.equal(got[name].view(torch.int16), want), name


def _bf16_rne(x):
    """Independent FP32 -> BF16 round-to-nearest-even on the bit patterns (finite inputs)."""
    import torch

    bits = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return ((rounded + 0x8000) % 0x10000 - 0x8000).to(torch.int16)


def test_bf16_trainer_push(node):
    import torch

    import models
    import refit

    daemon, engine = node(models.TOY, dtype="bf16")
    trainer = trainer_model(models.TOY, 4, torch.bfloat16)
    with refit.TrainerClient(daemon.address) as client:
        report = client.refit(models.TOY, trainer.named_parameters())
    assert report.bytes_in == report.bytes_out
    snap = engine.snapshot(1)
    assert_same_tensors(snap["params"], named(trainer))
    assert torch.equal(snap["out"], models.outputs(models.TOY, trainer))


def test_measured_amax_travels_and_other_formats_ignore_it(node):
    import torch

    import models
    import refit

    daemon, engine = node(models.TOY, dtype="bf16")
    trainer = trainer_model(models.TOY, 6, torch.bfloat16)
    with refit.TrainerClient(daemon.address) as client:
        with client.session(models.TOY, trainer.named_parameters()) as s:
            s.measure_amax()  # every BF16 tensor announces its max|x|; refitd uses it for NVFP4 only
            for name, p in trainer.named_parameters():
                s.push(name, p)
        assert s.report.outcome == "committed"
    assert_same_tensors(engine.snapshot(1)["params"], named(trainer))


@needs_transformers
def test_tiny_llama_refit_outputs_equal_reference(node):
    import torch

    import models
    import refit
    import refit.hf

    daemon, engine = node(models.TINY_LLAMA)
    v0 = engine.snapshot(0)
    trainer = trainer_model(models.TINY_LLAMA, 42)
    # One training step, so the pushed weights are not just another random init.
    opt = torch.optim.SGD(trainer.parameters(), lr=0.1)
    ids = models.inputs(models.TINY_LLAMA)
    trainer.train()
    trainer(ids, labels=ids).loss.backward()
    opt.step()
    trainer.eval()
    with refit.TrainerClient(daemon.address) as client:
        report = client.refit(models.TINY_LLAMA, refit.hf.named_weights(trainer))
    assert report.outcome == "committed"
    snap = engine.snapshot(1)
    assert_same_tensors(snap["params"], named(trainer))
    reference = models.outputs(models.TINY_LLAMA, trainer)
    assert torch.equal(snap["out"], reference)
    assert not torch.equal(snap["out"], v0["out"])
    (exit_report,) = engine.stop()
    assert exit_report["mixed"] == 0


def test_fanout_client_refits_two_daemons(node):
    import models
    import refit

    daemons, engines = zip(*(node(models.TOY, subdir=sub) for sub in ("a", "b")))
    trainer = trainer_model(models.TOY, 9)
    with refit.TrainerClient([d.address for d in daemons]) as client:
        with client.session(models.TOY, trainer.named_parameters()) as s:
            for name, p in trainer.named_parameters():
                s.push(name, p)
        assert s.report.outcome == "committed" and s.report.version == 1
    for e in engines:
        assert_same_tensors(e.snapshot(1)["params"], named(trainer))
