"""deploy/systemd: the unit's sandbox keeps what refitd needs (the host's /dev/shm, the engine's
shm objects, netlink for UCX), the config file fits the unit and names every config key, and
refitd itself accepts the config and the model spec the unit points at and serves with them.
test_systemd_unit.py runs systemd-analyze on the unit."""
import re
import subprocess
from pathlib import Path

import yaml

from conftest import DEPLOY, SRC, deploy_config_for_test, need_refitd

UNIT = DEPLOY / "systemd/refitd.service"
CONFIG = DEPLOY / "systemd/refitd.yaml"
INSTALLED_BINARY = "/usr/local/bin/refitd"


def unit_settings(text: str) -> dict[str, list[str]]:
    """key -> values in order (keys may repeat), for the [Service] and [Unit] sections."""
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_sandbox_keeps_what_refitd_needs():
    s = unit_settings(UNIT.read_text())
    assert s["ProtectSystem"] == ["strict"] and s["ProtectHome"] == ["yes"]
    assert s["NoNewPrivileges"] == ["yes"] and s["CapabilityBoundingSet"] == [""]
    assert s["Restart"] == ["on-failure"] and s["LimitMEMLOCK"] == ["infinity"]
    assert s["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6 AF_NETLINK"]
    # PrivateTmp replaces /tmp and /var/tmp only; the control socket must not live there.
    assert s["PrivateTmp"] == ["yes"]
    # RemoveIPC=yes would unlink the engine's parameter objects (same user) when refitd stops.
    assert s["RemoveIPC"] == ["no"]
    # PrivateDevices would hide the GPU and RDMA device nodes; PrivateIPC UCX's sysv segments.
    assert s.get("PrivateDevices", ["no"]) == ["no"] and s.get("PrivateIPC", ["no"]) == ["no"]
    # UCX patches code in place for its memory hooks.
    assert s.get("MemoryDenyWriteExecute", ["no"]) == ["no"]
    assert s.get("DynamicUser", ["no"]) == ["no"], "DynamicUser implies RemoveIPC=yes"
    assert s["User"] == ["refit"]


def test_config_fits_the_unit():
    s = unit_settings(UNIT.read_text())
    cfg = yaml.safe_load(CONFIG.read_text())
    assert s["ExecStart"] == [f"{INSTALLED_BINARY} --config /etc/refitd/refitd.yaml"]
    runtime_dir = Path("/run") / s["RuntimeDirectory"][0]
    assert cfg["listen"].startswith("unix:")
    assert Path(cfg["listen"][len("unix:"):]).parent == runtime_dir
    assert int(cfg["socket_mode"], 8) & 0o007 == 0, "the control socket must not be world-accessible"
    spec = Path(cfg["model_spec"])
    assert spec.parent == Path("/etc/refitd/models")
    assert (DEPLOY / "models" / spec.name).is_file(), f"deploy/models/{spec.name} is installed as {spec}"


def test_config_example_lists_every_key():
    """The example is the layout reference: it names every key src/server/config.cc accepts."""
    source = (SRC / "src/server/config.cc").read_text()
    allowed = {}
    for where, keys in re.findall(r'CheckKeys\([^,]+,\s*path,\s*"(\w+)",\s*\{([^}]*)\}', source, re.S):
        allowed[where] = set(re.findall(r'"(\w+)"', keys))
    # data_plane's keys come from the transport descriptors (src/transport/*/..._transport.cc).
    allowed["data_plane"] = {"transport", "host", "device", "ucx_tls"}
    assert set(allowed) == {"config", "data_plane", "limits", "admin", "access", "tls", "engine", "log", "group"}, allowed
    cfg = yaml.safe_load(CONFIG.read_text())
    # tls stays commented out (it applies to a TCP listen address, the unit uses a Unix socket);
    # so does model_config (the demo spec takes no size from a model's config.json).
    # log_level is the older spelling of log.level, still read; the example shows log: instead.
    # group stays commented out too (a single node's refitd is in no engine group).
    assert set(cfg) | {"tls", "log_level", "model_config", "group"} == allowed["config"]
    assert "# model_config: " in CONFIG.read_text()
    for key in allowed["tls"]:
        assert f"#   {key}:" in CONFIG.read_text(), f"tls.{key} is shown (commented out)"
    for key in allowed["group"]:
        assert f"#   {key}:" in CONFIG.read_text(), f"group.{key} is shown (commented out)"
    for section in ("data_plane", "limits", "admin", "engine", "log"):
        assert set(cfg[section]) == allowed[section], section
    # access: token_file stays commented out (the unit listens on a Unix socket); the rest is set.
    assert set(cfg["access"]) | {"token_file"} == allowed["access"], cfg["access"]
    assert "token_file:" in CONFIG.read_text()


def test_refitd_accepts_the_config_and_model_spec(tmp_path):
    config = deploy_config_for_test(CONFIG.read_text(), tmp_path, DEPLOY / "models/demo-llama.yaml")
    p = subprocess.run([str(need_refitd()), "--config", str(config), "--print-config"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "model: demo-llama" in p.stdout and "rules: 2" in p.stdout


def test_refitd_rejects_a_misspelled_key(tmp_path):
    config = deploy_config_for_test(CONFIG.read_text().replace("staging: host", "stagin: host"), tmp_path,
                                    DEPLOY / "models/demo-llama.yaml")
    p = subprocess.run([str(need_refitd()), "--config", str(config), "--print-config"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 1 and "unknown key 'stagin'" in p.stderr


def test_model_spec_is_the_embedded_demo_spec():
    embedded = re.search(r'R"\((.*?)\)"', (SRC / "src/spec/demo_spec.h").read_text(), re.S).group(1)
    assert yaml.safe_load((DEPLOY / "models/demo-llama.yaml").read_text()) == yaml.safe_load(embedded)


def test_refitd_refits_with_the_deploy_config(systemd_refitd):
    """The deploy config and model spec carry a real refit: engine, trainer, commit, SIGTERM."""
    assert systemd_refitd.get("/healthz") == (200, "ok")
    code, body = systemd_refitd.get("/readyz")
    assert code == 503 and "no engine registered" in body
    systemd_refitd.start_engine()
    assert systemd_refitd.get("/readyz")[0] == 200
    systemd_refitd.refit()
    code, body = systemd_refitd.get("/metrics")
    assert code == 200
    assert re.search(r"^refit_committed_version 1$", body, re.M), body
    assert re.search(r'^refit_sessions_total\{outcome="committed",reason="none"\} 1$', body, re.M), body
    assert systemd_refitd.stop() == 0


TEMPLATE = DEPLOY / "systemd/refitd@.service"


def test_notify_readiness_watchdog_and_reload():
    """Type=notify: refitd sends READY=1 once listening (test_systemd_notify.py proves it) and
    pings the watchdog; reload is SIGHUP, which refitd handles (main.cc) instead of dying."""
    s = unit_settings(UNIT.read_text())
    assert s["Type"] == ["notify"] and s["NotifyAccess"] == ["main"]
    assert s["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    watchdog = s["WatchdogSec"][0]
    assert re.fullmatch(r"\d+s", watchdog) and 10 <= int(watchdog[:-1]) <= 120, watchdog
    # A watchdog kill counts as a failure, so Restart=on-failure restarts it.
    assert s["Restart"] == ["on-failure"]
    main = (SRC / "src/server/main.cc").read_text()
    assert "captureSignal(SIGHUP)" in main


def test_reload_is_documented():
    ops = (SRC / "docs/operations.md").read_text()
    assert "### Reload" in ops and "SIGHUP" in ops and "systemctl reload" in ops


def test_template_differs_only_in_the_instance_settings():
    unit, template = unit_settings(UNIT.read_text()), unit_settings(TEMPLATE.read_text())
    per_instance = {"Description", "ExecStart", "RuntimeDirectory", "CacheDirectory", "Environment"}
    assert {k: v for k, v in unit.items() if k not in per_instance} == \
        {k: v for k, v in template.items() if k not in per_instance}
    assert template["ExecStart"] == [
        f"{INSTALLED_BINARY} --config /etc/refitd/%i.yaml --listen unix:/run/refitd/%i/refitd.sock"]
    assert template["RuntimeDirectory"] == ["refitd/%i"]
    assert template["CacheDirectory"] == ["refitd/%i"]
    assert template["Environment"] == ["CUDA_CACHE_PATH=%C/refitd/%i/cuda"]
    assert "%i" in template["Description"][0]


def test_template_instance_serves_on_its_own_socket(tmp_path):
    """What refitd@llama.service runs: the instance's config, the socket the command line names
    (overriding the config's listen), with the instance's own admin address."""
    instance = "llama"
    cfg = deploy_config_for_test(CONFIG.read_text(), tmp_path, DEPLOY / "models/demo-llama.yaml")
    (tmp_path / f"{instance}.yaml").write_text(cfg.read_text())
    exec_start = unit_settings(TEMPLATE.read_text())["ExecStart"][0]
    args = exec_start.replace("%i", instance).replace("/etc/refitd", str(tmp_path)).replace(
        "/run/refitd", str(tmp_path)).split()[1:]
    (tmp_path / instance).mkdir()
    p = subprocess.run([str(need_refitd()), *args, "--admin-listen", "127.0.0.1:0", "--print-config"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"listen: unix:{tmp_path}/{instance}/refitd.sock" in p.stdout
