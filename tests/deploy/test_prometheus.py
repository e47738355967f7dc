"""deploy/prometheus: promtool accepts the scrape configuration and the alert rules, the alerts
behave as tests/deploy/refitd-alerts.test.yml expects (promtool test rules), they read only
metrics refitd exports (or Prometheus' own `up`), and the scrape targets use the admin port
and Service name of deploy/systemd and deploy/kubernetes."""
import subprocess

import yaml

from conftest import DEPLOY, SRC, registered_families, series_names, need_tool
from promql_names import metric_names

CONFIG = DEPLOY / "prometheus/prometheus.yml"
RULES = DEPLOY / "prometheus/refitd-alerts.yml"
RULE_TESTS = SRC / "tests/deploy/refitd-alerts.test.yml"


def promtool(*args, cwd=None):
    return subprocess.run([need_tool("promtool"), *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_check_config():
    p = promtool("check", "config", CONFIG.name, cwd=CONFIG.parent)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "1 rule files found" in p.stdout + p.stderr


def test_check_rules():
    p = promtool("check", "rules", str(RULES))
    assert p.returncode == 0, p.stdout + p.stderr


def test_alerts_fire_as_specified():
    p = promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert p.returncode == 0, p.stdout + p.stderr


def test_every_alert_is_exercised():
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    tested = {a["alertname"] for t in tests for a in t.get("alert_rule_test", [])}
    fired = {a["alertname"] for t in tests for a in t.get("alert_rule_test", []) if a.get("exp_alerts")}
    assert alerts == tested == fired


def test_rules_read_only_exported_metrics():
    exported = series_names(registered_families()) | {"up"}
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            unknown = metric_names(rule["expr"]) - exported
            assert not unknown, f"{rule.get('alert')}: {sorted(unknown)} not exported by refitd"


def test_targets_match_the_deployments():
    jobs = {j["job_name"]: j for j in yaml.safe_load(CONFIG.read_text())["scrape_configs"]}
    systemd_port = yaml.safe_load((DEPLOY / "systemd/refitd.yaml").read_text())["admin"]["listen"].rsplit(":", 1)[1]
    for target in jobs["refitd"]["static_configs"][0]["targets"]:
        assert target.endswith(":" + systemd_port), target
    [dns] = jobs["refitd-kubernetes"]["dns_sd_configs"]
    service = next(d for d in yaml.safe_load_all((DEPLOY / "kubernetes/host-path/service.yaml").read_text()) if d)
    assert service["spec"]["clusterIP"] == "None", "DNS lists the Pods only for a headless Service"
    assert dns["type"] == "A" and dns["port"] == service["spec"]["ports"][0]["port"]
    assert all(n.startswith(service["metadata"]["name"] + ".") for n in dns["names"])
