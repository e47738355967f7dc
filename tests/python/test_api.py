"""The refit package's own behaviour against a real refitd: errors name what is wrong, sessions
belong to their client's thread, shared-memory parameters outlive their name."""
import ctypes
import os
import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from conftest import SRC_DIR, Daemon, h, needs_torch, wait_for

import refit
from refit import _native


def test_library_found_and_abi_version():
    lib = _native.lib()
    assert lib.refit_abi_version() >= _native.ABI_VERSION
    assert os.path.exists(lib.path)


def test_struct_layouts_match_the_header(tmp_path):
    """Every field offset and struct size of _native's ctypes mirrors equals what a C compiler
    makes of c_api.h."""
    structs = {"refit_tensor_desc": _native.TensorDesc, "refit_manifest": _native.Manifest,
               "refit_tensor": _native.Tensor, "refit_report": _native.Report,
               "refit_daemon_status": _native.DaemonStatus, "refit_param_checksum": _native.ParamChecksum,
               "refit_engine_param": _native.EngineParam, "refit_engine_options": _native.EngineOptions,
               "refit_staged_version": _native.StagedVersion}
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "client/c_api.h"', "int main(void) {"]
    want = []
    for cname, py in structs.items():
        lines.append(f'printf("%zu\\n", sizeof({cname}));')
        want.append(ctypes.sizeof(py))
        for field, _ in py._fields_:
            lines.append(f'printf("%zu\\n", offsetof({cname}, {field}));')
            want.append(getattr(py, field).offset)
    lines.append("return 0; }")
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run([shutil.which("cc") or "gcc", "-std=c99", "-I", str(SRC_DIR / "src"), str(src), "-o", str(exe)],
                   check=True)
    got = [int(x) for x in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()]
    assert got == want


def test_connect_to_missing_daemon_is_unavailable(tmp_path):
    with pytest.raises(refit.RefitUnavailable, match="nobody.sock") as e:
        refit.TrainerClient(f"unix:{tmp_path}/nobody.sock")
    assert e.value.code_name == "UNAVAILABLE"
    assert isinstance(e.value, ConnectionError)


def test_status_and_abort_without_session(daemon):
    with refit.TrainerClient(daemon.address) as client:
        s = client.status()
        assert s.model == "toy" and not s.engine_registered and s.version == 0
        assert client.abort_active() is False


def test_group_calls_need_the_members_of_an_engine_group(daemon):
    """commit_group / abort_group (C ABI 13): a client of one daemon is no group's coordinator, and
    a daemon outside an engine group refuses group calls, naming why."""
    with refit.TrainerClient(daemon.address) as client:
        with pytest.raises(refit.RefitError, match="refit_client_connect_fanout") as e:
            client.commit_group("g1")
        assert e.value.code_name == "FAILED_PRECONDITION"
    with refit.TrainerClient([daemon.address]) as fan:
        with pytest.raises(refit.RefitError, match="in no engine group"):
            fan.abort_group("g1")
        with pytest.raises(refit.RefitError, match="in no engine group"):
            fan.commit_group("g1", timeout_ms=5000)


def test_status_shows_the_engine_group(tmp_path, daemon):
    """DaemonStatus.group (C ABI 14, refit_daemon_status.group_*): a member of an engine group says
    which group, which member, its phase and why; a daemon in no group has none."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    socks = [tmp_path / "a" / "refitd.sock", tmp_path / "b" / "refitd.sock"]
    members = []
    for i, d in enumerate(["a", "b"]):
        addresses = ", ".join(f'"unix:{s}"' for s in socks)
        members.append(Daemon(tmp_path / d, "toy", "hold: 1\n"
                              f"group: {{name: engine-b, members: 2, member: {i}, addresses: [{addresses}]}}\n"))
    try:
        for m in members:  # the socket file exists from its bind; connections are taken from the listen
            wait_for(lambda: "event=listening" in m.log.read_text(), what="refitd listening")
        with refit.TrainerClient(members[1].address) as client:
            g = client.status().group
        assert isinstance(g, refit.GroupStatus)
        assert (g.name, g.members, g.member, g.phase) == ("engine-b", 2, 1, "joining")
        assert g.tag == "" and g.pending_tag == "" and not g.dirty and g.commits == 0 and g.aborts == 0
        assert "no group version has landed" in g.reason
        assert g.group_version == ""  # its peer is joining too: it knows no group version
        with refit.TrainerClient(daemon.address) as client:
            assert client.status().group is None
    finally:
        for m in members:
            h.kill(m.proc)


@needs_torch
def test_bad_tensors_are_refused_naming_them(daemon):
    import torch

    with refit.TrainerClient(daemon.address) as client:
        with pytest.raises(ValueError, match="complex"):
            client.session("toy", {"w": torch.zeros(2, dtype=torch.complex64)})
        # No engine registered: refitd is unavailable for refits, and says why.
        with pytest.raises(refit.RefitUnavailable) as e:
            client.session("toy", {"w": torch.zeros(2)})
        assert "engine" in str(e.value) and e.value.code_name == "UNAVAILABLE"


@needs_torch
def test_client_belongs_to_its_thread(daemon):
    errors = []
    with refit.TrainerClient(daemon.address) as client:
        def other():
            try:
                client.status()
            except refit.RefitError as e:
                errors.append(e)

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert client.status().model == "toy"  # still usable on its own thread
    assert len(errors) == 1 and errors[0].code_name == "FAILED_PRECONDITION"
    assert "thread" in str(errors[0])


@needs_torch
def test_engine_registration_refused_names_the_parameter(daemon, tmp_path):
    import torch

    shared = refit.SharedParams.from_tensors({"w": torch.ones(4)}, f"/refit-pytest-{uuid.uuid4().hex[:12]}")
    try:
        bad = [refit.ShmParam("w", "F32", (4,), "/refit-pytest-does-not-exist", 0, 16)]
        with pytest.raises(refit.RefitError, match="refit-pytest-does-not-exist"):
            refit.EngineAgent(daemon.address, bad)
        with refit.EngineAgent(daemon.address, shared.params) as agent:
            assert agent.connected and agent.version == 0 and not agent.dirty
            with refit.TrainerClient(daemon.address) as client:
                assert client.status().engine_params == 1
    finally:
        shared.close()


@needs_torch
def test_shared_params_views_outlive_the_name():
    import torch

    model = torch.nn.Linear(3, 2)
    ref = {n: p.detach().clone() for n, p in model.named_parameters()}
    weight = model.weight
    shared = refit.move_to_shm(model, f"/refit-pytest-{uuid.uuid4().hex[:12]}")
    assert model.weight is weight and weight.requires_grad
    assert Path(shared.path).exists()
    for n, p in model.named_parameters():
        assert torch.equal(p, ref[n])
        off = next(x.offset for x in shared.params if x.name == n)
        assert off % 256 == 0
    # Writes through the file are what the module sees (refitd writes the same way).
    with open(shared.path, "r+b") as f:
        f.seek(next(x.offset for x in shared.params if x.name == "bias"))
        f.write(torch.tensor([7.0, 8.0]).numpy().tobytes())
    assert model.bias.tolist() == [7.0, 8.0]
    shared.close()
    assert not Path(shared.path).exists()
    del shared
    assert model.bias.tolist() == [7.0, 8.0]  # the mapping lives while the views do
    model.bias.data.add_(1)
    assert model.bias.tolist() == [8.0, 9.0]


def test_pip_installs_the_package(tmp_path):
    """`pip install ./python` gives an importable package that finds the library it is told of."""
    from conftest import PYTHON_PKG

    target = tmp_path / "site"
    source = tmp_path / "python"  # a copy: setuptools writes build/ and *.egg-info/ beside the sources
    shutil.copytree(PYTHON_PKG, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target), str(source)], check=True,
                   cwd=tmp_path, env=dict(os.environ, PIP_NO_CACHE_DIR="1"))
    assert (target / "refit" / "engine.py").exists()
    code = "import refit, refit._native as n; print(refit.__file__); print(n.lib().path)"
    env = dict(os.environ, PYTHONPATH=str(target), REFIT_CLIENT_LIB=_native.lib().path)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env,
                         cwd=tmp_path).stdout.split()
    assert out == [str(target / "refit" / "__init__.py"), _native.lib().path]
