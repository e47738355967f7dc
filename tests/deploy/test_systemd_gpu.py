"""deploy/systemd/{colocated,nccl}: the GPU nodes' drop-ins for refitd.service and their
configurations. `systemd-analyze verify` loads refitd.service with each drop-in and reports no
finding, the offline security analysis stays low, and refitd accepts each configuration with its
model spec and the model's config.json. Skips, saying why, only where systemd-analyze cannot
verify even a trivial unit."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import DEPLOY, need_refitd, need_tool
from gpu_layouts import LLAMA3_SPEC, refitd_check

UNIT = DEPLOY / "systemd/refitd.service"
LAYOUTS = ["colocated", "nccl"]


def verify(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([need_tool("systemd-analyze"), "verify", str(path)], capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def verify_baseline(tmp_path):
    probe = tmp_path / "probe" / "refitd-probe.service"
    probe.parent.mkdir()
    probe.write_text("[Unit]\nDescription=probe\n\n[Service]\nType=exec\nExecStart=/bin/true\n")
    p = verify(probe)
    if p.returncode != 0:
        pytest.skip(f"systemd-analyze verify cannot run here (rc={p.returncode}): {p.stderr.strip()}")
    return set((p.stdout + p.stderr).splitlines())


def unit_with_drop_in(tmp_path: Path, layout: str) -> Path:
    """refitd.service (ExecStart at the built refitd) with the layout's drop-in directory beside
    it, where systemd-analyze looks for drop-ins of a unit given by path."""
    d = tmp_path / layout
    d.mkdir()
    unit = d / "refitd.service"
    unit.write_text(UNIT.read_text().replace("ExecStart=/usr/local/bin/refitd ", f"ExecStart={need_refitd()} "))
    shutil.copytree(DEPLOY / "systemd" / layout / "refitd.service.d", d / "refitd.service.d")
    return unit


def settings(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def drop_in(layout: str) -> Path:
    [path] = (DEPLOY / "systemd" / layout / "refitd.service.d").glob("*.conf")
    return path


@pytest.mark.parametrize("layout", LAYOUTS)
def test_unit_with_drop_in_verifies_without_warnings(layout, tmp_path, verify_baseline):
    p = verify(unit_with_drop_in(tmp_path, layout))
    findings = [l for l in (p.stdout + p.stderr).splitlines() if l not in verify_baseline]
    assert p.returncode == 0 and not findings, "\n".join(findings)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_verify_reads_the_drop_in(layout, tmp_path, verify_baseline):
    unit = unit_with_drop_in(tmp_path, layout)
    conf = unit.parent / "refitd.service.d" / drop_in(layout).name
    conf.write_text(conf.read_text().replace("Environment=CUDA_DEVICE_ORDER", "Enviroment=CUDA_DEVICE_ORDER"))
    p = verify(unit)
    assert "Enviroment" in p.stdout + p.stderr


@pytest.mark.parametrize("layout", LAYOUTS)
def test_security_exposure_stays_low(layout, tmp_path, verify_baseline):
    p = subprocess.run([need_tool("systemd-analyze"), "security", "--offline=true", "--threshold=20", "--no-pager",
                        str(unit_with_drop_in(tmp_path, layout))], capture_output=True, text=True, timeout=60)
    assert re.search(r"Overall exposure level for \S+: ([\d.]+)", p.stdout), p.stdout + p.stderr
    assert p.returncode == 0, p.stdout


@pytest.mark.parametrize("layout", LAYOUTS)
def test_drop_in_changes_no_sandbox_setting(layout):
    """The drop-ins add environment and ordering only; the base unit's sandbox stays."""
    s = settings(drop_in(layout).read_text())
    assert set(s) <= {"After", "Environment"}, set(s)


def test_nccl_node_environment():
    env = dict(v.split("=", 1) for v in settings(drop_in("nccl").read_text())["Environment"])
    assert env["NCCL_SOCKET_IFNAME"] and env["NCCL_SOCKET_FAMILY"] == "AF_INET" and env["NCCL_IB_HCA"]
    cfg = yaml.safe_load((DEPLOY / "systemd/nccl/refitd.yaml").read_text())
    assert cfg["data_plane"]["transport"] == "nccl" and cfg["staging"] == "device"
    assert not cfg["listen"].startswith("unix:") and cfg["access"]["token_file"]


def test_colocated_data_socket_is_in_the_runtime_directory():
    """A path socket (mode 0600) in the unit's RuntimeDirectory, which exists before refitd
    starts; an abstract name would be open to every process of the host's network namespace."""
    cfg = yaml.safe_load((DEPLOY / "systemd/colocated/refitd.yaml").read_text())
    runtime = Path("/run") / settings(UNIT.read_text())["RuntimeDirectory"][0]
    assert Path(cfg["data_plane"]["cuda_ipc_socket"]).parent == runtime
    assert Path(cfg["listen"][len("unix:"):]).parent == runtime
    assert cfg["data_plane"]["transport"] == "cuda_ipc" and cfg["staging"] == "direct"


@pytest.mark.parametrize("layout,spec", [("colocated", LLAMA3_SPEC.read_text()), ("nccl", LLAMA3_SPEC.read_text())])
def test_refitd_accepts_the_config(layout, spec, tmp_path):
    cfg = yaml.safe_load((DEPLOY / "systemd" / layout / "refitd.yaml").read_text())
    assert Path(cfg["model_spec"]).name == LLAMA3_SPEC.name
    p = refitd_check(cfg, tmp_path, spec)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "model: llama3-fp8" in p.stdout
