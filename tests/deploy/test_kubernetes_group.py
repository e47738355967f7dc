"""deploy/kubernetes/group-two-node: an engine whose ranks span two nodes, one refitd sidecar per
node, the two members of one engine group. Every manifest validates offline (strict) against the
pinned Kubernetes schemas; the pieces agree (one Pod per node, the member index from the Pod
index into the configuration, the headless Service publishing members that are not ready, the
ports); and refitd accepts the configuration as the init container renders it for each member."""
import subprocess

import kubernetes_validate
import pytest
import yaml

from conftest import DEPLOY, need_refitd

KUBERNETES_VERSION = "1.31.0"
LAYOUT = DEPLOY / "kubernetes/group-two-node"
MANIFESTS = sorted(LAYOUT.glob("*.yaml"))


def resources():
    out = {}
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                assert doc["kind"] not in out, doc["kind"]
                out[doc["kind"]] = doc
    return out


def pod():
    return resources()["StatefulSet"]["spec"]["template"]["spec"]


def containers():
    p = pod()
    return {c["name"]: c for c in p.get("initContainers", []) + p["containers"]}


def rendered(member: int, pod_ip: str) -> dict:
    """refitd.yaml as the init container `config` writes it for the Pod of index `member`."""
    text = resources()["ConfigMap"]["data"]["refitd.yaml"]
    return yaml.safe_load(text.replace("@POD_IP@", pod_ip).replace("@MEMBER@", str(member)))


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_one_member_per_node_and_as_many_pods_as_members():
    sts = resources()["StatefulSet"]
    assert sts["spec"]["replicas"] == rendered(0, "10.1.0.5")["group"]["members"] == 2
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    [term] = pod()["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()


def test_the_member_index_is_the_pod_index():
    config = containers()["config"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in config["env"]}
    assert env["MEMBER"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    assert env["POD_IP"] == "status.podIP"
    assert "s/@MEMBER@/${MEMBER}/" in config["command"][-1]
    refitd = containers()["refitd"]
    assert refitd["command"][-2:] == ["--config", "/run/refitd-config/refitd.yaml"]
    assert refitd.get("restartPolicy") == "Always"
    for m in (0, 1):
        g = rendered(m, "10.1.0.5")["group"]
        assert g["member"] == m and g["name"] == "engine-a"


def test_the_service_names_every_member_even_when_not_ready():
    svc = resources()["Service"]
    sts = resources()["StatefulSet"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    ports = {p["name"]: p["containerPort"] for p in containers()["refitd"]["ports"]}
    cfg = rendered(0, "10.1.0.5")
    assert ports["control"] == int(cfg["listen"].rsplit(":", 1)[1])
    assert ports["admin"] == int(cfg["admin"]["listen"].rsplit(":", 1)[1])
    assert {p["targetPort"] for p in svc["spec"]["ports"]} == {"control", "admin"}
    assert containers()["refitd"]["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    # Late join: every member's address, in member order, is the Pod of that index behind this
    # Service, on the control port.
    name, members = sts["metadata"]["name"], cfg["group"]["members"]
    assert cfg["group"]["addresses"] == [f"{name}-{i}.{svc['metadata']['name']}:{ports['control']}"
                                         for i in range(members)]


def test_group_members_keep_versions_and_use_a_token():
    cfg = rendered(1, "10.1.0.6")
    assert cfg["hold"] >= 1 and cfg["access"]["token_file"]
    assert cfg["data_plane"]["host"] == "10.1.0.6"


@pytest.mark.parametrize("member", [0, 1])
def test_refitd_accepts_each_rendered_member(member, tmp_path):
    cfg = rendered(member, "127.0.0.1")
    spec = tmp_path / "demo-llama.yaml"
    spec.write_text(resources()["ConfigMap"]["data"]["demo-llama.yaml"])
    cfg["model_spec"] = str(spec)
    cfg["listen"] = f"unix:{tmp_path / 'refitd.sock'}"
    cfg.pop("access")
    cfg["admin"] = {"listen": "127.0.0.1:0"}
    path = tmp_path / "refitd.yaml"
    path.write_text(yaml.safe_dump(cfg))
    p = subprocess.run([str(need_refitd()), "--config", str(path), "--print-config"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "model: demo-llama" in p.stdout


def test_config_map_spec_is_the_deploy_model_spec():
    data = resources()["ConfigMap"]["data"]
    assert yaml.safe_load(data["demo-llama.yaml"]) == yaml.safe_load((DEPLOY / "models/demo-llama.yaml").read_text())
