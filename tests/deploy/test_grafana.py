"""deploy/grafana/refitd.json: every PromQL expression of the dashboard (panels and template
variables) parses (promtool check rules, with Grafana's variables replaced) and names only
metrics that refitd exports: those RefitMetrics::Register adds (src/metrics/refit_metrics.cc)
and those a live refitd lists on /metrics after a refit (example engine and trainer). Every exported family appears on the dashboard."""
import json
import subprocess

import yaml

from conftest import DEPLOY, families_in_exposition, need_tool, registered_families, series_names
from promql_names import grafana_to_promql, metric_names

DASHBOARD = DEPLOY / "grafana/refitd.json"


def all_panels(panels):
    for p in panels:
        yield p
        yield from all_panels(p.get("panels", []))


def expressions():
    """(where, PromQL) for every panel target and query variable of the dashboard."""
    d = json.loads(DASHBOARD.read_text())
    out = []
    for p in all_panels(d["panels"]):
        for t in p.get("targets", []):
            out.append((f"panel '{p['title']}' target {t['refId']}", grafana_to_promql(t["expr"])))
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            out.append((f"variable '{v['name']}'", grafana_to_promql(q)))
    return out


def test_the_name_extraction_finds_what_it_must():
    assert metric_names('sum by (le) (rate(a_bucket{job=~".*", x="b c"}[5m]))') == {"a_bucket"}
    assert metric_names("time() - (b > 0) and on (job, instance) c offset 30m") == {"b", "c"}
    assert metric_names("histogram_quantile(0.99, sum(rate(d[5m:1m])) by (le)) / e unless f") == {"d", "e", "f"}
    assert metric_names(grafana_to_promql('label_values(g{job=~"$job"}, instance)')) == {"g"}
    assert grafana_to_promql("rate(h[$__rate_interval])") == "rate(h[5m])"


def test_dashboard_has_panels_with_queries():
    d = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in all_panels(d["panels"])]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    for p in all_panels(d["panels"]):
        if p["type"] != "row":
            assert p.get("targets"), f"panel '{p['title']}' has no query"
            for t in p["targets"]:
                assert t["datasource"]["uid"] == "${datasource}", p["title"]


def test_every_expression_parses(tmp_path):
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": expr} for i, (_, expr) in enumerate(expressions())]}]}
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules))
    p = subprocess.run([need_tool("promtool"), "check", "rules", str(path)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def test_names_only_registered_metrics():
    exported = series_names(registered_families())
    for where, expr in expressions():
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        assert names <= exported, f"{where}: {sorted(names - exported)} not registered by refitd"


def test_names_only_metrics_a_live_refitd_lists(systemd_refitd):
    # Labelled families show on /metrics once they have a series: after an engine and a refit.
    systemd_refitd.start_engine()
    systemd_refitd.refit()
    code, text = systemd_refitd.get("/metrics")
    assert code == 200
    live = families_in_exposition(text)
    assert live == registered_families(), "the source scan and the live daemon disagree"
    exported = series_names(live)
    for where, expr in expressions():
        unknown = metric_names(expr) - exported
        assert not unknown, f"{where}: {sorted(unknown)} not on refitd's /metrics"


def test_every_family_is_on_the_dashboard():
    used = set().union(*(metric_names(e) for _, e in expressions()))
    for name, kind in registered_families().items():
        forms = series_names({name: kind})
        assert used & forms, f"{name} ({kind}) is exported but not on the dashboard"
