"""Installing refitd (docs/operations.md, "Install"): `cmake --install` into a temp prefix puts
every piece where cmake/install.cmake says, with units and configuration naming that prefix;
`cpack -G DEB` on the same (already built) tree makes a package with the right files, control
fields and runtime dependencies; deploy/container/Dockerfile copies only what exists and builds
the image the Kubernetes manifests run. Reuses the build tree: nothing is compiled here."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import BUILD, DEPLOY, SRC, need_refitd, need_tool

DOCKERFILE = DEPLOY / "container/Dockerfile"


def project_version() -> str:
    return re.search(r"project\(refitd VERSION (\S+)", (SRC / "CMakeLists.txt").read_text()).group(1)


def image_name() -> str:
    return f"registry.example.com/refitd:{project_version()}"


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    need_refitd()
    root = tmp_path_factory.mktemp("prefix") / "opt" / "refitd"
    p = subprocess.run([need_tool("cmake"), "--install", str(BUILD), "--prefix", str(root)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return root


def libdir(prefix: Path) -> Path:
    found = list(prefix.glob("lib*/**/librefit_client.so"))
    assert len(found) == 1, found
    return found[0].parent


def test_install_puts_every_piece_in_place(prefix):
    for rel in ["bin/refitd", "bin/refitctl"]:
        assert os.access(prefix / rel, os.X_OK), rel
    libdir(prefix)
    assert "refit_client_connect" in (prefix / "include/refit/c_api.h").read_text()
    assert (prefix / "share/refitd/python/pyproject.toml").is_file()
    assert (prefix / "share/refitd/python/refit/_native.py").is_file()
    assert not list((prefix / "share/refitd/python").rglob("__pycache__"))
    models = {p.name for p in (prefix / "share/refitd/models").glob("*.yaml")}
    assert models == {p.name for p in (DEPLOY / "models").glob("*.yaml")}
    assert (prefix / "share/refitd/deploy/kubernetes/host-path/deployment.yaml").is_file()
    assert (prefix / "share/doc/refitd/operations.md").is_file()
    assert (prefix / "etc/refitd/refitd.yaml").is_file()
    assert (prefix / "etc/refitd/models/demo-llama.yaml").is_file()


def test_installed_units_and_config_name_the_prefix(prefix):
    units = prefix / "lib/systemd/system"
    unit = (units / "refitd.service").read_text()
    assert f"ExecStart={prefix}/bin/refitd --config {prefix}/etc/refitd/refitd.yaml\n" in unit
    assert f"Documentation=file:{prefix}/share/doc/refitd/operations.md" in unit
    template = (units / "refitd@.service").read_text()
    assert f"ExecStart={prefix}/bin/refitd --config {prefix}/etc/refitd/%i.yaml " in template
    cfg = yaml.safe_load((prefix / "etc/refitd/refitd.yaml").read_text())
    assert cfg["model_spec"] == f"{prefix}/etc/refitd/models/demo-llama.yaml"


def test_installed_refitd_runs_the_installed_config(prefix, tmp_path):
    """The installed binary has no build-tree RPATH left and loads the installed config + spec."""
    cfg = yaml.safe_load((prefix / "etc/refitd/refitd.yaml").read_text())
    cfg["listen"] = f"unix:{tmp_path}/refitd.sock"
    (tmp_path / "refitd.yaml").write_text(yaml.safe_dump(cfg))
    p = subprocess.run([str(prefix / "bin/refitd"), "--config", str(tmp_path / "refitd.yaml"), "--print-config"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "model: demo-llama" in p.stdout, p.stdout + p.stderr
    readelf = subprocess.run(["readelf", "-d", str(prefix / "bin/refitd")], capture_output=True, text=True)
    assert str(BUILD) not in readelf.stdout, "the installed refitd still points into the build tree"


def test_python_package_installs_from_the_share_directory(prefix, tmp_path):
    """The documented `pip install PREFIX/share/refitd/python`, into a target dir, offline; the
    package then finds the installed librefit_client.so through REFIT_CLIENT_LIB."""
    # Offline (--no-index, --no-build-isolation) the interpreter needs pip, setuptools and wheel:
    # Debian's python3 with python3-pip has them.
    python = next((py for py in ["/usr/bin/python3", sys.executable] if subprocess.run(
        [py, "-c", "import setuptools, wheel, pip"], capture_output=True).returncode == 0), None)
    if python is None:
        pytest.skip("no python3 here has pip, setuptools and wheel (Debian: python3-pip)")
    source = tmp_path / "python"
    shutil.copytree(prefix / "share/refitd/python", source)  # pip builds in place; keep the prefix clean
    p = subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                        "--target", str(tmp_path / "site"), str(source)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"), REFIT_CLIENT_LIB=str(libdir(prefix) / "librefit_client.so"))
    q = subprocess.run([python, "-c", "import refit._native as n; print(n.ABI_VERSION); n.lib()"],
                       capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert q.returncode == 0, q.stdout + q.stderr


@pytest.fixture(scope="module")
def deb(tmp_path_factory):
    need_refitd()
    out = tmp_path_factory.mktemp("deb")
    # The test tree has failpoints compiled in; cpack refuses such a tree unless told it is a test.
    refused = subprocess.run([need_tool("cpack"), "-G", "DEB", "-B", str(out / "refused")], cwd=BUILD,
                             capture_output=True, text=True, timeout=300,
                             env={k: v for k, v in os.environ.items() if k != "REFIT_PACKAGE_TEST_BUILD"})
    p = subprocess.run([need_tool("cpack"), "-G", "DEB", "-B", str(out)], cwd=BUILD, capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, REFIT_PACKAGE_TEST_BUILD="1"))
    assert p.returncode == 0, p.stdout + p.stderr
    debs = list(out.glob("refitd_*.deb"))
    assert len(debs) == 1, (p.stdout, list(out.iterdir()))
    return debs[0], refused


def test_package_of_a_test_build_is_refused(deb):
    _, refused = deb
    if "REFIT_FAILPOINTS:BOOL=ON" not in (BUILD / "CMakeCache.txt").read_text():
        pytest.skip("this build tree has no failpoints: cpack has nothing to refuse")
    assert refused.returncode != 0 and "compiles failpoints in" in refused.stdout + refused.stderr


def test_package_files(deb):
    path, _ = deb
    listing = subprocess.run([need_tool("dpkg-deb"), "-c", str(path)], capture_output=True, text=True, check=True).stdout
    files = {line.split()[-1].lstrip(".") for line in listing.splitlines() if not line.startswith("d")}
    for f in ["/usr/bin/refitd", "/usr/bin/refitctl", "/usr/include/refit/c_api.h", "/usr/lib/systemd/system/refitd.service",
              "/usr/lib/systemd/system/refitd@.service", "/etc/refitd/refitd.yaml",
              "/etc/refitd/models/demo-llama.yaml", "/usr/share/refitd/python/pyproject.toml",
              "/usr/share/refitd/models/demo-llama.yaml", "/usr/share/doc/refitd/operations.md"]:
        assert f in files, f"{f} not in the package:\n{listing}"
    assert any(re.fullmatch(r"/usr/lib/(x86_64|aarch64)[-\w]*/librefit_client\.so|/usr/lib/librefit_client\.so", f)
               for f in files), listing
    assert not [f for f in files if f.startswith("/usr/etc") or f.startswith("/usr/local")], listing
    assert not [f for f in files if str(BUILD) in f or "install-stage" in f], listing


def control(path: Path) -> dict[str, str]:
    info = subprocess.run([need_tool("dpkg-deb"), "-f", str(path)], capture_output=True, text=True, check=True).stdout
    return dict(re.findall(r"^(\S+): (.*)$", info, re.M))


def test_package_control_and_scripts(deb, tmp_path):
    path, _ = deb
    subprocess.run([need_tool("dpkg-deb"), "-I", str(path)], capture_output=True, text=True, check=True)
    c = control(path)
    assert c["Package"] == "refitd" and c["Version"] == project_version()
    subprocess.run([need_tool("dpkg-deb"), "-e", str(path), str(tmp_path / "DEBIAN")], check=True)
    assert (tmp_path / "DEBIAN/conffiles").read_text().split() == ["/etc/refitd/refitd.yaml",
                                                                   "/etc/refitd/models/demo-llama.yaml"]
    assert "adduser --system" in (tmp_path / "DEBIAN/postinst").read_text()
    assert os.access(tmp_path / "DEBIAN/postinst", os.X_OK)
    unit = subprocess.run([need_tool("dpkg-deb"), "--fsys-tarfile", str(path)], capture_output=True, check=True).stdout
    assert b"ExecStart=/usr/bin/refitd --config /etc/refitd/refitd.yaml" in unit


def test_package_depends_on_every_shared_library_it_links(deb):
    """Each library the packaged binaries need directly (DT_NEEDED; ldd says where it resolves)
    belongs to a Debian package named in Depends (dpkg -S), so the package installs on a bare
    Debian 12 with what it pulls in; those packages bring their own dependencies."""
    path, _ = deb
    depends = {d.strip().split()[0] for d in control(path)["Depends"].split(",")}
    needed = {}
    for binary in [BUILD / "src/server/refitd", BUILD / "tools/refitctl", BUILD / "src/client/librefit_client.so"]:
        dynamic = subprocess.run(["readelf", "-d", str(binary)], capture_output=True, text=True, check=True).stdout
        sonames = set(re.findall(r"\(NEEDED\)\s+Shared library: \[(\S+)\]", dynamic))
        ldd = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
        resolved = dict(re.findall(r"^\s*(\S+) => (/\S+)", ldd, re.M))
        for soname in sonames - {s for s in sonames if s.startswith("ld-linux")}:  # the loader: libc6
            assert soname in resolved, f"{binary.name}: {soname} does not resolve:\n{ldd}"
            # CUDA and NCCL come from the CUDA toolkit (/usr/local/cuda), not from Debian: a CUDA
            # build's package needs them installed beside it (README, "Install").
            if os.path.realpath(resolved[soname]).startswith("/usr/local/cuda"):
                continue
            needed[soname] = resolved[soname]
    # dpkg knows a file by the path its package ships it at: /lib/... or /usr/lib/... (merged /usr).
    candidates = {}
    for soname, path in needed.items():
        for p in {path, os.path.realpath(path)}:
            for q in {p, p.removeprefix("/usr"), "/usr" + p if not p.startswith("/usr/") else p}:
                candidates[q] = soname
    owners = subprocess.run(["dpkg", "-S", *sorted(candidates)], capture_output=True, text=True)
    owned = {}
    for line in owners.stdout.splitlines():
        package, _, file = line.partition(": ")
        if file in candidates:
            owned.setdefault(candidates[file], set()).add(package.split(":")[0])
    missing = {s: sorted(owned.get(s, {"no Debian package owns it"})) for s in needed
               if not owned.get(s, set()) & depends}
    assert not missing, f"Depends ({sorted(depends)}) lacks: {missing}"


def cuda_build() -> bool:
    """Whether the build tree's refitd was built with CUDA (its --version says)."""
    p = subprocess.run([str(BUILD / "src/server/refitd"), "--version"], capture_output=True, text=True, timeout=30)
    return "cuda: yes" in p.stdout + p.stderr


def test_cuda_package_carries_its_runtime_and_needs_only_the_driver(deb, tmp_path):
    """A CUDA build's package holds the CUDA runtime and NCCL it was built with in
    /usr/lib[/<multiarch>]/refitd/, and the packaged binaries find them there by their RUNPATH
    before any other copy on the machine: unpacked into a scratch root, every CUDA library of
    refitd, refitctl and librefit_client.so resolves inside that root, except the driver."""
    if not cuda_build():
        pytest.skip("this build tree has no CUDA: its package carries no CUDA runtime")
    path, _ = deb
    root = tmp_path / "root"
    subprocess.run([need_tool("dpkg-deb"), "-x", str(path), str(root)], check=True)
    private = [p for p in root.glob("usr/lib/**/refitd") if p.is_dir() and list(p.glob("lib*.so*"))]
    assert len(private) == 1, list(root.rglob("refitd"))
    bundled = {p.name for p in private[0].iterdir()}
    assert any(n.startswith("libcudart.so.") for n in bundled), bundled
    if "REFIT_NCCL_LIBRARY:FILEPATH=/" in (BUILD / "CMakeCache.txt").read_text():
        assert any(n.startswith("libnccl.so.") for n in bundled), bundled
    client = next(root.glob("usr/lib/**/librefit_client.so"))
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    for binary in [root / "usr/bin/refitd", root / "usr/bin/refitctl", client]:
        ldd = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True, env=env).stdout
        resolved = dict(re.findall(r"^\s*(\S+) => (/\S+)", ldd, re.M))
        for soname, where in resolved.items():
            if soname.startswith(("libcudart", "libnccl")):
                assert Path(where).resolve().parent == private[0].resolve(), f"{binary.name}: {soname} => {where}"
    p = subprocess.run([str(root / "usr/bin/refitd"), "--version"], capture_output=True, text=True, env=env,
                       timeout=30)
    assert p.returncode == 0 and "refitd" in p.stdout + p.stderr, p.stdout + p.stderr


def dockerfile_instructions():
    yield from instructions(DOCKERFILE)


CUDA_DOCKERFILE = DEPLOY / "container/Dockerfile.cuda"


def instructions(path: Path):
    text = re.sub(r"\\\n", " ", path.read_text())
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            yield op.upper(), rest.strip()


def test_cuda_dockerfile_builds_a_cuda_package_on_debian_12_and_installs_it_alone():
    """The GPU image: the same sources copied as the host image, a CUDA build with NCCL packed
    with its runtime, and a runtime stage that is Debian 12 plus that package (the driver comes
    from the node), named as the GPU manifests name it."""
    ops = list(instructions(CUDA_DOCKERFILE))
    assert [r for o, r in ops if o == "FROM"] == ["debian:12 AS build", "debian:12"]
    assert [r for o, r in ops if o == "COPY"] == [r for o, r in dockerfile_instructions() if o == "COPY"]
    runs = " ".join(r for o, r in ops if o == "RUN")
    for flag in ["-DREFIT_TESTING=OFF", "-DREFIT_CUDA=ON", "-DREFIT_BUNDLE_CUDA_RUNTIME=ON", "cpack -G DEB"]:
        assert flag in runs, flag
    assert "libnccl-dev" in runs and "cuda-nvcc-" in runs
    runtime = runs[runs.rindex("apt-get update"):]
    assert "apt-get install -y --no-install-recommends /tmp/refitd_*.deb" in runtime
    assert "cuda" not in runtime.replace("/tmp/refitd_*.deb", "")  # nothing of CUDA but the package's
    images = set()
    for layout in ["colocated", "disaggregated", "node-tp8"]:
        for path in sorted((DEPLOY / "kubernetes" / layout).glob("*.yaml")):
            images |= set(re.findall(r"image: (\S*refitd\S*)", path.read_text()))
    assert images == {image_name() + "-cuda"}, images
    assert f"docker build -f deploy/container/Dockerfile.cuda -t {image_name()}-cuda ." in CUDA_DOCKERFILE.read_text()


def test_dockerfile_copies_only_what_exists():
    copies = [rest for op, rest in dockerfile_instructions() if op == "COPY"]
    assert copies
    for rest in copies:
        if rest.startswith("--from="):
            continue
        *sources, _dest = rest.split()
        for s in sources:
            assert (SRC / s).exists(), f"COPY {s}: not in the repository"
    # Everything the release build's CMake reads is copied.
    copied = {s.rstrip("/") for rest in copies if not rest.startswith("--from=") for s in rest.split()[:-1]}
    for d in ["CMakeLists.txt", "cmake", "proto", "src", "tools", "deploy", "python"]:
        assert d in copied, f"the build stage needs {d}"


def test_dockerfile_stages_build_a_release_package_and_install_it():
    froms = [rest for op, rest in dockerfile_instructions() if op == "FROM"]
    assert froms == ["debian:12 AS build", "debian:12"], froms
    runs = " ".join(rest for op, rest in dockerfile_instructions() if op == "RUN")
    assert "-DREFIT_TESTING=OFF" in runs and "cpack -G DEB" in runs
    assert "apt-get install -y --no-install-recommends /tmp/refitd_*.deb" in runs
    build_packages = set(re.findall(r"\b(lib[\w.+-]+-dev)\b", runs))
    assert {"libcapnp-dev", "libabsl-dev", "libyaml-cpp-dev", "libucx-dev"} <= build_packages, build_packages


def test_image_name_matches_the_manifests_and_readme():
    images = set()
    for path in sorted((DEPLOY / "kubernetes/host-path").glob("*.yaml")):
        images |= set(re.findall(r"image: (\S*refitd\S*)", path.read_text()))
    assert images == {image_name()}, images
    build_line = f"docker build -f deploy/container/Dockerfile -t {image_name()} ."
    assert build_line in DOCKERFILE.read_text()
    assert build_line in (SRC / "README.md").read_text()


def test_manifest_command_is_the_packaged_binary():
    deployment = yaml.safe_load((DEPLOY / "kubernetes/host-path/deployment.yaml").read_text())
    refitd = next(c for c in deployment["spec"]["template"]["spec"]["initContainers"] if c["name"] == "refitd")
    assert refitd["command"][0] == "/usr/bin/refitd"  # CPACK_PACKAGING_INSTALL_PREFIX /usr
    entry = [rest for op, rest in dockerfile_instructions() if op == "ENTRYPOINT"]
    assert entry == ['["/usr/bin/refitd"]']
