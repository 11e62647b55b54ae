"""A private PKI and a real TLS endpoint in front of ``imds serve`` that asks for client certificates.

``Pki`` issues certificates from a throwaway CA (``cryptography``, so a certificate can be made
already expired, which ``openssl req``/``x509`` cannot); ``tls_front`` runs haproxy with the
shipped ``deploy/tls/haproxy.cfg``, its client-certificate line switched on (``verify required
ca-file``), terminating TLS for ``localhost`` and forwarding to a plain upstream. Every process
is stopped by its PID.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from helpers import wait_for
from serve_process import free_port, stop_process

TLS = Path(__file__).resolve().parents[1] / "deploy" / "tls"
NAME = "localhost"  # the front's certificate names it (and 127.0.0.1)
DAY = dt.timedelta(days=1)


@dataclass(frozen=True)
class Issued:
    """A certificate and its key as PEM files (and both in one, as haproxy's ``crt`` takes them)."""

    cert: Path
    key: Path
    pem: Path


class Pki:
    """A CA under ``directory``, issuing server and client certificates."""

    def __init__(self, directory: Path, name: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.name = name
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"imds test CA {name}")])
        now = dt.datetime.now(dt.UTC)
        self._cert = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(self._key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - DAY).not_valid_after(now + 2 * DAY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.ca = directory / f"{name}-ca.pem"
        self.ca.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, common_name: str, *, server: bool = False, expired: bool = False) -> Issued:
        """A certificate for ``common_name`` (a server's for ``localhost``/127.0.0.1, or a client's)."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        start, end = (now - 3 * DAY, now - DAY) if expired else (now - DAY, now + 2 * DAY)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self._cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            names = [x509.DNSName(NAME), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        stem = self.directory / f"{self.name}-{common_name}"
        issued = Issued(stem.with_suffix(".crt"), stem.with_suffix(".key"), stem.with_suffix(".pem"))
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        issued.cert.write_bytes(cert_pem)
        issued.key.write_bytes(key_pem)
        issued.pem.write_bytes(cert_pem + key_pem)
        for path in (issued.key, issued.pem):
            path.chmod(0o600)
        return issued


def _front_config(directory: Path, server: Issued, clients_ca: Path, port: int, upstream: str) -> Path:
    """The shipped file, client certificates required, with its three documented values replaced."""
    text = (TLS / "haproxy.cfg").read_text()
    shipped_bind = "    bind :8443 ssl crt /etc/imds/tls/admin.pem alpn h2,http/1.1\n"
    client_bind = (f"    bind 127.0.0.1:{port} ssl crt {server.pem} alpn h2,http/1.1 "
                   f"verify required ca-file {clients_ca}\n")
    assert text.count(shipped_bind) == 1
    assert "verify required ca-file /etc/imds/tls/clients-ca.pem" in text  # the line the README points at
    text = text.replace(shipped_bind, client_bind)
    assert text.count("server imds 127.0.0.1:9090") == 1
    text = text.replace("server imds 127.0.0.1:9090", f"server imds {upstream.removeprefix('http://')}")
    config = directory / f"tls-front-{port}.cfg"
    config.write_text(text)
    return config


@contextmanager
def tls_front(
    directory: Path, server: Issued, clients_ca: Path, upstream: str, *, netns: str | None = None
) -> Iterator[str]:
    """A haproxy terminating TLS (client certificate required) in front of ``upstream``; yields its https URL.

    ``netns``: run it in that network namespace (on its loopback) instead of the host's.
    """
    haproxy = shutil.which("haproxy", path="/usr/sbin:/usr/bin:/sbin")
    if haproxy is None:
        pytest.fail("haproxy is not installed (scripts/test installs it)")
    port = free_port()
    config = _front_config(directory, server, clients_ca, port, upstream)
    checked = subprocess.run([haproxy, "-c", "-f", str(config)], capture_output=True, text=True, timeout=60,
                             check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    where = ["ip", "netns", "exec", netns] if netns else []
    with (directory / f"tls-front-{port}.log").open("wb") as log:
        process = subprocess.Popen([*where, haproxy, "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: _listening(port, netns), what="the TLS front", timeout=20, ignoring=(OSError,))
        yield f"https://{NAME}:{port}"
    finally:
        stop_process(process)


def _listening(port: int, netns: str | None) -> bool:
    if netns:
        ss = subprocess.run(["ip", "netns", "exec", netns, "ss", "-Hltn"], capture_output=True, text=True,
                            timeout=30, check=False)
        return f":{port} " in ss.stdout
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        return True
