"""Broken sources behind os-image and the package: a clear status naming the field, never a 500, never a short 200.

- a URL that does not parse (``http://[fd00::zz]/``): refused at the write (400 naming the
  field), and, for a record stored before that check, a 404 naming ``os-image``;
- an upstream that declares more bytes than it sends: the image's connection is aborted
  (a real ``imds serve``; the client sees a broken body, never a complete short one), the
  package is a 502 saying the body was cut.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from factories import new_id, next_ipv4
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
from imds.services.ganeti.image import ImageSource
from serve_process import client_at, serving

pytestmark = pytest.mark.anyio
BAD_URLS = ("http://[fd00::zz]/", "http://[fd00::zz]/site.tar.gz", "https://host:port/site.tar.gz",
            "http://exa mple.com/site.tar.gz", "http:///site.tar.gz")
GUEST = "127.0.0.4"


@pytest.mark.parametrize("url", BAD_URLS)
async def test_a_url_that_does_not_parse_is_a_400_naming_the_field(url):
    """``package.url`` and an ``os-image`` value (either section, any visibility): 400 naming it, nothing stored."""
    ip = next_ipv4()
    async with running_app() as app, admin_client(app) as admin:
        instance_id = await push_record(admin, [ip])
        bodies = {
            "package.url": os_body(instance_id, package={"url": url}),
            "parameters.os-image.value": {**os_body(instance_id), "parameters": {
                "os-image": {"value": url, "visibility": "private"}}},
            "install_parameters.os-image.value": {**os_body(instance_id), "install_parameters": {
                "os-image": {"value": url, "visibility": "public"}}},
        }
        for field, body in bodies.items():
            answer = await admin.post("/device-os", json=body)
            assert answer.status_code == 400, (field, answer.text)
            assert [e["field"] for e in answer.json()["errors"]] == [field], answer.text
            assert (await admin.get(f"/device-os/{instance_id}")).status_code == 404


async def test_a_stored_url_that_does_not_parse_is_a_404_naming_os_image():
    """A value stored before the write check: the image source says which field, not a 500."""
    source = ImageSource(httpx.AsyncClient(), directories=(), max_bytes=1, timeout=1.0)
    for url in BAD_URLS:
        with pytest.raises(Exception) as raised:  # noqa: PT011 - the kind is asserted below
            await source.open(url, package_url=None, auth=None)
        assert type(raised.value).__name__ == "NotFound"
        assert str(raised.value).startswith("os-image is not a valid URL"), raised.value


@contextmanager
def short_upstream(declared: int, sent: bytes) -> Iterator[str]:
    """A raw HTTP/1.1 server: 200 with ``Content-Length: declared``, then ``sent`` and the connection closed."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            with connection:
                connection.settimeout(10)
                connection.recv(65536)
                head = f"HTTP/1.1 200 OK\r\nContent-Length: {declared}\r\nContent-Type: application/gzip\r\n\r\n"
                connection.sendall(head.encode() + sent)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/site.tar.gz"
    finally:
        stop.set()
        thread.join(timeout=10)
        listener.close()


async def test_a_package_cut_short_is_a_clear_502():
    """Declared 100000 bytes, sent 1000: 502 saying the package URL broke off after 1000 bytes."""
    ip = next_ipv4()
    with short_upstream(100_000, b"\x1f\x8b" + b"x" * 998) as url:
        async with running_app(make_settings(fetch_allow=LOOPBACK_FETCHES)) as app, admin_client(app) as admin:
            instance_id = await push_record(admin, [ip])
            await put_os(admin, os_body(instance_id, package={"url": url}))
            async with client_from(app, ip) as guest:
                answer = await guest.get("/ganeti/latest/os/package")
    assert answer.status_code == 502
    assert answer.text.startswith("502 - Bad Gateway: package cut: the package URL sent 1000 bytes and broke off")


def with_image(instance_id: str, value: str) -> dict[str, Any]:
    body = os_body(instance_id)
    body["parameters"]["os-image"] = {"value": value, "visibility": "public"}
    return body


def test_an_image_cut_short_aborts_the_connection(tmp_path):
    """A real serve streams what came, then aborts: the client's read fails, it never sees a whole short body."""
    with short_upstream(4 << 20, b"i" * (1 << 20)) as url, \
            serving(tmp_path, "--db", "memory://", *LOOPBACK_FETCH_ARGS) as server:
        instance_id = new_id()
        server.post("/device-metadata", {"id": instance_id, "ipAddresses": [GUEST], "metadata": {"id": instance_id}})
        server.post("/device-os", with_image(instance_id, url))
        received = bytearray()
        with client_at(GUEST) as guest, guest.stream("GET", f"{server.url}/ganeti/latest/os/image") as answer:
            assert (answer.status_code, answer.headers["content-length"]) == (200, str(4 << 20))
            with pytest.raises(httpx.TransportError):  # noqa: PT012 - reading the body is what fails
                for chunk in answer.iter_bytes():
                    received += chunk
        assert len(received) <= 1 << 20
        assert "image cut: the image URL broke off after" in server.output()


def test_an_image_that_breaks_off_before_its_first_byte_is_a_502(tmp_path):
    """Nothing of the declared body came: still a status (502 saying so), not the server's own 500."""
    with short_upstream(4 << 20, b"") as url, serving(tmp_path, "--db", "memory://", *LOOPBACK_FETCH_ARGS) as server:
        instance_id = new_id()
        server.post("/device-metadata", {"id": instance_id, "ipAddresses": [GUEST], "metadata": {"id": instance_id}})
        server.post("/device-os", with_image(instance_id, url))
        with client_at(GUEST) as guest:
            answer = guest.get(f"{server.url}/ganeti/latest/os/image", timeout=30.0)
    assert (answer.status_code, answer.text) == (
        502, "502 - Bad Gateway: image cut: the image URL broke off after 0 of 4194304 bytes (RemoteProtocolError)")
