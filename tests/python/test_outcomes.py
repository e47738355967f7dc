"""How a refit that does not commit reaches a Python trainer, against a real refitd and engine
process: one exception class per way a caller handles it, with refitd's cause (`.cause`) and the
report of how the session ended (`.report`, None where there is none). Each is provoked for real:
a second session, no engine, an incomplete refit, a failpoint inside the commit window, a
deadline, a staging limit, a corrupted copy."""
import pytest

from conftest import needs_torch, wait_for

pytestmark = needs_torch


def toy_params(seed=5):
    import torch

    import models

    torch.set_num_threads(1)
    return dict(models.build(models.TOY, seed).named_parameters())


def test_no_engine_is_unavailable_not_busy(daemon):
    import refit

    with refit.TrainerClient(daemon.address) as client:
        with pytest.raises(refit.RefitUnavailable, match="no engine") as e:
            client.session("toy", toy_params())
    assert type(e.value) is refit.RefitUnavailable
    assert e.value.code_name == "UNAVAILABLE" and e.value.cause == "engine_error" and e.value.report is None


def test_second_session_is_busy(node):
    import models
    import refit

    daemon, _ = node(models.TOY)
    params = toy_params()
    with refit.TrainerClient(daemon.address) as first, refit.TrainerClient(daemon.address) as second:
        with first.session(models.TOY, params) as s:
            with pytest.raises(refit.RefitBusy, match="busy") as e:
                second.session(models.TOY, params)
            s.push_all(params)
        assert s.report.outcome == "committed"
        # A subclass of RefitUnavailable: callers that retry those retry it too.
        assert isinstance(e.value, refit.RefitUnavailable)
        assert e.value.code_name == "UNAVAILABLE" and e.value.cause == "busy" and e.value.report is None
        assert second.refit(models.TOY, params).version == 2  # free again


def test_incomplete_refit_is_refused_with_its_report(node):
    import models
    import refit

    daemon, engine = node(models.TOY)
    before = engine.shm_digest()
    params = toy_params()
    with refit.TrainerClient(daemon.address) as client:
        s = client.session(models.TOY, params, tag="step-7")
        s.push_all({n: p for n, p in params.items() if n != "norm.bias"})
        with pytest.raises(refit.RefitRefused, match="norm.bias") as e:
            s.commit()
        s.close()
        err = e.value
        assert err.code_name == "FAILED_PRECONDITION" and err.cause == "incomplete"
        assert err.report is not None and err.report is s.report
        assert err.report.session_id == s.id and err.report.tag == "step-7"
        assert err.report.outcome == "refused" and err.report.cause == "incomplete"
        assert "norm.bias" in err.report.reason and err.report.tensors == len(params) - 1
        # Bad input is refused at begin: no session, no report.
        with pytest.raises(refit.RefitInvalidArgument) as e:
            client.session("other-model", params)
        assert e.value.cause is None and e.value.report is None
    assert engine.shm_digest() == before


def test_commit_failed_in_the_window_is_a_dirty_engine(node):
    import models
    import refit

    daemon, engine = node(models.TOY, failpoints="mid_commit=error@1")
    params = toy_params()
    with refit.TrainerClient(daemon.address) as client:
        with pytest.raises(refit.RefitEngineDirty, match="dirty") as e:
            client.refit(models.TOY, params)
        err = e.value
        # Not "retry later": only a full refit lands.
        assert not isinstance(err, refit.RefitUnavailable)
        assert err.code_name == "UNAVAILABLE" and err.cause == "engine_dirty"
        assert err.report.outcome == "failed" and err.report.cause == "engine_error"
        assert "dirty" in err.report.reason and err.report.version == 0 and err.report.tensors == len(params)
        assert client.status().engine_dirty
        # A partial refit is refused as the dirty engine's, before anything is sent.
        with pytest.raises(refit.RefitEngineDirty, match="partial refit refused") as e:
            client.session(models.TOY, {"norm.bias": params["norm.bias"]}, partial=True)
        assert e.value.code_name == "FAILED_PRECONDITION" and e.value.cause == "engine_dirty"
        assert e.value.report is None
        # A full refit lands and cleans it.
        assert client.refit(models.TOY, params).version == 1
        assert not client.status().engine_dirty
    engine.wait_version(1)


def test_deadline_passed_before_commit(node):
    import models
    import refit

    daemon, _ = node(models.TOY)
    params = toy_params()
    with refit.TrainerClient(daemon.address) as client:
        s = client.session(models.TOY, params, deadline_ms=200)
        wait_for(lambda: client.status().active_session != s.id, what="the session's deadline")
        with pytest.raises(refit.RefitDeadlineExceeded) as e:
            s.commit()
        s.close()
    err = e.value
    assert isinstance(err, refit.RefitAborted) and isinstance(err, TimeoutError)
    assert err.code_name == "DEADLINE_EXCEEDED" and err.cause == "deadline_exceeded"
    assert err.report.session_id == s.id and err.report.outcome == "aborted"
    assert err.report.cause == "deadline_exceeded"


def test_staging_limit_is_overloaded(node):
    import models
    import refit

    daemon, engine = node(models.TOY, config="limits:\n  staging_bytes: 4096\n")
    before = engine.shm_digest()
    with refit.TrainerClient(daemon.address) as client:
        with pytest.raises(refit.RefitOverloaded, match="staging limit") as e:
            client.refit(models.TOY, toy_params())
    err = e.value
    assert err.code_name == "RESOURCE_EXHAUSTED" and err.cause == "overloaded"
    assert err.report.outcome == "failed" and err.report.cause == "overloaded"
    assert engine.shm_digest() == before


def test_verify_mismatch_is_data_loss_and_a_dirty_engine(node):
    import models
    import refit

    daemon, engine = node(models.TOY, config="engine:\n  verify_after_commit: true\n",
                          failpoints="corrupt_copy=error@1")
    params = toy_params()
    with refit.TrainerClient(daemon.address) as client:
        with pytest.raises(refit.RefitVerifyMismatch) as e:
            client.refit(models.TOY, params)
        err = e.value
        assert isinstance(err, refit.RefitDataLoss) and isinstance(err, refit.RefitEngineDirty)
        assert err.code_name == "DATA_LOSS" and err.cause == "verify_mismatch"
        assert err.report.outcome == "failed" and err.report.cause == "verify_mismatch"
        assert client.status().engine_dirty
        assert client.refit(models.TOY, params).version == 1  # the failpoint fired once
    engine.wait_version(1)
