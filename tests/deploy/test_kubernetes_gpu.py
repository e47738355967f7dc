"""deploy/kubernetes/{colocated,disaggregated,node-tp8}: the GPU layouts. Every manifest validates
offline against the Kubernetes 1.34 schemas (strict; resource.k8s.io/v1 ResourceClaimTemplates
are GA from 1.34) with kubernetes-validate; each Pod shares what its data path needs (one GPU
claim in every container that opens the GPUs, the PID namespace for CUDA IPC handles, the
control socket) and nothing more (no privileged container, no host namespaces, all capabilities
dropped, refitd's root file system read-only); and refitd itself accepts each layout's
configuration with its model spec and the model's config.json."""
import os
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from conftest import DEPLOY
from gpu_layouts import LLAMA3_SPEC, built_with_cuda, llama3_spec_with, refitd_check

KUBERNETES_VERSION = "1.34.0"
LAYOUTS = ["colocated", "disaggregated", "node-tp8"]
# The engine's tensor-parallel size where a layout serves the shipped spec unedited (its
# tensor_parallel.size is the engine's: the inference server's ranks register it).
ENGINE_TP = {"colocated": 1, "disaggregated": 2, "node-tp8": 8}  # the engine each layout runs
MANIFESTS = sorted(p for layout in LAYOUTS for p in (DEPLOY / "kubernetes" / layout).glob("*.yaml"))


def resources(layout):
    out = {}
    for path in sorted((DEPLOY / "kubernetes" / layout).glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                assert doc["kind"] not in out, f"{layout}: two {doc['kind']}s"
                out[doc["kind"]] = doc
    return out


def pod(layout):
    return resources(layout)["Deployment"]["spec"]["template"]["spec"]


def containers(layout):
    p = pod(layout)
    return {c["name"]: c for c in p.get("initContainers", []) + p["containers"]}


def refitd_config(layout):
    return yaml.safe_load(resources(layout)["ConfigMap"]["data"]["refitd.yaml"])


def test_pinned_version_is_available():
    schemas = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    assert (schemas / f"v{KUBERNETES_VERSION}-local-strict").is_dir(), sorted(os.listdir(schemas))


def test_every_layout_has_its_manifests():
    for layout in LAYOUTS:
        assert {"ConfigMap", "Deployment", "NetworkPolicy", "ResourceClaimTemplate"} <= set(resources(layout)), layout


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_manifest_validates(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_validation_rejects_a_misspelled_claim_field():
    bad = resources("colocated")["Deployment"]
    bad["spec"]["template"]["spec"]["resourceClaims"][0]["resourceClaimTemplateNam"] = "x"
    with pytest.raises(kubernetes_validate.ValidationError, match="resourceClaimTemplateNam"):
        kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_claim_is_shared_by_refitd_and_the_engine(layout):
    """Device-plugin GPUs go to one container; refitd opens the engine's GPUs through the claim
    both reference."""
    p = pod(layout)
    [claim] = p["resourceClaims"]
    template = resources(layout)["ResourceClaimTemplate"]
    assert claim["resourceClaimTemplateName"] == template["metadata"]["name"]
    [request] = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    cs = containers(layout)
    for name in ["refitd", "engine"] + (["trainer"] if "trainer" in cs else []):
        res = cs[name]["resources"]
        assert [c["name"] for c in res["claims"]] == [claim["name"]], name
        assert not any(k.startswith("nvidia.com/") for k in {**res.get("requests", {}), **res.get("limits", {})}), name
    tp = resources(layout)["ConfigMap"]["data"].get("llama3_fp8.yaml")
    spec = yaml.safe_load(tp) if tp else yaml.safe_load(LLAMA3_SPEC.read_text())
    size = spec["tensor_parallel"]["size"]
    if size == "engine":  # the shipped spec: the engine's ranks register its size, the layout's TP
        size = ENGINE_TP[layout]
    assert request["exactly"]["count"] == size, "one GPU per engine rank"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_no_privilege_beyond_the_pod(layout):
    p = pod(layout)
    assert p["shareProcessNamespace"] is True, "CUDA IPC handles open only in the exporter's PID namespace"
    for key in ("hostPID", "hostIPC", "hostNetwork"):
        assert not p.get(key), key
    assert p["securityContext"]["runAsNonRoot"] and p["securityContext"]["runAsUser"]
    for name, c in containers(layout).items():
        sc = c["securityContext"]
        assert not sc.get("privileged") and sc["allowPrivilegeEscalation"] is False, name
        assert sc["capabilities"] == {"drop": ["ALL"]}, name
        assert "runAsUser" not in sc, f"{name} overrides the Pod's user"
    assert containers(layout)["refitd"]["securityContext"]["readOnlyRootFilesystem"] is True
    assert not any("hostPath" in v for v in p["volumes"])


@pytest.mark.parametrize("layout", ["colocated", "node-tp8"])
def test_engine_registers_over_the_shared_unix_socket(layout):
    cfg = refitd_config(layout)
    assert cfg["listen"].startswith("unix:") and cfg["data_plane"]["transport"] == "cuda_ipc"
    socket = Path(cfg["listen"][len("unix:"):])
    volumes = {v["name"]: v for v in pod(layout)["volumes"]}
    for name, c in containers(layout).items():
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        mount = next(m for m in mounts if socket.is_relative_to(m))
        assert "emptyDir" in volumes[mounts[mount]], name
        assert {e["name"]: e["value"] for e in c["env"]}["REFITD_ADDRESS"] == cfg["listen"], name


def test_colocated_converts_in_place_and_tp8_stages_on_the_gpu():
    assert refitd_config("colocated")["staging"] == "direct" and refitd_config("colocated")["hold"] == 0
    # staging: direct is refused with engine ranks.
    assert refitd_config("node-tp8")["staging"] == "device"


def test_layout_specs_are_the_shipped_spec():
    # The shipped spec leaves the engine's size to its registration: one GPU or eight, the same file.
    for layout in ["colocated", "node-tp8"]:
        data = resources(layout)["ConfigMap"]["data"]
        assert yaml.safe_load(data["llama3_fp8.yaml"]) == llama3_spec_with({"size": "engine"}), layout
        refitd = containers(layout)["refitd"]
        [mount] = [m for m in refitd["volumeMounts"] if m["name"] == "refitd-config"]
        items = {i["key"]: i["path"] for i in next(v for v in pod(layout)["volumes"]
                                                   if v["name"] == "refitd-config")["configMap"]["items"]}
        assert Path(refitd_config(layout)["model_spec"]) == Path(mount["mountPath"]) / items["llama3_fp8.yaml"]
        assert refitd["command"][-2:] == ["--config", f"{mount['mountPath']}/{items['refitd.yaml']}"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_model_config_is_in_the_model_volume(layout):
    refitd = containers(layout)["refitd"]
    mounts = {m["mountPath"]: m for m in refitd["volumeMounts"]}
    model_config = Path(refitd_config(layout)["model_config"])
    assert model_config.name == "config.json"
    mount = next(m for m in mounts if model_config.is_relative_to(m))
    assert mounts[mount]["name"] == "models" and mounts[mount]["readOnly"]


def test_disaggregated_ports_policy_and_nccl_environment():
    cfg = refitd_config("disaggregated")
    assert cfg["data_plane"]["transport"] == "nccl" and cfg["staging"] == "device"
    assert cfg["access"]["token_file"], "a TCP control plane needs a token"
    port = int(cfg["listen"].rsplit(":", 1)[1])
    cs = containers("disaggregated")
    refitd = cs["refitd"]
    assert {p["name"]: p["containerPort"] for p in refitd["ports"]}["control"] == port
    # data_plane.host is the Pod's IP, filled in by the init container before refitd starts.
    assert cfg["data_plane"]["host"] == "@POD_IP@"
    init = [c["name"] for c in pod("disaggregated")["initContainers"]]
    assert init.index("config") < init.index("refitd")
    assert "@POD_IP@" in cs["config"]["command"][-1]
    env = {e["name"]: e.get("value") for e in refitd["env"]}
    assert env["NCCL_SOCKET_IFNAME"] and env["NCCL_SOCKET_FAMILY"] == "AF_INET"
    [sysctl] = pod("disaggregated")["securityContext"]["sysctls"]
    low, high = map(int, sysctl["value"].split())
    policy = resources("disaggregated")["NetworkPolicy"]
    [trainers] = [r for r in policy["spec"]["ingress"] if r.get("from") and "podSelector" in r["from"][0]]
    ports = {(p["port"], p.get("endPort")) for p in trainers["ports"]}
    assert ports == {("control", None), (low, high)}, ports
    service = resources("disaggregated")["Service"]
    assert service["spec"]["clusterIP"] == "None"
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {"control", "admin"}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_refitd_accepts_the_layout_config(layout, tmp_path):
    cfg = refitd_config(layout)
    data = resources(layout)["ConfigMap"]["data"]
    spec_text = data.get("llama3_fp8.yaml") or LLAMA3_SPEC.read_text()
    if cfg["data_plane"].get("host") == "@POD_IP@":
        cfg["data_plane"]["host"] = "10.0.0.11"
    p = refitd_check(cfg, tmp_path, spec_text)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "model: llama3-fp8" in p.stdout


def test_refitd_rejects_a_misspelled_data_plane_key(tmp_path):
    cfg = refitd_config("colocated")
    cfg["data_plane"]["cuda_ipc_sokcet"] = cfg["data_plane"].pop("cuda_ipc_socket")
    spec = resources("colocated")["ConfigMap"]["data"]["llama3_fp8.yaml"]
    if not built_with_cuda():  # the source check of the transport's keys refuses it
        with pytest.raises(AssertionError, match="cuda_ipc_sokcet"):
            refitd_check(cfg, tmp_path, spec)
        return
    p = refitd_check(cfg, tmp_path, spec)
    assert p.returncode == 1 and "cuda_ipc_sokcet" in p.stderr
