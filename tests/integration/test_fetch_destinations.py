"""Fetches made on a record's behalf (os-image, package.url) go only where the destination policy allows.

A real HTTP server on loopback holds an image and a package. Pointed at it through every
spelling of a loopback address, imds refuses by default (502 naming the field and the
address, and the server sees no request), and serves the bytes once ``--fetch-allow``
names loopback. The metadata addresses and imds's own listener stay refused even with
everything allowed; a real ``imds serve`` is asked to fetch from itself and refuses.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from typing import Any

import httpcore
import pytest

from factories import new_id, next_ipv4
from fake_upstream import FakeUpstream, running_upstream
from ganeti_data import os_body, put_os
from helpers import (
    LOOPBACK_FETCH_ARGS,
    LOOPBACK_FETCHES,
    admin_client,
    client_from,
    make_settings,
    push_record,
    running_app,
)
from imds.upstream import destination
from imds.upstream.destination import DestinationPolicy, GuardedBackend
from serve_process import client_at, serving

pytestmark = pytest.mark.anyio
IMAGE = b"image bytes " * 1000
PACKAGE_PATH = "/pkg/site.tar.gz"
EVERYTHING = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))


def spellings(port: int) -> dict[str, str]:
    """Hosts that all end at 127.0.0.1 (the last two IPv6 forms carry it inside)."""
    return {"dotted": f"127.0.0.1:{port}", "name": f"localhost:{port}", "hex": f"0x7f000001:{port}",
            "decimal": f"2130706433:{port}", "octal": f"017700000001:{port}", "short": f"127.1:{port}",
            "mapped": f"[::ffff:127.0.0.1]:{port}", "v6-loopback": f"[::1]:{port}"}


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with running_upstream() as fake:
        fake.answer("/img/debian.img", 200, IMAGE, content_type="application/octet-stream")
        yield fake


def with_image(instance_id: str, value: str, **changes: Any) -> dict[str, Any]:
    body = os_body(instance_id, **changes)
    body["parameters"]["os-image"] = {"value": value, "visibility": "public"}
    return body


async def image_answers(urls: list[str], **settings: Any) -> list[tuple[int, str]]:
    """(status, body) of /ganeti/latest/os/image for each os-image URL, one instance, in-process."""
    ip = next_ipv4()
    answers = []
    async with running_app(make_settings(**settings)) as app, admin_client(app) as admin:
        instance_id = await push_record(admin, [ip])
        for url in urls:
            await put_os(admin, with_image(instance_id, url))
            async with client_from(app, ip) as guest:
                answer = await guest.get("/ganeti/latest/os/image")
            answers.append((answer.status_code, answer.text if answer.status_code != 200 else answer.content.hex()))
    return answers


async def test_every_spelling_of_loopback_is_refused_by_default(upstream: FakeUpstream):
    """502 naming the field, the host and 127.0.0.1 (or ::1); the server on loopback never saw a request."""
    port = int(upstream.base.rsplit(":", 1)[1])
    hosts = spellings(port)
    answers = await image_answers([f"http://{host}/img/debian.img" for host in hosts.values()])
    for (name, host), (status, body) in zip(hosts.items(), answers, strict=True):
        address = {"v6-loopback": "::1", "mapped": "::ffff:7f00:1 (IPv4 127.0.0.1)"}.get(name, "127.0.0.1")
        assert status == 502, (name, body)
        assert body.startswith("502 - Bad Gateway: image refused: the os-image URL's host "), body
        assert f"resolves to {address}, a loopback address (not fetched; --fetch-allow allows a network)" in body, body
        assert host.rsplit(":", 1)[0].strip("[]") in body
    assert upstream.log("/img/") == []


async def test_the_allow_list_lets_loopback_through(upstream: FakeUpstream):
    """With --fetch-allow 127.0.0.0/8 and ::1/128 every IPv4 spelling serves the image byte for byte."""
    port = int(upstream.base.rsplit(":", 1)[1])
    hosts = {name: host for name, host in spellings(port).items() if name != "v6-loopback"}  # nothing on ::1
    answers = await image_answers([f"http://{host}/img/debian.img" for host in hosts.values()],
                                  fetch_allow=LOOPBACK_FETCHES)
    assert answers == [(200, IMAGE.hex())] * len(hosts)
    assert len(upstream.log("/img/")) == len(hosts)


async def test_metadata_addresses_are_refused_whatever_is_allowed():
    """169.254.169.254, fd00:ec2::254 and fe80::a9fe:a9fe (any spelling) even with 0.0.0.0/0 and ::/0 allowed."""
    urls = ["http://169.254.169.254/latest/meta-data/", "http://[fd00:ec2::254]/", "http://[fe80::a9fe:a9fe]/",
            "http://0xa9fea9fe/", "http://[::ffff:169.254.169.254]/"]
    answers = await image_answers(urls, fetch_allow=EVERYTHING)
    for url, (status, body) in zip(urls, answers, strict=True):
        assert status == 502, (url, body)
        assert body.endswith(", a metadata service address"), body


async def test_the_package_url_is_under_the_same_policy(upstream: FakeUpstream):
    """package.url at loopback: refused by default naming package.url, fetched with the allow-list."""
    upstream.answer(PACKAGE_PATH, 200, b"not checked: never fetched", content_type="application/gzip")
    ip = next_ipv4()
    async with running_app(make_settings()) as app, admin_client(app) as admin:
        instance_id = await push_record(admin, [ip])
        await put_os(admin, os_body(instance_id, package={"url": f"{upstream.base}{PACKAGE_PATH}"}))
        async with client_from(app, ip) as guest:
            answer = await guest.get("/ganeti/latest/os/package")
    assert answer.status_code == 502
    assert answer.text.startswith("502 - Bad Gateway: package refused: package.url's host '127.0.0.1' resolves to "
                                  "127.0.0.1, a loopback address")
    assert upstream.log("/pkg/") == []


def test_imds_never_fetches_from_its_own_listener(tmp_path, upstream: FakeUpstream):
    """A real serve with loopback allowed: its own port is refused, another loopback port served.

    The demo instance is bound to 127.0.0.1: its metadata is not streamed to another instance.
    """
    with serving(tmp_path, "--db", "memory://", "--demo", *LOOPBACK_FETCH_ARGS) as server:
        own = server.url.removeprefix("http://")
        instance_id = new_id()
        guest_ip = "127.0.0.3"
        server.post("/device-metadata", {"id": instance_id, "ipAddresses": [guest_ip], "metadata": {"id": instance_id}})
        answers = []
        for url in (f"http://{own}/metadata", f"http://localhost:{own.rsplit(':', 1)[1]}/metadata",
                    f"{upstream.base}/img/debian.img"):
            server.post("/device-os", with_image(instance_id, url))
            with client_at(guest_ip) as guest:
                answers.append(guest.get(f"{server.url}/ganeti/latest/os/image", timeout=30.0))
    assert [a.status_code for a in answers] == [502, 502, 200]
    assert answers[0].text.endswith("resolves to 127.0.0.1, this server's own listener")
    assert "this server's own listener" in answers[1].text
    assert answers[2].content == IMAGE
    assert b"demo" not in answers[0].content


@pytest.mark.parametrize(("address", "port", "allow", "why"), [
    ("10.1.2.3", 80, (), "a private address"),
    ("192.168.0.1", 80, (), "a private address"),
    ("100.64.0.1", 80, (), "not a public address"),
    ("0.0.0.0", 80, (), "the unspecified address"),  # noqa: S104 - an address judged, nothing bound
    ("::", 80, (), "the unspecified address"),
    ("224.0.0.1", 80, (), "a multicast address"),
    ("fe80::1", 80, (), "a link-local address"),
    ("169.254.1.1", 80, (), "a link-local address"),
    ("fc00::1", 80, (), "a private address"),
    ("64:ff9b::a01:203", 80, (), "a private address"),  # NAT64 of 10.1.2.3
    ("10.1.2.3", 80, ("10.0.0.0/8",), None),
    ("::ffff:10.1.2.3", 80, ("10.0.0.0/8",), None),
    ("93.184.215.14", 443, (), None),
    ("2606:4700::1", 443, (), None),
    ("169.254.169.254", 80, ("0.0.0.0/0",), "a metadata service address"),
])
def test_the_policy_by_address(address, port, allow, why):
    """Public unicast is allowed; anything else only inside --fetch-allow; metadata addresses never."""
    policy = DestinationPolicy(allow=tuple(ipaddress.ip_network(a) for a in allow))
    refusal = policy.refusal(ipaddress.ip_address(address), port)
    assert (refusal if refusal is None else refusal.split(" (")[0]) == why


def test_a_catch_all_listener_covers_every_address_of_this_host():
    """Listening on 0.0.0.0:8000: this host's own addresses at port 8000 are refused, another port is not."""
    local = socket.gethostbyname(socket.gethostname())
    policy = DestinationPolicy(allow=EVERYTHING, listeners=(("0.0.0.0", 8000), ("::1", 9000)))  # noqa: S104
    assert policy.refusal(ipaddress.ip_address(local), 8000) == "this server's own listener"
    assert policy.refusal(ipaddress.ip_address("127.0.0.5"), 8000) == "this server's own listener"
    assert policy.refusal(ipaddress.ip_address("::1"), 9000) == "this server's own listener"
    assert policy.refusal(ipaddress.ip_address(local), 8001) is None
    assert policy.refusal(ipaddress.ip_address("192.0.2.1"), 8000) is None  # not an address of this host


class _Spy(httpcore.AsyncNetworkBackend):
    """Records what it is asked to connect to, and refuses."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def connect_tcp(self, host: str, *_: Any, **__: Any) -> httpcore.AsyncNetworkStream:
        self.asked.append(host)
        raise httpcore.ConnectError("spy")


async def test_it_connects_to_the_address_it_checked(monkeypatch):
    """One resolution; the connection goes to that address, never to the name (no second answer can differ)."""
    answers = iter([[(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", 80))],
                    [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 80))]])
    resolved = []

    async def getaddrinfo(host: str, port: int, **_: Any) -> Any:
        resolved.append(host)
        return next(answers)

    monkeypatch.setattr(destination.anyio, "getaddrinfo", getaddrinfo)
    spy = _Spy()
    with pytest.raises(httpcore.ConnectError):
        await GuardedBackend(DestinationPolicy(), spy).connect_tcp("rebinding.example", 80)
    assert (resolved, spy.asked) == (["rebinding.example"], ["93.184.215.14"])
