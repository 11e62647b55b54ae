"""TLS to a remote ``imds serve``, both host paths: ``imds proxy`` and the agent's haproxy.

A real TLS endpoint (haproxy with the shipped ``deploy/tls/haproxy.cfg``, client certificates
required against a private CA) stands in front of a real ``imds serve``. The right CA and a
valid client certificate pass; the wrong CA, an expired client certificate or none at all fail
with a clear error (logged with OpenSSL's reason) and the VM gets 503 from its proxy: never
the record, never an answer read from a half-open connection. ``--upstream-insecure`` reads
through an unverified front and says so in the log.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import haproxy_user
from helpers import wait_for
from imds import log
from imds.agent.haproxy import Backend, Frontend, Process, render
from imds.agent.haproxyctl import Haproxy
from imds.agent.haproxyproc import process_of, upstream_of
from imds.agent.requestlog import RequestLog
from imds.config import load_agent
from proxy_process import proxying
from serve_process import Server, client_at, free_port, serving
from tls_front import Issued, Pki, tls_front

INSTANCE = "7c2f0c1e-1b1d-4d8e-9f00-0000000000c3"
HOSTNAME = "tls-vm"
VM = "127.0.0.2"
SECRET = b"upstream-tls-shared-secret"


@dataclass
class Stack:
    base: Path
    server: Server
    front: str  # https://localhost:PORT, client certificates required
    ca: Path  # the CA that signed the front's certificate and the clients'
    wrong_ca: Path
    client: Issued
    expired: Issued
    secret: Path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("tls")
    secret = base / "secret"
    secret.write_bytes(SECRET)
    good, wrong = Pki(base / "pki", "good"), Pki(base / "pki", "wrong")
    server_cert = good.issue("localhost", server=True)
    args = ("--db", "memory://", "--trusted-proxy", "127.0.0.1/32", "--proxy-shared-secret-file", str(secret))
    with serving(base, *args) as server:
        server.post("/device-metadata", {"id": INSTANCE, "ipAddresses": ["10.83.0.1"],
                                         "metadata": {"id": INSTANCE, "hostname": HOSTNAME}})
        with tls_front(base, server_cert, good.ca, server.url) as front:
            yield Stack(base, server, front, good.ca, wrong.ca, good.issue("host-a"),
                        good.issue("host-old", expired=True), secret)


# --- imds proxy -------------------------------------------------------------------------------------


def _proxy_read(stack: Stack, *tls: str) -> tuple[int, str, str]:
    """(status, body, proxy log) of one VM read through an ``imds proxy`` with these TLS flags."""
    mapfile = stack.base / "map"
    mapfile.write_text(f"{VM} {INSTANCE}\n")
    args = ("--upstream", stack.front, "--shared-secret-file", str(stack.secret), "--map", str(mapfile), *tls)
    with proxying(stack.base, *args) as proxy, client_at(VM) as client:
        answer = client.get(f"{proxy.url}/latest/meta-data/hostname", timeout=15.0)
        return answer.status_code, answer.text, proxy.output()


def test_proxy_with_the_private_ca_and_a_client_certificate_reads_through_tls(stack):
    """--upstream https://… with --upstream-ca-file and the client certificate: the VM reads its own record."""
    status, body, log = _proxy_read(stack, "--upstream-ca-file", str(stack.ca),
                                    "--upstream-cert-file", str(stack.client.cert),
                                    "--upstream-key-file", str(stack.client.key))
    assert (status, body) == (200, HOSTNAME)
    assert "upstream_insecure" not in log


@pytest.mark.parametrize(
    ("case", "reason"),
    [("wrong-ca", "certificate verify failed"), ("expired", "certificate expired"),
     ("no-cert", "certificate required")],
)
def test_proxy_refuses_a_bad_tls_setup_with_a_clear_error_and_serves_nothing(stack, case, reason):
    """The wrong CA, an expired or a missing client certificate: 503 with the proxy's own body, the reason logged."""
    flags = {
        "wrong-ca": ("--upstream-ca-file", str(stack.wrong_ca), "--upstream-cert-file", str(stack.client.pem)),
        "expired": ("--upstream-ca-file", str(stack.ca), "--upstream-cert-file", str(stack.expired.cert),
                    "--upstream-key-file", str(stack.expired.key)),
        "no-cert": ("--upstream-ca-file", str(stack.ca)),
    }[case]
    status, body, log = _proxy_read(stack, *flags)
    assert status == 503
    assert json.loads(body) == {"message": "metadata service unavailable"}
    assert HOSTNAME not in body
    failures = [json.loads(line) for line in log.splitlines() if "proxy.upstream_unavailable" in line]
    assert failures, log
    assert "TLS with the upstream failed" in failures[-1]["error"]
    assert reason in failures[-1]["error"].lower()


def test_proxy_insecure_switch_reads_through_an_unverified_front_and_warns(stack):
    """--upstream-insecure (with the wrong CA given, even) connects, and the start-up log says it is unverified."""
    status, body, log = _proxy_read(stack, "--upstream-insecure", "--upstream-cert-file", str(stack.client.pem))
    assert (status, body) == (200, HOSTNAME)
    assert "proxy.upstream_insecure" in log


def test_proxy_refuses_tls_files_with_a_plain_http_upstream(stack):
    """A CA file beside an http:// upstream is a mistake: the proxy refuses to start, naming the flag."""
    from serve_process import run_imds  # noqa: PLC0415 - only this test runs imds to completion

    done = run_imds(stack.base, "proxy", "--upstream", stack.server.url, "--shared-secret-file", str(stack.secret),
                    "--map", str(stack.base / "map"), "--upstream-ca-file", str(stack.ca))
    assert done.returncode != 0
    assert "--upstream-ca-file" in done.stderr
    assert "https://" in done.stderr


# --- the agent's haproxy ------------------------------------------------------------------------------


class _Lines:
    """Where the request log writes (a ``PrintLogger`` stand-in): its lines, parsed."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def msg(self, message: str) -> None:
        with self.lock:
            self.lines.append(json.loads(message))

    def requests(self) -> list[dict[str, Any]]:
        with self.lock:
            return [line for line in self.lines if line["event"] == "haproxy.request"]


def _agent_read(stack: Stack, name: str, *tls: str) -> tuple[int, str, dict[str, Any]]:
    """(status, body, its request-log line) of one VM read through the agent's haproxy with these TLS flags."""
    state = stack.base / f"agent-{name}"
    state.mkdir()
    settings = load_agent({}, {"IMDS_AGENT_UPSTREAM": stack.front, "IMDS_AGENT_SHARED_SECRET_FILE": str(stack.secret),
                               "IMDS_AGENT_STATE_DIR": str(state), "IMDS_AGENT_HAPROXY_USER": haproxy_user.ensure(),
                               **dict(zip(tls[::2], tls[1::2], strict=True))})
    lines = _Lines()
    requests = RequestLog(log.get("agent"), out=lines)
    process: Process = process_of(settings, requests.haproxy_end)
    haproxy = Haproxy("haproxy", state, SECRET, log_fd=requests.haproxy_end)
    port = free_port()
    text = render(Frontend(("127.0.0.1",), port=port), [Backend("tap-tls", (VM,), INSTANCE)], upstream_of(settings),
                  process)
    requests.start()
    try:
        haproxy.apply(text)
        with client_at(VM) as client:
            answer = client.get(f"http://127.0.0.1:{port}/latest/meta-data/hostname", timeout=15.0)
        [line] = wait_for(lines.requests, what="the request in haproxy's log", timeout=20)
    finally:
        haproxy.stop()
        requests.stop()
    return answer.status_code, answer.text, line


def test_agent_haproxy_verifies_serve_and_shows_its_client_certificate(stack):
    """Cert and key in two files (linked, never copied, beside each other for haproxy): the VM reads its record."""
    status, body, line = _agent_read(stack, "right", "IMDS_AGENT_UPSTREAM_CA_FILE", str(stack.ca),
                                     "IMDS_AGENT_UPSTREAM_CERT_FILE", str(stack.client.cert),
                                     "IMDS_AGENT_UPSTREAM_KEY_FILE", str(stack.client.key))
    assert (status, body) == (200, HOSTNAME)
    assert (line["instance_id"], line["status"], line["port"]) == (INSTANCE, 200, "tap-tls")
    assert (line["tenant"], line["tls_error"]) == ("", "")  # none: an empty string, not haproxy's "-"
    links = stack.base / "agent-right" / "tls"
    assert (links / "client.pem").resolve() == stack.client.cert.resolve()
    assert (links / "client.pem.key").resolve() == stack.client.key.resolve()
    assert not any(path.is_file() and not path.is_symlink() for path in links.iterdir())


@pytest.mark.parametrize("case", ["wrong-ca", "expired", "no-cert"])
def test_agent_haproxy_refuses_a_bad_tls_setup_and_logs_why(stack, case):
    """The wrong CA, an expired or no client certificate: the VM gets haproxy's 503, the request log says why."""
    flags = {
        "wrong-ca": ("IMDS_AGENT_UPSTREAM_CA_FILE", str(stack.wrong_ca),
                     "IMDS_AGENT_UPSTREAM_CERT_FILE", str(stack.client.pem)),
        "expired": ("IMDS_AGENT_UPSTREAM_CA_FILE", str(stack.ca), "IMDS_AGENT_UPSTREAM_CERT_FILE",
                    str(stack.expired.pem)),
        "no-cert": ("IMDS_AGENT_UPSTREAM_CA_FILE", str(stack.ca)),
    }[case]
    status, body, line = _agent_read(stack, case, *flags)
    assert status in (502, 503)
    assert HOSTNAME not in body
    assert line["instance_id"] == INSTANCE
    assert line["status"] == status
    assert line["termination"][0] == "S"  # haproxy's own words: the server side failed
    if case == "wrong-ca":
        assert "certificate verify failed" in line["tls_error"].lower()
