"""deploy/kubernetes/host-path: every manifest validates against the Kubernetes schemas (strict: unknown
fields are errors) of a pinned Kubernetes version, offline, with kubernetes-validate; the pieces
agree with each other (ports, probes, socket and shared-memory mounts, user, memory); and refitd
accepts the ConfigMap's configuration and model spec."""
import copy
import os
import subprocess
from pathlib import Path

import kubernetes_validate
import kubernetes_validate.version
import pytest
import yaml

from conftest import DEPLOY, deploy_config_for_test, need_refitd

KUBERNETES_VERSION = "1.31.0"
MANIFESTS = sorted((DEPLOY / "kubernetes/host-path").glob("*.yaml"))


def documents():
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path, doc


def resources():
    return {doc["kind"]: doc for _, doc in documents()}


def validate(doc):
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_pinned_version_is_available():
    schemas = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    assert (schemas / f"v{KUBERNETES_VERSION}-local-strict").is_dir(), (
        f"kubernetes-validate {kubernetes_validate.version.__version__} has no schemas for Kubernetes "
        f"{KUBERNETES_VERSION}: {sorted(os.listdir(schemas))}")


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs, f"{path} holds no resource"
    for doc in docs:
        validate(doc)


def test_validation_rejects_a_misspelled_field():
    bad = copy.deepcopy(resources()["Deployment"])
    pod = bad["spec"]["template"]["spec"]
    pod["initContainers"][0]["readinesProbe"] = pod["initContainers"][0].pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        validate(bad)


def containers(deployment):
    pod = deployment["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod.get("initContainers", []) + pod["containers"]}


def refitd_config():
    return yaml.safe_load(resources()["ConfigMap"]["data"]["refitd.yaml"])


def test_refitd_is_a_sidecar_of_the_engine():
    pod = resources()["Deployment"]["spec"]["template"]["spec"]
    sidecars = [c for c in pod.get("initContainers", []) if c.get("restartPolicy") == "Always"]
    assert [c["name"] for c in sidecars] == ["refitd"]
    assert [c["name"] for c in pod["containers"]] == ["engine"]
    engine = pod["containers"][0]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == engine["resources"]["requests"]["nvidia.com/gpu"]
    assert int(engine["resources"]["limits"]["nvidia.com/gpu"]) >= 1


def mounts_of(container):
    return {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}


def test_control_socket_and_shared_memory_are_shared():
    deployment = resources()["Deployment"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    cfg = refitd_config()
    assert cfg["listen"].startswith("unix:")
    socket_path = Path(cfg["listen"][len("unix:"):])
    for name, c in containers(deployment).items():
        mounts = mounts_of(c)
        # The socket lives in (a directory refitd creates in) an emptyDir both mount.
        mount = next((m for m in mounts if m != "/" and socket_path.is_relative_to(m)), None)
        assert mount, f"{name} mounts nothing that holds {socket_path}"
        assert "emptyDir" in volumes[mounts[mount]]
        # The engine's POSIX shm objects (files in /dev/shm) must be the same files for refitd.
        assert mounts.get("/dev/shm") == "dshm", f"{name} does not mount the shared /dev/shm"
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        assert env.get("REFITD_ADDRESS") == cfg["listen"], name
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert volumes["dshm"]["emptyDir"]["sizeLimit"]


def test_one_user_for_both_containers():
    """The engine creates its shm objects mode 0600: refitd needs the same uid to open them."""
    pod = resources()["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] and pod["securityContext"]["runAsNonRoot"]
    for name, c in containers(resources()["Deployment"]).items():
        assert "runAsUser" not in c.get("securityContext", {}), f"{name} overrides the Pod's user"


def test_admin_port_probes_annotations_and_service_agree():
    deployment = resources()["Deployment"]
    service = resources()["Service"]
    refitd = containers(deployment)["refitd"]
    port = int(refitd_config()["admin"]["listen"].rsplit(":", 1)[1])
    ports = {p["name"]: p["containerPort"] for p in refitd["ports"]}
    assert ports["admin"] == port
    assert refitd["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert refitd["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert refitd["startupProbe"]["httpGet"]["port"] == "admin"
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == port and annotations["prometheus.io/path"] == "/metrics"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    [service_port] = service["spec"]["ports"]
    assert service_port["targetPort"] == "admin" and service_port["port"] == port


def test_admin_port_is_admitted_from_monitoring_only():
    """The admin endpoint listens on the Pod's address without a token: only the monitoring
    namespace may reach it (the kubelet's probes come from the node, always admitted)."""
    policy = resources()["NetworkPolicy"]
    labels = resources()["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    by_port = {}
    for rule in policy["spec"]["ingress"]:
        for p in rule["ports"]:
            by_port[p["port"]] = rule.get("from")
    assert by_port["admin"] and all("namespaceSelector" in f for f in by_port["admin"]), by_port
    ports = {p["name"] for c in containers(resources()["Deployment"]).values() for p in c.get("ports", [])}
    assert set(by_port) <= ports and "http" in by_port


def quantity_bytes(q: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    for suffix, factor in units.items():
        if q.endswith(suffix):
            return int(q[: -len(suffix)]) * factor
    return int(q)


def test_refitd_memory_limit_covers_its_limits():
    refitd = containers(resources()["Deployment"])["refitd"]
    limits = refitd_config()["limits"]
    need = limits["staging_bytes"] + limits["bucket_bytes"] * limits["bucket_slots"]
    assert quantity_bytes(refitd["resources"]["limits"]["memory"]) >= need + (1 << 30)


def test_config_map_mounts_the_spec_where_the_config_names_it():
    deployment = resources()["Deployment"]
    refitd = containers(deployment)["refitd"]
    [config_mount] = [m for m in refitd["volumeMounts"] if m["name"] == "refitd-config"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    items = {i["key"]: i["path"] for i in volumes["refitd-config"]["configMap"]["items"]}
    assert volumes["refitd-config"]["configMap"]["name"] == resources()["ConfigMap"]["metadata"]["name"]
    mount = Path(config_mount["mountPath"])
    assert refitd["command"][-2:] == ["--config", str(mount / items["refitd.yaml"])]
    assert Path(refitd_config()["model_spec"]) == mount / items["demo-llama.yaml"]


def test_config_map_spec_is_the_deploy_model_spec():
    data = resources()["ConfigMap"]["data"]
    assert yaml.safe_load(data["demo-llama.yaml"]) == yaml.safe_load((DEPLOY / "models/demo-llama.yaml").read_text())


def test_refitd_accepts_the_config_map(tmp_path):
    data = resources()["ConfigMap"]["data"]
    spec = tmp_path / "demo-llama.yaml"
    spec.write_text(data["demo-llama.yaml"])
    config = deploy_config_for_test(data["refitd.yaml"], tmp_path, spec)
    p = subprocess.run([str(need_refitd()), "--config", str(config), "--print-config"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "model: demo-llama" in p.stdout
