"""TLS on the TCP control plane (docs/security.md), with real processes: refitd, the example
engine and trainers, refitctl. Certificates are made at test time with the openssl CLI (a
throwaway CA, a second CA nobody trusts, server and client certificates); no key is committed."""
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import BIN, REFITD, wait_for

REFITCTL = BIN / "tools/refitctl"
TOKEN = "tls-test-token-0123456789abcdef"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


class Pki:
    """A CA and certificates it signs, in one directory."""

    def __init__(self, d: Path, name: str):
        self.d = d
        self.name = name
        self.ca = d / f"{name}-ca.crt"
        self.ca_key = d / f"{name}-ca.key"
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", self.ca_key, "-out", self.ca, "-days", "2", "-subj", f"/CN={name} test CA", cwd=d)

    def issue(self, cn: str, san: str | None = None):
        key = self.d / f"{self.name}-{cn}.key"
        csr = self.d / f"{self.name}-{cn}.csr"
        crt = self.d / f"{self.name}-{cn}.crt"
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key,
                "-out", csr, "-subj", f"/CN={cn}", cwd=self.d)
        args = ["x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.ca_key, "-CAcreateserial", "-out", crt,
                "-days", "2"]
        if san:
            ext = self.d / f"{self.name}-{cn}.ext"
            ext.write_text(f"subjectAltName={san}\n")
            args += ["-extfile", ext]
        openssl(*args, cwd=self.d)
        return crt, key


# The server certificate names 127.0.0.1 as a DNS entry too: kj-tls checks the expected server
# name as a DNS name (docs/security.md), and clients default to the host of the address.
SERVER_SAN = "DNS:localhost,DNS:127.0.0.1,IP:127.0.0.1"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    good = Pki(d, "good")
    other = Pki(d, "other")
    certs = {
        "ca": good.ca,
        "other_ca": other.ca,
        "server": good.issue("refitd", SERVER_SAN),
        "server_other": other.issue("refitd", SERVER_SAN),
        "client": good.issue("trainer"),
        "client_other": other.issue("trainer"),
    }
    both = d / "both-cas.crt"
    both.write_text(good.ca.read_text() + other.ca.read_text())
    certs["both_cas"] = both
    return certs


def tls_config(server, client_ca=None, token_file=None):
    crt, key = server
    cfg = f"tls:\n  cert: {crt}\n  key: {key}\n"
    if client_ca:
        cfg += f"  client_ca: {client_ca}\n"
    if token_file:
        cfg += f"access:\n  token_file: {token_file}\n"
    return cfg


def client_env(ca=None, cert=None, token=None, server_name=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REFIT_TLS_", "REFITD_TOKEN"))}
    if ca:
        env["REFIT_TLS_CA"] = str(ca)
    if cert:
        env["REFIT_TLS_CERT"], env["REFIT_TLS_KEY"] = str(cert[0]), str(cert[1])
    if token:
        env["REFITD_TOKEN"] = token
    if server_name:
        env["REFIT_TLS_SERVER_NAME"] = server_name
    return env


def token_file(tmp_path):
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o600)
    return f


def refitctl_status(node, env):
    return subprocess.run([str(REFITCTL), "status", "--address", node.address], capture_output=True, text=True,
                          env=env, timeout=60)


def assert_refit_ok(node, env):
    p, lines = node.trainer("--refits", "1", env=env)
    assert p.returncode == 0 and lines and lines[0]["outcome"] == "committed", p.stdout + p.stderr
    assert lines[0]["engine_matches_expected"], lines


def assert_refused(node, env, client_says, refitd_says):
    p, lines = node.trainer("--refits", "1", env=env, timeout=60)
    assert p.returncode != 0, p.stdout
    assert client_says in p.stderr, p.stderr
    if refitd_says:
        wait_for(lambda: refitd_says in node.log(), what=f"refitd logging {refitd_says!r}")


def test_refit_over_tls_with_token(fault_node, pki, tmp_path):
    good = client_env(ca=pki["ca"], token=TOKEN)
    node = fault_node(config=tls_config(pki["server"], token_file=token_file(tmp_path)),
                      listen=f"127.0.0.1:{free_port()}", env=good)
    assert "tls=on" in node.log()
    assert_refit_ok(node, good)
    st = refitctl_status(node, good)
    assert st.returncode == 0 and "engine:" in st.stdout, st.stderr

    # Inside TLS the token is still required.
    assert_refused(node, client_env(ca=pki["ca"], token="not-the-token-at-all"), "refitd",
                   'reason="wrong authentication token"')
    assert_refused(node, client_env(ca=pki["ca"]), "refitd", 'reason="no authentication token')
    # A client without TLS is told what is wrong, not just disconnected.
    assert_refused(node, client_env(token=TOKEN), "refitd requires TLS on this port: set REFIT_TLS_CA",
                   'reason="client did not start a TLS handshake')
    # A client that does not trust refitd's CA, or expects another name, stops at the handshake.
    assert_refused(node, client_env(ca=pki["other_ca"], token=TOKEN),
                   "certificate is not signed by a CA in REFIT_TLS_CA", None)
    assert_refused(node, client_env(ca=pki["ca"], token=TOKEN, server_name="wrong.example"),
                   "does not carry the name 'wrong.example'", None)
    st = refitctl_status(node, client_env(ca=pki["other_ca"], token=TOKEN))
    assert st.returncode != 0 and "not signed by a CA in REFIT_TLS_CA" in st.stderr, st.stderr

    # refitd still serves, and the engine (connected over TLS all along) got every commit.
    assert_refit_ok(node, client_env(ca=pki["ca"], token=TOKEN, server_name="localhost"))
    assert node.daemon.poll() is None
    assert node.resumed_versions() == [1, 2]
    report = node.stop()
    assert report["mixed"] == 0


def test_mutual_tls(fault_node, pki):
    # No token: the client certificate is the credential.
    good = client_env(ca=pki["ca"], cert=pki["client"])
    node = fault_node(config=tls_config(pki["server"], client_ca=pki["ca"]), listen=f"127.0.0.1:{free_port()}",
                      env=good)
    assert_refit_ok(node, good)

    assert_refused(node, client_env(ca=pki["ca"]), "refitd may require a client certificate, REFIT_TLS_CERT",
                   "peer did not return a certificate")
    assert_refused(node, client_env(ca=pki["ca"], cert=pki["client_other"]), "refitd",
                   'reason="TLS handshake failed')
    assert_refused(node, client_env(ca=pki["other_ca"], cert=pki["client"]),
                   "certificate is not signed by a CA in REFIT_TLS_CA", None)
    assert_refused(node, client_env(cert=pki["client"]), "REFIT_TLS_CERT is set but REFIT_TLS_CA is not", None)
    assert_refused(node, client_env(ca=pki["ca"], cert=(pki["client"][0], pki["server"][1])),
                   "does not belong to the certificate", None)

    assert_refit_ok(node, good)
    assert node.resumed_versions() == [1, 2]
    assert node.stop()["mixed"] == 0


def test_tls_client_against_plain_listener(fault_node, pki, tmp_path):
    plain = client_env(token=TOKEN)
    node = fault_node(config=f"access:\n  token_file: {token_file(tmp_path)}\n", listen=f"127.0.0.1:{free_port()}",
                      env=plain)
    assert_refused(node, client_env(ca=pki["ca"], token=TOKEN), "TLS handshake failed (does refitd listen with tls:",
                   'reason="client started a TLS handshake, but this listener has no tls: configured"')
    assert_refit_ok(node, plain)
    node.stop()


def test_stalled_clients_do_not_block_others(fault_node, pki, tmp_path):
    good = client_env(ca=pki["ca"], token=TOKEN)
    node = fault_node(config=tls_config(pki["server"], token_file=token_file(tmp_path)),
                      listen=f"127.0.0.1:{free_port()}", env=good)
    host, port = node.address.split(":")
    silent = socket.create_connection((host, int(port)))  # connects, sends nothing
    half = socket.create_connection((host, int(port)))
    half.sendall(b"\x16\x03\x01\x02\x00\x01\x00")  # the start of a ClientHello, then nothing
    try:
        assert_refit_ok(node, good)
        # Both are dropped at the handshake timeout, each with its reason.
        wait_for(lambda: node.log().count('reason="no authentication within 5000 ms"') >= 2, timeout=30,
                 what="stalled connections dropped")
        assert silent.recv(1) == b""
        assert half.recv(1) == b""
    finally:
        silent.close()
        half.close()
    assert_refit_ok(node, good)
    node.stop()


def test_certificate_rotation_on_sighup(fault_node, pki, tmp_path):
    # Files at fixed paths, rewritten in place as an operator (or cert-manager) would.
    crt, key = tmp_path / "server.crt", tmp_path / "server.key"
    crt.write_bytes(pki["server"][0].read_bytes())
    key.write_bytes(pki["server"][1].read_bytes())
    old = client_env(ca=pki["ca"], token=TOKEN)
    new = client_env(ca=pki["other_ca"], token=TOKEN)
    node = fault_node(config=tls_config((crt, key), token_file=token_file(tmp_path)),
                      listen=f"127.0.0.1:{free_port()}", env=client_env(ca=pki["both_cas"], token=TOKEN))
    assert_refit_ok(node, old)

    # A broken file is refused; the previous certificate stays in use.
    key.write_text("not a key\n")
    node.daemon.send_signal(signal.SIGHUP)
    wait_for(lambda: "event=tls_reload_failed" in node.log(), what="failed reload logged")
    assert_refit_ok(node, old)

    crt.write_bytes(pki["server_other"][0].read_bytes())
    key.write_bytes(pki["server_other"][1].read_bytes())
    node.daemon.send_signal(signal.SIGHUP)
    wait_for(lambda: "event=tls_reloaded" in node.log(), what="reload logged")
    assert_refit_ok(node, new)
    assert_refused(node, old, "certificate is not signed by a CA in REFIT_TLS_CA", None)
    # The engine's connection, opened under the old certificate, carried every commit.
    assert node.resumed_versions() == [1, 2, 3]
    assert node.stop()["mixed"] == 0


@pytest.mark.parametrize("case", ["key_mismatch", "unix_socket", "missing_cert", "ca_without_cert", "not_pem"])
def test_bad_tls_config_does_not_start(pki, tmp_path, case):
    crt, key = pki["server"]
    listen = f"127.0.0.1:{free_port()}"
    tf = token_file(tmp_path)
    cfg, want = {
        "key_mismatch": (tls_config((crt, pki["client"][1]), token_file=tf), "tls.key: the key in"),
        "unix_socket": (tls_config(pki["server"]), "TLS applies to a TCP listen address"),
        "missing_cert": (tls_config((tmp_path / "absent.crt", key), token_file=tf), "tls.cert: cannot read"),
        "ca_without_cert": (f"tls:\n  client_ca: {pki['ca']}\n", "tls.cert: is required"),
        "not_pem": (tls_config((tf, key), token_file=tf), "tls.cert: '"),
    }[case]
    if case == "unix_socket":
        listen = f"unix:{tmp_path / 'refitd.sock'}"
    (tmp_path / "refitd.yaml").write_text(f"listen: {listen}\n" + cfg)
    p = subprocess.run([str(REFITD), "--config", str(tmp_path / "refitd.yaml")], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 1, p.stderr
    assert want in p.stderr, p.stderr


def test_tcp_with_tls_but_no_client_credential_does_not_start(pki, tmp_path):
    # TLS alone authenticates refitd, not its clients: a token or client_ca is still required.
    (tmp_path / "refitd.yaml").write_text(f"listen: 127.0.0.1:{free_port()}\n" + tls_config(pki["server"]))
    p = subprocess.run([str(REFITD), "--config", str(tmp_path / "refitd.yaml")], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 1
    assert "set access.token_file (a shared secret) or tls.client_ca" in p.stderr, p.stderr
