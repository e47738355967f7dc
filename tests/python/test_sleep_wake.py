"""Sleep and wake against a real refitd, with shared-memory parameters: an engine that sleeps
(refitd drops its mappings, status says asleep), a refit meanwhile staged and committed at the
wake (at new addresses, then at the same ones), refits refused while asleep when refitd's
engine.asleep_refits says so, the registration audit refusing a stale registration (a replaced
shm object, a parameter the engine reports moved) naming the parameters, and busy polling after a
wake (refitd and the agent spin for the refit that follows, and stop at it)."""
import json
import os
import subprocess
import time
import uuid

import pytest

from conftest import BIN, Daemon, needs_torch

import refit


def _name():
    return f"/refit-pytest-{uuid.uuid4().hex[:12]}"


def _weights(torch, seed):
    g = torch.Generator().manual_seed(seed)
    return {"w.a": torch.randn(64, 32, generator=g), "w.b": torch.randn(96, generator=g)}


def _zeros(torch):
    return {"w.a": torch.zeros(64, 32), "w.b": torch.zeros(96)}


def _refitctl_status(d):
    """`refitctl status --json` (None when refitctl is not built)."""
    exe = BIN / "tools" / "refitctl"
    if not exe.is_file():
        return None
    p = subprocess.run([str(exe), "status", "--json", "--address", d.address], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _equal(shared, weights):
    return all(bool((shared.tensors[n] == t).all()) for n, t in weights.items())


@needs_torch
def test_refit_while_asleep_is_staged_and_committed_at_the_wake(tmp_path):
    import torch

    d = Daemon(tmp_path, "toy")
    first = refit.SharedParams.from_tensors(_zeros(torch), _name())
    moved = None
    try:
        calls = []
        agent = refit.EngineAgent(d.address, first.params, on_pause=lambda: calls.append("pause"),
                                  on_resume=lambda v: calls.append(f"resume:{v}"))
        with refit.TrainerClient(d.address) as client:
            agent.sleep()
            assert agent.asleep
            status = client.status()
            assert status.engine_asleep and status.awaiting_wake == 0
            w1 = _weights(torch, 1)
            report = client.refit("toy", w1, tag="step-1")
            assert report.outcome == "staged", report
            assert "commits when the engine wakes" in report.reason
            assert client.status().awaiting_wake == report.session_id
            shown = _refitctl_status(d)
            if shown is not None:
                assert shown["engine_asleep"] and shown["awaiting_wake"] == report.session_id
            assert calls == [] and _equal(first, _zeros(torch))
            with pytest.raises(refit.RefitUnavailable, match="waiting for the engine to wake"):
                client.refit("toy", w1)

            # The engine released its memory and woke at new addresses (another shm object).
            first.close()
            moved = refit.SharedParams.from_tensors(_zeros(torch), _name())
            assert agent.wake(moved.params) is True
            assert not agent.asleep and agent.version == 1 and agent.tag == "step-1"
            assert calls == ["pause", "resume:1"]
            assert _equal(moved, w1)
            status = client.status()
            assert not status.engine_asleep and status.awaiting_wake == 0 and status.version == 1

            # Again, waking at the same addresses (params omitted: the ones registered last).
            agent.sleep()
            w2 = _weights(torch, 2)
            assert client.refit("toy", w2).outcome == "staged"
            assert agent.wake() is True
            assert agent.version == 2 and _equal(moved, w2)

            # Sleep and wake with nothing staged; then an ordinary refit.
            agent.sleep()
            assert agent.wake() is False
            w3 = _weights(torch, 3)
            assert client.refit("toy", w3).outcome == "committed"
            assert _equal(moved, w3) and agent.version == 3

            # A wake must bring the same parameters.
            agent.sleep()
            other = refit.SharedParams.from_tensors({"w.a": torch.zeros(64, 32), "w.c": torch.zeros(96)}, _name())
            try:
                with pytest.raises(refit.RefitInvalidArgument, match="'w.c'"):
                    agent.wake(other.params)
            finally:
                other.close()
            assert agent.asleep
            assert agent.wake(moved.params) is False
        agent.stop()
    finally:
        first.close()
        if moved is not None:
            moved.close()
        d.stop()


@needs_torch
def test_refits_while_asleep_are_refused_when_configured(tmp_path):
    import torch

    d = Daemon(tmp_path, "toy", config="engine:\n  asleep_refits: refuse\n")
    shared = refit.SharedParams.from_tensors(_zeros(torch), _name())
    try:
        with refit.EngineAgent(d.address, shared.params) as agent, refit.TrainerClient(d.address) as client:
            agent.sleep()
            with pytest.raises(refit.RefitRefused, match="asleep_refits: refuse"):
                client.refit("toy", _weights(torch, 1))
            assert _equal(shared, _zeros(torch))
            assert agent.wake() is False
            w = _weights(torch, 4)
            assert client.refit("toy", w).outcome == "committed" and _equal(shared, w)
    finally:
        shared.close()
        d.stop()


@needs_torch
def test_a_stale_registration_is_refused_naming_the_parameters(tmp_path):
    import torch

    d = Daemon(tmp_path, "toy")
    name = _name()
    shared = refit.SharedParams.from_tensors(_zeros(torch), name)
    replaced = None
    try:
        moved = []
        paused = []
        with refit.EngineAgent(d.address, shared.params, audit=lambda: list(moved),
                               on_pause=lambda: paused.append(1)) as agent, \
                refit.TrainerClient(d.address) as client:
            # The engine says w.b is no longer where it registered it.
            moved.append("w.b")
            with pytest.raises(refit.RefitRefused, match=r"stale registration: parameter 'w.b'"):
                client.refit("toy", _weights(torch, 1))
            assert len(paused) == 1 and agent.version == 0 and not agent.paused  # resumed, nothing written
            assert _equal(shared, _zeros(torch))
            moved.clear()
            w = _weights(torch, 2)
            assert client.refit("toy", w).outcome == "committed" and _equal(shared, w)

            # The engine replaced its shm object under the same name without registering again.
            shared.close()
            replaced = refit.SharedParams.from_tensors(_zeros(torch), name)
            with pytest.raises(refit.RefitRefused, match=r"'w.a', 'w.b'.*replaced"):
                client.refit("toy", _weights(torch, 3))
            assert _equal(replaced, _zeros(torch)) and _equal(shared, w)
            # Registering again (a sleep and a wake) makes it current.
            agent.sleep()
            assert agent.wake(replaced.params) is False
            w4 = _weights(torch, 4)
            assert client.refit("toy", w4).outcome == "committed" and _equal(replaced, w4)
    finally:
        shared.close()
        if replaced is not None:
            replaced.close()
        d.stop()


def _cpu_seconds(pid=None):
    """CPU time (user + system) of process `pid` (None: this one, every thread)."""
    if pid is None:
        return time.process_time()
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_over(d, seconds):
    """(refitd's, this process's) CPU seconds over the next `seconds` of wall time."""
    before = (_cpu_seconds(d.proc.pid), _cpu_seconds())
    time.sleep(seconds)
    return _cpu_seconds(d.proc.pid) - before[0], _cpu_seconds() - before[1]


@needs_torch
def test_a_wake_with_nothing_staged_keeps_refitd_and_the_agent_spinning_until_the_refit(tmp_path, monkeypatch):
    # Busy polling on both sides: in a colocated loop the trainer's refit follows the engine's
    # wake, so after a wake with nothing staged refitd's loop (busy_poll: on) and the engine
    # agent's (REFIT_BUSY_POLL=1, read at registration) spin for the begin and the pause, at most
    # 1 s (docs/operations.md "Busy polling"); the refit's begin and pause end it sooner.
    import torch

    monkeypatch.setenv("REFIT_BUSY_POLL", "1")
    d = Daemon(tmp_path, "toy", config="busy_poll: on\n")
    shared = refit.SharedParams.from_tensors(_zeros(torch), _name())
    spun, quiet = 0.1, 0.05  # CPU seconds in 0.4 s: spinning (on a loaded machine too), idle
    try:
        with refit.EngineAgent(d.address, shared.params) as agent, refit.TrainerClient(d.address) as client:
            agent.sleep()
            asleep = _cpu_over(d, 0.4)
            assert agent.wake() is False
            woken = _cpu_over(d, 0.4)
            time.sleep(0.7)  # past the second after the wake
            later = _cpu_over(d, 0.4)
            assert woken[0] > spun and woken[1] > spun, (asleep, woken, later)
            assert max(asleep + later) < quiet, (asleep, woken, later)

            agent.sleep()
            assert agent.wake() is False
            w = _weights(torch, 5)
            assert client.refit("toy", w).outcome == "committed" and _equal(shared, w)
            after_refit = _cpu_over(d, 0.4)
            assert max(after_refit) < quiet, after_refit
    finally:
        shared.close()
        d.stop()
