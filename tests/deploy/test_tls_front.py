"""deploy/tls/haproxy.cfg, used as shipped: a real haproxy terminating TLS for ``--admin-listen``.

A throwaway CA and server certificate are made with openssl (the commands of
deploy/tls/README.md); only the three documented values (bind port, PEM path, admin
listener) are substituted. haproxy must accept the file (``haproxy -c``), then an admin
write over HTTPS, verified against the throwaway CA, is served to an instance on the
instance port, and the answer carries HSTS. Every process is stopped by its PID.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from factories import new_id
from helpers import wait_for
from serve_process import ADMIN_TOKEN, client_at, free_port, serving, stop_process

TLS = Path(__file__).resolve().parents[2] / "deploy" / "tls"
BOUND = 20.0


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed (scripts/test installs it)")
    return found


def _run(*args: str, cwd: Path) -> str:
    done = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"
    return done.stdout + done.stderr


def _certificates(directory: Path) -> tuple[Path, Path]:
    """(the CA certificate, the server's PEM: certificate then key) for 127.0.0.1 and localhost."""
    openssl = _tool("openssl")
    _run(openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=imds-test-ca",
         "-keyout", "ca.key", "-out", "ca.pem", cwd=directory)
    _run(openssl, "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", "admin.key",
         "-out", "admin.csr", cwd=directory)
    (directory / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _run(openssl, "x509", "-req", "-in", "admin.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
         "-days", "2", "-extfile", "san.ext", "-out", "admin.crt", cwd=directory)
    pem = directory / "admin.pem"
    pem.write_text((directory / "admin.crt").read_text() + (directory / "admin.key").read_text())
    return directory / "ca.pem", pem


def _config(tmp_path: Path, pem: Path, tls_port: int, admin_port: int) -> Path:
    """The shipped file with its three documented values replaced (each must be there exactly once)."""
    text = (TLS / "haproxy.cfg").read_text()
    for shipped, here in (("    bind :8443 ssl", f"    bind 127.0.0.1:{tls_port} ssl"),
                          ("ssl crt /etc/imds/tls/admin.pem alpn h2,http/1.1\n", f"ssl crt {pem} alpn h2,http/1.1\n"),
                          ("server imds 127.0.0.1:9090", f"server imds 127.0.0.1:{admin_port}")):
        assert text.count(shipped) == 1, shipped
        text = text.replace(shipped, here)
    config = tmp_path / "haproxy.cfg"
    config.write_text(text)
    return config


@pytest.fixture
def tls_front(tmp_path: Path) -> Iterator[tuple[str, Path, int]]:
    """(https URL of the front, the CA to verify it, the admin port behind it); haproxy stopped by PID."""
    haproxy = _tool("haproxy")
    ca, pem = _certificates(tmp_path)
    tls_port, admin_port = free_port(), free_port()
    config = _config(tmp_path, pem, tls_port, admin_port)
    assert "Configuration file is valid" in _run(haproxy, "-c", "-f", str(config), cwd=tmp_path)
    log = (tmp_path / "haproxy.log").open("wb")
    process = subprocess.Popen([haproxy, "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        yield f"https://127.0.0.1:{tls_port}", ca, admin_port
    finally:
        stop_process(process)
        log.close()


def test_an_admin_write_over_tls_reaches_the_instance(tmp_path, tls_front):
    """HTTPS through the shipped front (CA-verified, HSTS) writes; the instance port serves it; plain HTTP fails."""
    url, ca, admin_port = tls_front
    with serving(tmp_path, "--admin-listen", f"127.0.0.1:{admin_port}") as imds:
        instance_id = new_id()
        body = {"id": instance_id, "ipAddresses": ["127.0.0.2"], "metadata": {"hostname": instance_id}}
        with httpx.Client(verify=ssl.create_default_context(cafile=str(ca)), timeout=10.0, trust_env=False,
                          headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as admin:
            answer = wait_for(lambda: admin.post(f"{url}/device-metadata", json=body), what="haproxy to accept",
                              timeout=BOUND, ignoring=(httpx.ConnectError,))  # haproxy may still be binding
            assert answer.status_code == 200, answer.text
            assert answer.json()["applied"] is True
            assert answer.headers["strict-transport-security"] == "max-age=63072000"
            assert answer.http_version == "HTTP/1.1"
        with client_at("127.0.0.2") as guest:
            assert guest.get(f"{imds.url}/metadata").json()["hostname"] == instance_id
        with httpx.Client(timeout=10.0, trust_env=False) as plain, pytest.raises(httpx.RemoteProtocolError):
            plain.get(url.replace("https://", "http://") + "/healthz")
