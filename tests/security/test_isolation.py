"""Isolation, tried as an attacker would: no request from one instance ever shows another's data.

One real ``imds serve`` process (IPv4 and IPv6 loopback, one trusted proxy address) holds
five instances, each of whose documents and userdata carry a unique marker, each in a GCE
project of its own whose attributes (written by ``PUT /projects/{id}/attributes``) carry it too. Every case is
a raw HTTP request (so paths reach the server byte for byte: ``..``, ``//``, ``%2e%2e``)
sent from a chosen loopback source address with chosen headers; a **leak** is any marker
(or instance id) of an instance other than the one the network path identifies appearing
anywhere in the answer. Cases are grouped; each group's test id says how many it runs.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import secrets
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from factories import new_id
from serve_process import Server, serving

PROXY = "127.0.0.9"  # the only trusted proxy
STRANGER = "127.0.30.1"  # holds nothing


@dataclass(frozen=True)
class Tenant:
    name: str
    binding: str  # what the admin bound: a host or a CIDR
    id: str
    marker: str


TENANTS = [
    Tenant("a", "127.0.10.1", new_id(), f"marker-a-{secrets.token_hex(6)}"),
    Tenant("b", "127.0.10.2", new_id(), f"marker-b-{secrets.token_hex(6)}"),
    Tenant("net", "127.0.20.0/24", new_id(), f"marker-net-{secrets.token_hex(6)}"),
    Tenant("host", "127.0.20.5", new_id(), f"marker-host-{secrets.token_hex(6)}"),
    Tenant("v6", "::1", new_id(), f"marker-v6-{secrets.token_hex(6)}"),
]
BY_NAME = {t.name: t for t in TENANTS}


def owner(address: str) -> Tenant | None:
    """Who the service must answer for ``address``: longest prefix, v4-mapped v6 as v4."""
    parsed = ipaddress.ip_address(address)
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        parsed = parsed.ipv4_mapped
    best: tuple[int, Tenant] | None = None
    for tenant in TENANTS:
        network = ipaddress.ip_network(tenant.binding)
        if parsed.version == network.version and parsed in network and (best is None or network.prefixlen > best[0]):
            best = (network.prefixlen, tenant)
    return best[1] if best else None


@dataclass(frozen=True)
class Case:
    source: str
    target: str
    headers: tuple[tuple[str, str], ...] = ()
    method: str = "GET"
    expected: Tenant | None = None  # whose data may appear (None: nobody's)


DATA_PATHS = [
    "/metadata", "/userdata", "/api/v1/metadata", "/api/v1/userdata", "/metadata/", "/latest/meta-data/instance-id",
    "/latest/meta-data/hostname", "/latest/user-data", "/latest/dynamic/instance-identity/document",
    "/2009-04-04/meta-data/instance-id", "/2009-04-04/user-data", "/openstack/latest/meta_data.json",
    "/openstack/latest/user_data", "/openstack/2012-08-10/meta_data.json", "/nocloud/meta-data", "/nocloud/user-data",
]
TRICK_PATHS = [
    "/metadata/../userdata", "//metadata", "//userdata", "/%2e%2e/metadata", "/./metadata", "/metadata%2f..%2fuserdata",
    "/latest/meta-data/../user-data", "/latest//user-data", "/latest/%2e%2e/latest/user-data",
    "/openstack/latest/../latest/user_data", "/openstack//latest/user_data", "/nocloud/../nocloud/user-data",
    "/device-metadata/{a}", "/device-userdata/{b}", "/api/v1/device-metadata/{net}", "/metadata?id={b}",
    "/latest/meta-data/instance-id?instance={b}", "/metadata#../{b}",
]
SOURCES = ["127.0.10.1", "127.0.10.2", "127.0.20.5", "127.0.20.77", STRANGER]


def forged(other: str) -> list[tuple[tuple[str, str], ...]]:
    """Headers that would name ``other`` as the caller if anyone believed them."""
    return [
        (("X-Forwarded-For", other),),
        (("X-Forwarded-For", f"{other}, {other}"),),
        (("X-Forwarded-For", "198.51.100.1"), ("X-Forwarded-For", other)),
        (("Forwarded", f"for={other}"),),
        (("Forwarded", f'for="[{other}]:80";proto=http'),),
        (("X-Real-IP", other),),
        (("X-Instance-ID", BY_NAME["b"].id), ("X-Instance-ID-Signature", "00" * 32)),
        (("X-Forwarded-For", f"::ffff:{other}"), ("X-Real-IP", other), ("Forwarded", f"for={other}")),
    ]


def untrusted_groups() -> dict[str, list[Case]]:
    groups: dict[str, list[Case]] = {"forged-headers-from-untrusted-peers": [], "path-tricks": []}
    targets = {t.name: t.id for t in TENANTS}
    for source in SOURCES:
        mine = owner(source)
        for other in ("127.0.10.2", "127.0.10.1", "127.0.20.5", "127.0.20.9", "::1"):
            for headers in forged(other):
                for path in DATA_PATHS:
                    groups["forged-headers-from-untrusted-peers"].append(Case(source, path, headers, expected=mine))
        for path in TRICK_PATHS:
            groups["path-tricks"].append(Case(source, path.format(**targets), expected=mine))
            groups["path-tricks"].append(
                Case(source, path.format(**targets), (("X-Forwarded-For", "127.0.10.2"),), expected=mine))
    return groups


def proxy_groups() -> dict[str, list[Case]]:
    chains: list[tuple[tuple[tuple[str, str], ...], str | None]] = []
    for address in ("127.0.10.1", "127.0.10.2", "127.0.20.5", "127.0.20.200", "::ffff:127.0.10.1", STRANGER):
        chains += [
            ((("X-Forwarded-For", address),), address),
            ((("X-Forwarded-For", f"127.0.10.2, {address}"),), address),  # right-most untrusted wins
            ((("X-Forwarded-For", f"{address}, {PROXY}"),), address),  # trusted hops are skipped
            ((("X-Forwarded-For", "127.0.10.2"), ("X-Forwarded-For", address)), address),
        ]
    chains += [
        ((), None),  # the proxy itself is nobody
        ((("Forwarded", "for=127.0.10.1"),), None),  # Forwarded is never read
        ((("X-Real-IP", "127.0.10.1"),), None),  # nor X-Real-IP
        ((("X-Forwarded-For", "not-an-ip"),), None),
        ((("X-Forwarded-For", ""),), None),
    ]
    cases = []
    for headers, named in chains:
        expected = owner(named) if named else None
        cases += [Case(PROXY, path, headers, expected=expected) for path in DATA_PATHS]
    return {"trusted-proxy-chains": cases}


def ipv6_groups() -> dict[str, list[Case]]:
    cases = []
    for headers in [(), *forged("127.0.10.1")]:
        cases += [Case("::1", path, headers, expected=BY_NAME["v6"]) for path in DATA_PATHS]
    return {"ipv6-peer": cases}


GCE_PATHS = [
    "/computeMetadata/v1/instance/id", "/computeMetadata/v1/instance/hostname", "/computeMetadata/v1/instance/tags",
    "/computeMetadata/v1/instance/?recursive=true", "/computeMetadata/v1/instance/attributes/user-data",
    "/computeMetadata/v1/instance/attributes/?recursive=true&alt=text", "/computeMetadata/v1/?recursive=true",
    "/computeMetadata/v1/instance/../instance/id", "/computeMetadata//v1/instance/hostname",
    "/computeMetadata/v1/project/attributes/?recursive=true", "/computeMetadata/v1/project/attributes/marker",
    "/computeMetadata/v1/project/attributes/?alt=text&recursive=true", "/computeMetadata/v1/project/?recursive=true",
]
GOOGLE = ("Metadata-Flavor", "Google")


def gce_groups() -> dict[str, list[Case]]:
    """GCE's paths with its header, from every source, forged or relayed through the (unsigned) proxy."""
    cases = []
    for source in SOURCES:
        mine = owner(source)
        for path in GCE_PATHS:
            cases.append(Case(source, path, (GOOGLE,), expected=mine))
            cases += [Case(source, path, (GOOGLE, *headers), expected=mine) for headers in forged("127.0.10.2")]
    cases += [Case(PROXY, path, (GOOGLE, ("X-Forwarded-For", "127.0.10.1")), expected=None) for path in GCE_PATHS]
    cases += [Case("::1", path, (GOOGLE,), expected=BY_NAME["v6"]) for path in GCE_PATHS]
    return {"gce-metadata-flavor": cases}


GROUPS = {**untrusted_groups(), **proxy_groups(), **ipv6_groups(), **gce_groups()}


def raw_request(server: Server, case: Case) -> bytes:
    """Send ``case`` byte for byte from its source address; the whole answer (headers and body)."""
    v6 = ":" in case.source
    url = server.v6 if v6 else server.url
    assert url is not None
    host, port = url.removeprefix("http://").rsplit(":", 1)
    family = socket.AF_INET6 if v6 else socket.AF_INET
    lines = [f"{case.method} {case.target} HTTP/1.1", f"Host: {host}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in case.headers]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(10.0)
        sock.bind((case.source, 0))
        sock.connect((host.strip("[]"), int(port)))
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def leaks(answer: bytes, expected: Tenant | None) -> list[str]:
    """Markers or ids of any tenant but ``expected`` found in the answer."""
    return [t.name for t in TENANTS if t is not expected and (t.marker.encode() in answer or t.id.encode() in answer)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp: Path = tmp_path_factory.mktemp("isolation")
    with serving(tmp, "--db", "memory://", "--trusted-proxy", f"{PROXY}/32", v6=True) as running:
        for tenant in TENANTS:
            document = {"id": tenant.id, "hostname": tenant.marker, "facility": "da11", "tags": [f"m={tenant.marker}"],
                        "project_id": f"proj-{tenant.name}"}
            running.post("/device-metadata", {"id": tenant.id, "ipAddresses": [tenant.binding], "metadata": document})
            running.post("/device-userdata", {"id": tenant.id, "ipAddresses": [tenant.binding],
                                              "userdata": f"#!/bin/sh\necho {tenant.marker}\n",
                                              "userdata_encoding": "text"})
            with httpx.Client(headers=running.admin_headers, timeout=10.0, trust_env=False) as admin:
                put = admin.put(f"{running.url}/projects/proj-{tenant.name}/attributes",
                                json={"marker": tenant.marker})
            assert put.status_code == 200, put.text
        yield running


@pytest.mark.parametrize("group", sorted(GROUPS), ids=[f"{name}-{len(GROUPS[name])}-cases" for name in sorted(GROUPS)])
def test_no_request_shows_another_instances_data(server, group):
    """Every case in the group: 0 leaks; and the identified instance does get its own data on plain data paths."""
    found: list[str] = []
    served_own = 0
    for case in GROUPS[group]:
        answer = raw_request(server, case)
        assert answer.startswith(b"HTTP/1.1 "), (case, answer[:200])
        assert not answer.startswith(b"HTTP/1.1 5"), (case, answer[:300])
        leaked = leaks(answer, case.expected)
        if leaked:
            found.append(f"{case} -> {leaked}: {answer[:200]!r}")
        if case.expected is not None and case.expected.marker.encode() in answer:
            served_own += 1
    assert found == [], f"{len(found)} leaks of {len(GROUPS[group])} cases:\n" + "\n".join(found[:20])
    if group != "path-tricks":
        assert served_own > 0, "no case was answered with the caller's own data: the suite would prove nothing"


def test_an_imdsv2_token_works_only_for_the_instance_it_was_minted_for(server):
    """A token minted by a is refused (401) when b presents it, and the answer carries nothing of a's."""
    a, b = BY_NAME["a"], BY_NAME["b"]
    put = Case(a.binding, "/latest/api/token", (("X-aws-ec2-metadata-token-ttl-seconds", "60"),), method="PUT")
    answer = raw_request(server, put)
    assert answer.startswith(b"HTTP/1.1 200")
    token = answer.split(b"\r\n\r\n", 1)[1].decode()
    use = (("X-aws-ec2-metadata-token", token),)
    cross = raw_request(server, Case(b.binding, "/latest/meta-data/instance-id", use))
    assert cross.startswith(b"HTTP/1.1 401")
    assert leaks(cross, None) == []
    own = raw_request(server, Case(a.binding, "/latest/meta-data/instance-id", use))
    assert own.startswith(b"HTTP/1.1 200")
    assert own.endswith(a.id.encode())
    relayed = Case(PROXY, "/latest/api/token", (("X-aws-ec2-metadata-token-ttl-seconds", "60"),
                                                 ("X-Forwarded-For", a.binding)), method="PUT")
    assert raw_request(server, relayed).startswith(b"HTTP/1.1 403")


def test_a_gce_identity_token_names_only_the_caller(server):
    """Each source's identity token names its own instance (sub); a stranger, a forger or the proxy gets none."""
    path = "/computeMetadata/v1/instance/service-accounts/default/identity?audience=https://a.example&format=full"
    for source in SOURCES:
        mine = owner(source)
        answer = raw_request(server, Case(source, path, (GOOGLE,)))
        if mine is None:
            assert answer.startswith(b"HTTP/1.1 404"), (source, answer[:200])
            continue
        assert answer.startswith(b"HTTP/1.1 200"), (source, answer[:200])
        payload = answer.split(b"\r\n\r\n", 1)[1].split(b".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + b"==="))
        assert claims["sub"] == claims["google"]["compute_engine"]["instance_id"] == mine.id
        forged_answer = raw_request(server, Case(source, path, (GOOGLE, ("X-Forwarded-For", "127.0.10.2"))))
        assert forged_answer.startswith(b"HTTP/1.1 403")
    relayed = raw_request(server, Case(PROXY, path, (GOOGLE, ("X-Forwarded-For", "127.0.10.1"))))
    assert relayed.startswith(b"HTTP/1.1 403")


def test_a_gce_instance_reads_only_its_own_projects_attributes(server):
    """project/attributes/marker: the caller's project's marker, 404 for a stranger; forged headers name no other."""
    path = "/computeMetadata/v1/project/attributes/marker"
    for source in SOURCES:
        mine = owner(source)
        plain = raw_request(server, Case(source, path, (GOOGLE,)))
        if mine is None:
            assert plain.startswith(b"HTTP/1.1 404"), (source, plain[:200])
        else:
            assert plain.startswith(b"HTTP/1.1 200"), (source, plain[:200])
            assert plain.split(b"\r\n\r\n", 1)[1] == mine.marker.encode()
        for headers in forged("127.0.10.2"):
            answer = raw_request(server, Case(source, path, (GOOGLE, *headers)))
            assert leaks(answer, mine) == [], (source, headers, answer[:200])
            if answer.startswith(b"HTTP/1.1 200"):
                assert mine is not None
                assert answer.split(b"\r\n\r\n", 1)[1] == mine.marker.encode()
