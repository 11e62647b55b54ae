"""A real ``imds proxy`` in front of a real ``imds serve``, on loopback with distinct source addresses.

The proxy listens on 127.0.0.1; "VMs" are clients bound to 127.0.0.2 and 127.0.0.3 (mapped
to two instances whose own addresses are elsewhere, so only the signed id can find them).
``imds serve`` trusts 127.0.0.1/32 (the proxy's source address) and shares its secret.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers import wait_for
from imds.services.identity.tokens import FORWARDING_HEADERS
from imds.signing import sign_stamped
from proxy_process import Proxy, proxying
from serve_process import Server, client_at, free_port, run_imds, serving
from token_put_cases import (
    FORWARDING,
    OTHER_PATHS,
    WIRE_TOKEN_PATHS,
    assert_answers_as_serve,
    put,
    recording_upstream,
)

ALPHA = "6a2f0c1e-1b1d-4d8e-9f00-0000000000a1"
BETA = "6a2f0c1e-1b1d-4d8e-9f00-0000000000b2"
VM_A, VM_B, UNKNOWN = "127.0.0.2", "127.0.0.3", "127.0.0.4"
SECRET = b"proxy-test-shared-secret-3f9a"
TTL = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN = "X-aws-ec2-metadata-token"


def write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("proxy")
    return {
        "base": base,
        "secret": write(base / "secret", SECRET + b"\n"),
        # Plain-lines format: ADDRESS INSTANCE_ID [TENANT_ID].
        "map": write(base / "map.txt", f"# test VMs\n{VM_A} {ALPHA} tenant-a\n{VM_B} {BETA}\n"),
    }


@pytest.fixture(scope="module")
def server(files: dict[str, Path]) -> Iterator[Server]:
    args = ("--db", "memory://", "--trusted-proxy", "127.0.0.1/32", "--proxy-shared-secret-file", str(files["secret"]))
    with serving(files["base"], *args) as running:
        for instance_id, hostname, ip, extra in (
            (ALPHA, "alpha", "10.81.0.1", {"project_id": "tenant-a"}),
            (BETA, "beta", "10.81.0.2", {}),
        ):
            metadata = {"id": instance_id, "hostname": hostname, **extra}
            running.post("/device-metadata", {"id": instance_id, "ipAddresses": [ip], "metadata": metadata})
            running.post("/device-userdata", {"id": instance_id, "ipAddresses": [ip], "userdata": f"ud-{hostname}"})
        yield running


@pytest.fixture(scope="module")
def proxy(files: dict[str, Path], server: Server) -> Iterator[Proxy]:
    args = ("--upstream", server.url, "--shared-secret-file", str(files["secret"]), "--map", str(files["map"]))
    with proxying(files["base"], *args) as running:
        yield running


def vm(source: str, proxy: Proxy, method: str, path: str, **kwargs: Any) -> httpx.Response:
    with client_at(source) as client:
        return client.request(method, f"{proxy.url}{path}", **kwargs)


@pytest.mark.parametrize(
    ("path", "read"),
    [
        ("/metadata", lambda r: r.json()["id"]),
        ("/latest/meta-data/instance-id", lambda r: r.text),
        ("/openstack/latest/meta_data.json", lambda r: r.json()["uuid"]),
        ("/nocloud/meta-data", lambda r: r.text.split("instance-id: ", 1)[1].split()[0]),
    ],
)
def test_each_vm_gets_its_own_record_in_every_flavor(proxy: Proxy, path: str, read: Any) -> None:
    answers = {source: vm(source, proxy, "GET", path) for source in (VM_A, VM_B)}
    assert [a.status_code for a in answers.values()] == [200, 200], {s: a.text for s, a in answers.items()}
    assert read(answers[VM_A]) == ALPHA
    assert read(answers[VM_B]) == BETA


def test_userdata_and_head_pass_through(proxy: Proxy) -> None:
    assert vm(VM_B, proxy, "GET", "/latest/user-data").text == "ud-beta"
    head = vm(VM_A, proxy, "HEAD", "/metadata")
    assert head.status_code == 200
    assert head.content == b""
    assert int(head.headers["content-length"]) == len(vm(VM_A, proxy, "GET", "/metadata").content)


def test_forged_identity_headers_from_the_vm_are_overwritten(proxy: Proxy) -> None:
    """VM A sends B's id with B's *valid* signature, and B's address in every forwarding header: it gets A."""
    now = int(time.time())
    forged = {
        "X-Instance-ID": BETA,
        "X-Instance-ID-Timestamp": str(now),
        "X-Instance-ID-Signature": sign_stamped(SECRET, BETA, now),
        "X-Tenant-ID": "tenant-b",
        "X-Forwarded-For": "10.81.0.2",
        "Forwarded": "for=10.81.0.2",
        "X-Real-IP": "10.81.0.2",
    }
    answer = vm(VM_A, proxy, "GET", "/metadata", headers=forged)
    assert answer.status_code == 200, answer.text
    assert answer.json()["id"] == ALPHA


def test_identity_and_forwarding_headers_the_vm_sent_never_reach_upstream(files: dict[str, Path]) -> None:
    """What upstream receives: the proxy's one id, signature, tenant and X-Forwarded-For, none of the VM's copies."""
    now = int(time.time())
    forged = [("X-Instance-ID", BETA), ("x-instance-id", BETA), ("X-Instance-ID-Timestamp", str(now - 3600)),
              ("X-Instance-ID-Signature", sign_stamped(SECRET, BETA, now, "tenant-b")), ("X-Tenant-ID", "tenant-b"),
              ("X-Forwarded-For", "10.81.0.2"), ("x-forwarded-for", "10.81.0.3"),
              *FORWARDING, ("X-Kept", "yes")]
    with recording_upstream() as recorder:
        args = ("--upstream", recorder.url, "--shared-secret-file", str(files["secret"]), "--map", str(files["map"]))
        with proxying(files["base"], *args) as running:
            for source, instance_id, tenant in ((VM_A, ALPHA, ["tenant-a"]), (VM_B, BETA, [])):
                answer = vm(source, running, "GET", "/latest/meta-data/instance-id", headers=forged)
                assert (answer.status_code, answer.text) == (200, "ok")
                assert recorder.last("x-instance-id") == [instance_id]
                [stamp] = recorder.last("x-instance-id-timestamp")  # the proxy's own, one copy, now
                assert abs(int(stamp) - time.time()) < 5
                signature = sign_stamped(SECRET, instance_id, int(stamp), tenant[0] if tenant else None)
                assert recorder.last("x-instance-id-signature") == [signature]
                assert recorder.last("x-tenant-id") == tenant
                assert recorder.last("x-forwarded-for") == [source]  # the proxy's own: the peer alone
                assert recorder.last("x-kept") == ["yes"]  # the VM's other headers pass
                for name in FORWARDING_HEADERS:
                    if name != "x-forwarded-for":
                        assert recorder.last(name) == [], name
                added = [name for name, _ in recorder.requests[-1] if name.startswith("x-forwarded-")]
                assert added == ["x-forwarded-for"]


def test_an_unknown_source_gets_404_with_a_body(proxy: Proxy, server: Server) -> None:
    answer = vm(UNKNOWN, proxy, "GET", "/metadata", headers={"X-Instance-ID": ALPHA})
    assert answer.status_code == 404
    assert answer.json() == {"message": f"no instance is associated with {UNKNOWN}"}
    assert UNKNOWN not in server.output()  # answered by the proxy; never reached upstream


def test_openstack_password_post_passes_through(proxy: Proxy) -> None:
    posted = vm(VM_B, proxy, "POST", "/openstack/latest/password", content=b"pw-from-beta")
    assert posted.status_code == 200, posted.text
    assert vm(VM_B, proxy, "GET", "/openstack/latest/password").text == "pw-from-beta"
    assert vm(VM_A, proxy, "GET", "/openstack/latest/password").text == ""
    again = vm(VM_B, proxy, "POST", "/openstack/latest/password", content=b"second")
    assert again.status_code == 409  # the upstream's answer, status and all


def test_imdsv2_token_put_then_get_through_the_proxy(proxy: Proxy) -> None:
    put = vm(VM_A, proxy, "PUT", "/latest/api/token", headers={TTL: "120"})
    assert put.status_code == 200, put.text
    assert put.headers[TTL] == "120"
    read = vm(VM_A, proxy, "GET", "/latest/meta-data/instance-id", headers={TOKEN: put.text})
    assert (read.status_code, read.text) == (200, ALPHA)
    stolen = vm(VM_B, proxy, "GET", "/latest/meta-data/instance-id", headers={TOKEN: put.text})
    assert stolen.status_code == 401
    # A token PUT relayed by a reverse proxy inside the VM is refused, as AWS refuses it.
    relayed = vm(VM_A, proxy, "PUT", "/latest/api/token", headers={TTL: "120", "X-Forwarded-For": "10.9.9.9"})
    assert relayed.status_code == 403


@pytest.mark.parametrize("path", WIRE_TOKEN_PATHS + OTHER_PATHS)
@pytest.mark.parametrize(("name", "value"), FORWARDING)
def test_a_token_put_through_the_proxy_answers_what_serve_answers(
    proxy: Proxy, server: Server, name: str, value: str, path: str
) -> None:
    """Any forwarding header, any spelling of the path: the proxy refuses as serve does, or serve itself answers."""
    assert_answers_as_serve(int(proxy.url.rsplit(":", 1)[1]), int(server.url.rsplit(":", 1)[1]), (name, value), path,
                            VM_A)


@pytest.mark.parametrize("path", WIRE_TOKEN_PATHS)
def test_without_a_forwarding_header_every_token_path_mints_through_the_proxy(proxy: Proxy, path: str) -> None:
    """The refusal is the header's doing: the same PUTs without one mint a token bound to the VM."""
    status, _, token = put("127.0.0.1", int(proxy.url.rsplit(":", 1)[1]), path, {TTL: "60"}, VM_B)
    assert status == 200
    read = vm(VM_B, proxy, "GET", "/latest/meta-data/instance-id", headers={TOKEN: token.decode()})
    assert (read.status_code, read.text) == (200, BETA)


def test_botocore_through_the_proxy(proxy: Proxy) -> None:
    """The botocore IMDSv2 fetcher: token PUT, then reads, all through the proxy from VM B's address."""
    from botocore.utils import InstanceMetadataFetcher  # noqa: PLC0415 - a real client, loaded for this test

    fetcher = InstanceMetadataFetcher(
        timeout=2, num_attempts=1, env={}, config={"ec2_metadata_service_endpoint": proxy.url}
    )
    fetcher._session._manager.connection_pool_kw["source_address"] = (VM_B, 0)
    try:
        token = fetcher._fetch_metadata_token()
        assert token
        assert fetcher._get_request("latest/meta-data/instance-id", None, token=token).text == BETA
        assert fetcher._get_request("latest/user-data", None, token=token).text == "ud-beta"
    finally:
        fetcher._session.close()


def test_map_reloads_on_sighup_and_on_change(files: dict[str, Path], server: Server) -> None:
    """JSON map: a VM added by rewriting the file is served after SIGHUP (poll off), a removed one is 404."""
    base = files["base"] / "reload"
    base.mkdir()
    mapping = write(base / "map.json", json.dumps({VM_A: ALPHA}))
    args = ("--upstream", server.url, "--shared-secret-file", str(files["secret"]), "--map", str(mapping))
    with proxying(base, *args, "--map-poll-interval", "0") as proxy:
        assert vm(VM_B, proxy, "GET", "/metadata").status_code == 404
        staged = write(base / "map.json.new", json.dumps({VM_B: {"instance_id": BETA, "tenant_id": None}}))
        staged.replace(mapping)
        proxy.reload()
        wait_for(lambda: vm(VM_B, proxy, "GET", "/metadata").status_code == 200,
                 what="VM B served after the reload", explain=proxy.output)
        assert vm(VM_A, proxy, "GET", "/metadata").status_code == 404
        # A broken file is logged and the previous table kept.
        write(mapping, "{not json")
        proxy.reload()
        wait_for(lambda: "proxy.map_invalid" in proxy.output(), what="proxy.map_invalid logged", explain=proxy.output)
        assert vm(VM_B, proxy, "GET", "/metadata").json()["id"] == BETA
    write(mapping, "{}")  # a file that does not parse at startup is fatal; an empty map is not
    with proxying(base, *args, "--map-poll-interval", "0.1") as proxy:
        assert vm(VM_A, proxy, "GET", "/metadata").status_code == 404
        write(mapping, f"{VM_A} {ALPHA}\n")
        wait_for(lambda: vm(VM_A, proxy, "GET", "/metadata").status_code == 200,
                 what="VM A served again", explain=proxy.output)


def test_tenant_mismatch_from_the_map_is_404(files: dict[str, Path], server: Server) -> None:
    base = files["base"] / "tenant"
    base.mkdir()
    mapping = write(base / "map.txt", f"{VM_A} {ALPHA} tenant-z\n")
    args = ("--upstream", server.url, "--shared-secret-file", str(files["secret"]), "--map", str(mapping))
    with proxying(base, *args) as proxy:
        assert vm(VM_A, proxy, "GET", "/metadata").status_code == 404


def test_a_wrong_secret_is_refused_upstream(files: dict[str, Path], server: Server) -> None:
    base = files["base"] / "wrong"
    base.mkdir()
    secret = write(base / "secret", b"not-the-shared-secret")
    args = ("--upstream", server.url, "--shared-secret-file", str(secret), "--map", str(files["map"]))
    with proxying(base, *args) as proxy:
        answer = vm(VM_A, proxy, "GET", "/metadata")
    assert answer.status_code == 403
    assert SECRET.decode() not in server.output()
    assert "not-the-shared-secret" not in server.output() + proxy.output()


def test_upstream_down_is_503_with_a_body(files: dict[str, Path], tmp_path: Path) -> None:
    upstream = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    args = ("--upstream", upstream, "--shared-secret-file", str(files["secret"]), "--map", str(files["map"]))
    with proxying(tmp_path, *args) as proxy:
        answer = vm(VM_A, proxy, "GET", "/metadata")
    assert answer.status_code == 503
    assert answer.json() == {"message": "metadata service unavailable"}


def test_an_upstream_that_never_answers_times_out_as_504(files: dict[str, Path], tmp_path: Path) -> None:
    """A listener that accepts (in the kernel) but never answers: the per-request deadline ends it (504, as haproxy)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        upstream = f"http://127.0.0.1:{silent.getsockname()[1]}"
        args = ("--upstream", upstream, "--shared-secret-file", str(files["secret"]), "--map", str(files["map"]),
                "--timeout", "0.5")
        with proxying(tmp_path, *args) as proxy:
            answer = vm(VM_A, proxy, "GET", "/metadata")
    assert answer.status_code == 504
    assert "did not answer within 0.5 s" in answer.json()["message"]


def test_ipv6_listener(files: dict[str, Path], server: Server, tmp_path: Path) -> None:
    mapping = write(tmp_path / "map.txt", f"::1 {BETA}\n")
    args = ("--upstream", server.url, "--shared-secret-file", str(files["secret"]), "--map", str(mapping))
    with proxying(tmp_path, *args, host="::1") as proxy:
        answer = vm("::1", proxy, "GET", "/latest/meta-data/instance-id")
    assert (answer.status_code, answer.text) == (200, BETA)


def test_config_errors_name_the_flag(tmp_path: Path) -> None:
    missing = run_imds(tmp_path, "proxy", "--upstream", "http://127.0.0.1:1", "--shared-secret-file", "/nonexistent")
    assert missing.returncode == 2
    assert "--map" in missing.stderr


def test_one_vm_cannot_hold_more_than_its_requests(files: dict[str, Path], server: Server) -> None:
    """Two unfinished posts fill VM A's share (--max-requests-per-source 2): its next request is refused.

    The 429 names the flag; VM B is served meanwhile; A is served again once its connections close.
    """
    args = ("--upstream", server.url, "--shared-secret-file", str(files["secret"]), "--map", str(files["map"]),
            "--max-requests-per-source", "2")
    with proxying(files["base"], *args) as running:
        host, port = running.url.removeprefix("http://").rsplit(":", 1)
        held = []
        for _ in range(2):  # a head that promises a body that never comes: in flight until the socket closes
            sock = socket.create_connection((host, int(port)), timeout=10, source_address=(VM_A, 0))
            sock.sendall(b"POST /events HTTP/1.1\r\nHost: imds\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 10\r\n\r\n")
            held.append(sock)
        try:
            refused = wait_for(lambda: (r := vm(VM_A, running, "GET", "/metadata")).status_code == 429 and r,
                               what="VM A's third request refused", timeout=20)
            assert refused.headers["retry-after"] == "1"
            assert "--max-requests-per-source 2" in refused.json()["message"]
            assert vm(VM_B, running, "GET", "/metadata").json()["id"] == BETA
        finally:
            for sock in held:
                sock.close()
        served = wait_for(lambda: (r := vm(VM_A, running, "GET", "/metadata")).status_code == 200 and r,
                          what="VM A served again", timeout=20)
        assert served.json()["id"] == ALPHA
