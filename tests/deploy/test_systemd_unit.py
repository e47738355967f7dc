"""deploy/systemd/refitd.service passes `systemd-analyze verify` without a single warning (with
ExecStart pointed at the built refitd, since verify requires the binary to exist) and an offline
security analysis. Skips, saying why, only where systemd-analyze cannot verify even a trivial
unit (a container without a usable systemd)."""
import re
import subprocess
from pathlib import Path

import pytest

from conftest import DEPLOY, need_refitd, need_tool

UNIT = DEPLOY / "systemd/refitd.service"
TEMPLATE = DEPLOY / "systemd/refitd@.service"
INSTALLED_BINARY = "/usr/local/bin/refitd"


def verify(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([need_tool("systemd-analyze"), "verify", str(path)], capture_output=True,
                          text=True, timeout=60)


def unit_for_this_machine(tmp_path: Path, unit: Path = UNIT, name: str = "refitd.service") -> Path:
    text = unit.read_text()
    assert f"ExecStart={INSTALLED_BINARY} " in text
    out = tmp_path / name
    out.write_text(text.replace(f"ExecStart={INSTALLED_BINARY} ", f"ExecStart={need_refitd()} "))
    return out


@pytest.fixture
def verify_baseline(tmp_path):
    """What verify prints for a trivially valid unit here. If it cannot check even that one,
    this machine (a container without a usable systemd) cannot verify units: skip, saying why."""
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    probe = probe_dir / "refitd-probe.service"
    probe.write_text("[Unit]\nDescription=probe\n\n[Service]\nType=exec\nExecStart=/bin/true\n")
    p = verify(probe)
    if p.returncode != 0:
        pytest.skip(f"systemd-analyze verify cannot run here (rc={p.returncode}): {p.stderr.strip()}")
    return set((p.stdout + p.stderr).splitlines())


def test_unit_verifies_without_warnings(tmp_path, verify_baseline):
    p = verify(unit_for_this_machine(tmp_path))
    # verify reports unknown keys and bad values as warnings with rc 0: any line is a finding.
    findings = [l for l in (p.stdout + p.stderr).splitlines() if l not in verify_baseline]
    assert p.returncode == 0 and not findings, "\n".join(findings)


def test_verify_reports_a_misspelled_key(tmp_path, verify_baseline):
    unit = unit_for_this_machine(tmp_path)
    unit.write_text(unit.read_text().replace("ProtectSystem=strict", "ProtectSytem=strict"))
    p = verify(unit)
    assert "ProtectSytem" in p.stdout + p.stderr


def test_security_exposure_is_low(tmp_path, verify_baseline):
    # --threshold is the overall exposure x10 above which the command fails (2.0 of 10 here).
    p = subprocess.run([need_tool("systemd-analyze"), "security", "--offline=true", "--threshold=20",
                        "--no-pager", str(unit_for_this_machine(tmp_path))],
                       capture_output=True, text=True, timeout=60)
    overall = re.search(r"Overall exposure level for \S+: ([\d.]+)", p.stdout)
    assert overall, p.stdout + p.stderr
    assert p.returncode == 0, f"exposure {overall.group(1)} is above 2.0:\n{p.stdout}"




def test_template_instance_verifies_without_warnings(tmp_path, verify_baseline):
    """refitd@.service, verified as an instance (verify needs an instance name for %i)."""
    p = verify(unit_for_this_machine(tmp_path, TEMPLATE, "refitd@demo.service"))
    findings = [l for l in (p.stdout + p.stderr).splitlines() if l not in verify_baseline]
    assert p.returncode == 0 and not findings, "\n".join(findings)


def test_template_security_exposure_is_low(tmp_path, verify_baseline):
    p = subprocess.run([need_tool("systemd-analyze"), "security", "--offline=true", "--threshold=20",
                        "--no-pager", str(unit_for_this_machine(tmp_path, TEMPLATE, "refitd@demo.service"))],
                       capture_output=True, text=True, timeout=60)
    assert re.search(r"Overall exposure level for \S+: ([\d.]+)", p.stdout), p.stdout + p.stderr
    assert p.returncode == 0, p.stdout
