"""The agent's haproxy config, run by a real haproxy on loopback, in front of a real ``imds serve``.

The config is ``imds.agent.haproxy.render``'s, with the frontend on 127.0.0.1 and the "VMs"
at 127.0.0.2 and 127.0.0.3 (clients bound to those addresses; the OVS rewrite that puts a
VM there is ``test_agent_serve.py``'s business). A second haproxy forwards to an upstream
that records every header it received, to see exactly what serve would be told.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from imds.agent.haproxy import Backend, Frontend, Upstream, render
from imds.agent.haproxyctl import Haproxy
from imds.services.identity.tokens import FORWARDING_HEADERS
from imds.signing import sign, sign_stamped
from serve_process import Server, client_at, free_port, serving
from token_put_cases import (
    FORWARDING,
    OTHER_PATHS,
    TTL,
    WIRE_TOKEN_PATHS,
    Recorder,
    assert_answers_as_serve,
    put,
    recording_upstream,
)

ALPHA = "7a2f0c1e-1b1d-4d8e-9f00-0000000000a1"
BETA = "7a2f0c1e-1b1d-4d8e-9f00-0000000000b2"
VM_A, VM_B = "127.0.0.2", "127.0.0.3"
SECRET = b"agent-haproxy-test-secret"


class Front:
    """A running haproxy with the agent's config: where the VMs reach it."""

    def __init__(self, haproxy: Haproxy, port: int) -> None:
        self.haproxy = haproxy
        self.port = port
        self.url = f"http://127.0.0.1:{port}"


def _haproxy(state: Path, upstream: str) -> Iterator[Front]:
    binary = shutil.which("haproxy", path="/usr/sbin:/usr/bin:/sbin")
    if binary is None:
        pytest.fail("haproxy is not installed: scripts/test installs it")
    state.mkdir()
    port = free_port()
    backends = [Backend("tap-a", (VM_A,), ALPHA, "tenant-a"), Backend("tap-b", (VM_B,), BETA)]
    haproxy = Haproxy(binary, state, SECRET)
    haproxy.apply(render(Frontend(("127.0.0.1",), port=port), backends, Upstream.parse(upstream)))
    try:
        yield Front(haproxy, port)
    finally:
        haproxy.stop()


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("haproxy")


@pytest.fixture(scope="module")
def server(base: Path) -> Iterator[Server]:
    secret = base / "secret"
    secret.write_bytes(SECRET)
    args = ("--db", "memory://", "--trusted-proxy", "127.0.0.1/32", "--proxy-shared-secret-file", str(secret))
    with serving(base, *args) as running:
        for instance_id, ip, extra in ((ALPHA, "10.82.0.1", {"project_id": "tenant-a"}), (BETA, "10.82.0.2", {})):
            running.post("/device-metadata", {"id": instance_id, "ipAddresses": [ip],
                                              "metadata": {"id": instance_id, **extra}})
        yield running


@pytest.fixture(scope="module")
def front(base: Path, server: Server) -> Iterator[Front]:
    yield from _haproxy(base / "serve-state", server.url)


@pytest.fixture(scope="module")
def recorded(base: Path) -> Iterator[tuple[Front, Recorder]]:
    with recording_upstream() as recorder:
        for front in _haproxy(base / "recorder-state", recorder.url):
            yield front, recorder


def test_vm_sent_identity_and_forwarding_headers_never_reach_serve(recorded: tuple[Front, Recorder]) -> None:
    """VM A forges B's signed id, a tenant and every forwarding header: upstream sees A's id and none of them."""
    front, recorder = recorded
    now = int(time.time())
    forged = [("X-Instance-ID", BETA), ("X-Instance-ID-Timestamp", str(now - 3600)),
              ("X-Instance-ID-Signature", sign_stamped(SECRET, BETA, now, "tenant-b")), ("X-Tenant-ID", "tenant-b"),
              ("X-Forwarded-For", "10.82.0.2"), ("x-forwarded-for", "10.82.0.3"), *FORWARDING, ("X-Kept", "yes")]
    for vm, instance_id, tenant in ((VM_A, ALPHA, ["tenant-a"]), (VM_B, BETA, [])):
        with client_at(vm) as client:
            answer = client.get(f"{front.url}/latest/meta-data/instance-id", headers=forged)
        assert (answer.status_code, answer.text) == (200, "ok")
        assert recorder.last("x-instance-id") == [instance_id]
        [stamp] = recorder.last("x-instance-id-timestamp")  # haproxy's own clock, one copy
        assert abs(int(stamp) - time.time()) < 5
        signature = sign_stamped(SECRET, instance_id, int(stamp), tenant[0] if tenant else None)
        assert recorder.last("x-instance-id-signature") == [signature]
        assert recorder.last("x-tenant-id") == tenant
        assert recorder.last("x-kept") == ["yes"]  # the recorder sees the VM's other headers
        for name in FORWARDING_HEADERS:
            assert recorder.last(name) == [], name
        assert [name for name, _ in recorder.requests[-1] if name.startswith("x-forwarded-")] == []


def test_haproxy_signs_every_request_anew_and_serve_accepts_it(front: Front, server: Server) -> None:
    """The per-request HMAC haproxy computes verifies on serve (which accepts no unstamped signature), tenant and all.

    The id alone, signed as before (what a leaked pre-stamp config held), is refused by serve.
    """
    for vm, instance_id in ((VM_A, ALPHA), (VM_B, BETA)):
        with client_at(vm) as client:
            answer = client.get(f"{front.url}/latest/meta-data/instance-id")
        assert (answer.status_code, answer.text) == (200, instance_id)
    with client_at("127.0.0.1") as client:  # a trusted peer replaying the old, timeless header
        legacy = client.get(f"{server.url}/metadata",
                            headers={"X-Instance-ID": ALPHA, "X-Instance-ID-Signature": sign(SECRET, ALPHA)})
    assert legacy.status_code == 400
    assert legacy.json()["errors"][0]["field"] == "X-Instance-ID-Timestamp"


def test_after_a_reload_haproxy_still_signs_with_the_key(base: Path, server: Server) -> None:
    """The master re-executes itself on reload: the key in its environment survives, and serve accepts."""
    for front in _haproxy(base / "reload-state", server.url):
        text = front.haproxy.current
        assert text is not None
        workers = front.haproxy.workers()
        assert front.haproxy.apply(text.replace("# Written by imds agent", "# Written again by imds agent"))
        assert front.haproxy.workers() != workers  # a new worker, from the re-executed master
        with client_at(VM_A) as client:
            answer = client.get(f"{front.url}/latest/meta-data/instance-id")
        assert (answer.status_code, answer.text) == (200, ALPHA)


def test_a_forged_x_forwarded_for_gets_the_vm_its_own_record(front: Front) -> None:
    """B's address in X-Forwarded-For from VM A: serve still answers A's own record."""
    for vm, instance_id, other in ((VM_A, ALPHA, "10.82.0.2"), (VM_B, BETA, "10.82.0.1")):
        with client_at(vm) as client:
            answer = client.get(f"{front.url}/latest/meta-data/instance-id", headers={"X-Forwarded-For": other})
        assert (answer.status_code, answer.text) == (200, instance_id)


@pytest.mark.parametrize("path", WIRE_TOKEN_PATHS + OTHER_PATHS)
@pytest.mark.parametrize(("name", "value"), FORWARDING)
def test_a_token_put_through_haproxy_answers_what_serve_answers(
    front: Front, server: Server, name: str, value: str, path: str
) -> None:
    """Any forwarding header, any spelling of the path: haproxy refuses as serve does, or serve itself answers."""
    assert_answers_as_serve(front.port, int(server.url.rsplit(":", 1)[1]), (name, value), path, VM_A)


@pytest.mark.parametrize("path", WIRE_TOKEN_PATHS)
def test_without_a_forwarding_header_every_token_path_mints_for_the_vm(front: Front, path: str) -> None:
    """The refusal is the header's doing: the same PUTs without one mint a token bound to the VM."""
    status, _, token = put("127.0.0.1", front.port, path, {TTL: "60"}, VM_B)
    assert status == 200
    with client_at(VM_B) as client:
        read = client.get(f"{front.url}/latest/meta-data/instance-id",
                          headers={"X-aws-ec2-metadata-token": token.decode()})
    assert (read.status_code, read.text) == (200, BETA)
