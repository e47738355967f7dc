"""Shared by test_kubernetes_gpu.py and test_systemd_gpu.py: refitd's own check of a deploy
configuration for the GPU layouts (refitd --print-config loads the configuration, the model spec
and the model's config.json, and exits)."""
import re
import subprocess
from pathlib import Path

import yaml

from conftest import BUILD, DEPLOY, SRC, need_refitd

# The served model's config.json, as the deploy configurations name it in the engine's model
# volume; the repository holds the real one.
MODEL_CONFIG = SRC / "tests/models/Meta-Llama-3-8B/config.json"
LLAMA3_SPEC = DEPLOY / "models/llama3_fp8.yaml"


def transport_keys() -> dict[str, set[str]]:
    """transport name -> its own data_plane keys, read from the descriptors' source."""
    keys = {}
    for path in sorted((SRC / "src/transport").glob("*/*_transport.cc")):
        text = path.read_text()
        name = re.search(r'd\.name = "(\w+)";', text)
        if name:
            keys[name.group(1)] = set(re.findall(r'\{"(\w+)",', "".join(re.findall(r"d\.config_keys = \{(.*?)\};", text,
                                                                                     re.S))))
    return keys


def llama3_spec_with(tensor_parallel: dict) -> dict:
    spec = yaml.safe_load(LLAMA3_SPEC.read_text())
    spec["tensor_parallel"] = tensor_parallel
    return spec


def built_with_cuda() -> bool:
    cache = BUILD / "CMakeCache.txt"
    return cache.is_file() and re.search(r"^REFIT_CUDA:BOOL=ON$", cache.read_text(), re.M) is not None


def refitd_check(config: dict, tmp: Path, spec_text: str) -> subprocess.CompletedProcess:
    """refitd --print-config on `config` with its files moved into `tmp`: the model spec (text),
    the model's config.json, a Unix socket in tmp. The data plane, staging, limits and every
    other key keep their deploy values. A build without CUDA has no nccl or cuda_ipc transport:
    there the transport (and the GPU staging it needs) is checked against the descriptors'
    source instead, and the rest by refitd with ucx and staging: host."""
    cfg = dict(config)
    spec = tmp / "spec.yaml"
    spec.write_text(spec_text)
    cfg["model_spec"] = str(spec)
    cfg["model_config"] = str(MODEL_CONFIG)
    if cfg["listen"].startswith("unix:"):
        cfg["listen"] = f"unix:{tmp / 'refitd.sock'}"
    cfg["admin"] = {**cfg.get("admin", {}), "listen": "127.0.0.1:0"}
    dp = dict(cfg["data_plane"])
    if dp.get("cuda_ipc_socket"):
        dp["cuda_ipc_socket"] = str(tmp / "cuda-ipc.sock")
    cfg["data_plane"] = dp
    if not built_with_cuda():
        keys = transport_keys()
        assert dp["transport"] in keys, f"{dp['transport']} is no transport of src/transport ({sorted(keys)})"
        extra = set(dp) - {"transport", "host", "device"} - keys[dp["transport"]]
        assert not extra, f"data_plane keys {extra} are not {dp['transport']}'s"
        print(f"refitd built without CUDA: data_plane.transport {dp['transport']} checked against the source; "
              "refitd checks the rest with ucx and staging: host")
        cfg["data_plane"] = {"transport": "ucx", "host": "127.0.0.1"}
        cfg["staging"] = "host"
    path = tmp / "refitd.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return subprocess.run([str(need_refitd()), "--config", str(path), "--print-config"], capture_output=True, text=True,
                          timeout=60)
