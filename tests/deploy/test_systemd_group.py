"""deploy/systemd/group: a member of an engine group on a systemd host. The drop-in only orders
the unit after the network and shortens the restart delay (no sandbox setting changes); the
member's configuration differs between the nodes only in group.member and data_plane.host, and
refitd accepts it for each member and, started with it, serves as that member, joining (not
ready) until a group version lands."""
import json
import subprocess

import yaml

from conftest import BUILD, DEPLOY, LiveRefitd, need_binary, need_refitd
from test_systemd import unit_settings

GROUP = DEPLOY / "systemd/group"
DROP_IN = GROUP / "refitd.service.d/group.conf"


def member_config(member: int, tmp, host: str) -> dict:
    cfg = yaml.safe_load((GROUP / "refitd.yaml").read_text())
    cfg["group"]["member"] = member
    cfg["data_plane"]["host"] = host
    return cfg


def runnable(cfg: dict, tmp) -> str:
    """The member's file as it runs here: a Unix socket in tmp (no token then), the admin endpoint
    on a free loopback port, the model spec from deploy/models."""
    cfg = dict(cfg)
    cfg["listen"] = f"unix:{tmp / 'refitd.sock'}"
    cfg.pop("access")
    cfg["admin"] = {"listen": "127.0.0.1:0"}
    cfg["data_plane"] = {**cfg["data_plane"], "host": "127.0.0.1"}
    cfg["model_spec"] = str(DEPLOY / "models/demo-llama.yaml")
    cfg["log"] = {"format": "text", "level": "info"}  # LiveRefitd reads the listening line
    path = tmp / "refitd.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_drop_in_orders_after_the_network_and_changes_no_sandbox_setting():
    s = unit_settings(DROP_IN.read_text())
    assert set(s) == {"Wants", "After", "RestartSec"}, s
    assert s["After"] == ["network-online.target"] and s["Wants"] == ["network-online.target"]


def test_member_config_is_a_group_member():
    cfg = yaml.safe_load((GROUP / "refitd.yaml").read_text())
    assert cfg["hold"] >= 1, "each group version is held before the group commits it"
    g = cfg["group"]
    assert g["members"] == 2 and g["member"] == 0 and g["name"]
    assert g["decision_timeout_ms"] >= 1000
    # Every member's address, in member order (late join): this node's own is the first.
    assert g["addresses"] == ["10.0.0.21:7400", "10.0.0.22:7400"]
    assert g["addresses"][g["member"]].split(":")[0] == cfg["data_plane"]["host"]
    # The trainer on other nodes reaches every member over TCP, with a token.
    assert not cfg["listen"].startswith("unix:") and cfg["access"]["token_file"]
    assert cfg["model_spec"] == "/etc/refitd/models/demo-llama.yaml"


def test_refitd_accepts_every_member(tmp_path):
    for member, host in ((0, "10.0.0.21"), (1, "10.0.0.22")):
        d = tmp_path / f"m{member}"
        d.mkdir()
        p = subprocess.run([str(need_refitd()), "--config", str(runnable(member_config(member, d, host), d)),
                            "--print-config"], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr
    # A member index outside the group is refused naming the key.
    d = tmp_path / "bad"
    d.mkdir()
    p = subprocess.run([str(need_refitd()), "--config", str(runnable(member_config(2, d, "10.0.0.23"), d)),
                        "--print-config"], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "group.member" in p.stderr, p.stderr


def test_a_started_member_joins_until_a_group_version_lands(tmp_path):
    daemon = LiveRefitd(tmp_path, runnable(member_config(1, tmp_path, "10.0.0.22"), tmp_path))
    try:
        code, body = daemon.get("/readyz")
        assert code == 503, body
        _, metrics = daemon.get("/metrics")
        assert 'refit_group_member_info{group="engine-a",member="1",members="2"} 1' in metrics
        assert 'refit_group_phase{phase="joining"} 1' in metrics
        refitctl = need_binary(BUILD / "tools/refitctl")
        p = subprocess.run([str(refitctl), "status", "--json", "--address", daemon.address], capture_output=True,
                           text=True, timeout=30)
        group = json.loads(p.stdout)["group"]
        assert group["name"] == "engine-a" and group["member"] == 1 and group["phase"] == "joining", group
    finally:
        daemon.stop()
