"""A captured signed header is worth seconds: a real ``imds proxy`` and real ``imds serve`` processes.

The headers ``imds proxy`` sends are captured (the proxy forwards to a recording upstream,
as a host inside the trusted network could capture them), then replayed straight to
``imds serve`` from a trusted address: fresh, they work; once older than
``--proxy-signature-window`` (2 s here), serve refuses them as a bad signature (403). The
legacy, timeless signature of the id alone (a Neutron-style proxy's) is refused unless
``--accept-unstamped-signatures`` says otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from imds.signing import sign, sign_stamped
from proxy_process import proxying
from serve_process import Server, client_at, serving
from token_put_cases import recording_upstream

ALPHA = "8b2f0c1e-1b1d-4d8e-9f00-0000000000a1"
VM_A = "127.0.0.2"
SECRET = b"replay-test-shared-secret-77c1"
WINDOW = 2
IDENTITY = ("x-instance-id", "x-instance-id-timestamp", "x-instance-id-signature", "x-tenant-id")


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("replay")
    (base / "secret").write_bytes(SECRET + b"\n")
    (base / "map.txt").write_text(f"{VM_A} {ALPHA} tenant-a\n")
    return base


def _serve(base: Path, *extra: str) -> Iterator[Server]:
    args = ("--db", "memory://", "--trusted-proxy", "127.0.0.1/32", "--proxy-shared-secret-file",
            str(base / "secret"), "--proxy-signature-window", str(WINDOW), *extra)
    with serving(base, *args) as running:
        running.post("/device-metadata", {"id": ALPHA, "ipAddresses": ["10.83.0.1"],
                                          "metadata": {"id": ALPHA, "project_id": "tenant-a"}})
        yield running


@pytest.fixture(scope="module")
def server(base: Path) -> Iterator[Server]:
    yield from _serve(base)


@pytest.fixture(scope="module")
def lenient(base: Path) -> Iterator[Server]:
    yield from _serve(base, "--accept-unstamped-signatures")


def captured(base: Path) -> dict[str, str]:
    """The identity headers a real ``imds proxy`` sends for VM A right now."""
    with recording_upstream() as recorder:
        args = ("--upstream", recorder.url, "--shared-secret-file", str(base / "secret"), "--map",
                str(base / "map.txt"))
        with proxying(base, *args) as proxy, client_at(VM_A) as client:
            assert client.get(f"{proxy.url}/metadata").status_code == 200
        headers = {name: value for name, value in recorder.requests[-1] if name in IDENTITY}
    assert set(headers) == set(IDENTITY), headers
    return headers


def replay(server: Server, headers: dict[str, str]) -> httpx.Response:
    """``headers`` sent to serve from 127.0.0.1, a trusted proxy address."""
    with client_at("127.0.0.1") as client:
        return client.get(f"{server.url}/metadata", headers=headers)


def test_the_proxy_through_to_serve_works(base: Path, server: Server) -> None:
    """A VM behind the real proxy is served as itself: the proxy signs each request with the time."""
    args = ("--upstream", server.url, "--shared-secret-file", str(base / "secret"), "--map", str(base / "map.txt"))
    with proxying(base, *args) as proxy, client_at(VM_A) as client:
        answer = client.get(f"{proxy.url}/metadata")
    assert answer.status_code == 200, answer.text
    assert answer.json()["id"] == ALPHA


def test_a_captured_header_is_refused_once_older_than_the_window(base: Path, server: Server) -> None:
    headers = captured(base)
    fresh = replay(server, headers)
    assert fresh.status_code == 200, fresh.text  # within the window: the replay works (the accepted cost)
    assert fresh.json()["id"] == ALPHA
    stamp = int(headers["x-instance-id-timestamp"])
    deadline = time.monotonic() + WINDOW + 5
    while int(time.time()) - stamp <= WINDOW:  # wait for the clock, not for a guess
        assert time.monotonic() < deadline
        time.sleep(1)
    stale = replay(server, headers)
    assert stale.status_code == 403, stale.text
    assert f"more than {WINDOW} s" in stale.json()["message"]
    assert "proxy.stale_signature" in server.output()
    assert headers["x-instance-id-signature"] not in server.output()
    # Re-stamping the captured signature with the current time does not help: the time is signed.
    restamped = replay(server, {**headers, "x-instance-id-timestamp": str(int(time.time()))})
    assert restamped.status_code == 403
    assert "does not verify" in restamped.json()["message"]


def test_the_tenant_is_signed_too(base: Path, server: Server) -> None:
    """The captured header with its tenant changed or dropped no longer verifies."""
    headers = captured(base)
    for changed in ({**headers, "x-tenant-id": "tenant-b"}, {k: v for k, v in headers.items() if k != "x-tenant-id"}):
        assert replay(server, changed).status_code == 403


def test_an_unstamped_signature_needs_the_option(server: Server, lenient: Server) -> None:
    """The HMAC of the id alone (a Neutron-style proxy): 400 naming the timestamp header, unless accepted."""
    legacy = {"x-instance-id": ALPHA, "x-instance-id-signature": sign(SECRET, ALPHA)}
    refused = replay(server, legacy)
    assert refused.status_code == 400
    assert refused.json()["errors"][0]["field"] == "X-Instance-ID-Timestamp"
    accepted = replay(lenient, legacy)
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["id"] == ALPHA
    assert replay(lenient, {**legacy, "x-instance-id-signature": sign(b"other", ALPHA)}).status_code == 403
    # The option is about the legacy form only: a stamped header is held to the window even then.
    old = int(time.time()) - 3600
    stale = {"x-instance-id": ALPHA, "x-instance-id-timestamp": str(old),
             "x-instance-id-signature": sign_stamped(SECRET, ALPHA, old)}
    assert replay(lenient, stale).status_code == 403
