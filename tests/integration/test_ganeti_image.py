"""os/image: the os-image parameter streamed (node paths under --ganeti-os-image-dir, URLs), capped, never whole.

An 8 MiB image (32 times the largest chunk imds holds) goes out in chunks of at most
``CHUNK`` bytes; refusals known before the first byte are statuses whose body says why; an
image found over the cap mid-stream aborts the connection (a real ``imds serve``), so a
client never takes a short body for a whole one.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
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
from imds.services.ganeti.image import CHUNK
from serve_process import client_at, serving

pytestmark = pytest.mark.anyio
PATH = "/ganeti/latest/os/image"
BIG = 8 << 20  # 8 MiB: far larger than CHUNK (256 KiB), the most of an image imds holds at once
GUEST = "127.0.0.2"  # the instance's source address for the real server


def image_bytes(size: int) -> bytes:
    """Reproducible, incompressible-looking bytes."""
    block = hashlib.sha256(b"image").digest() * 2048  # 64 KiB
    return (block * (size // len(block) + 1))[:size]


def with_image(instance_id: str, value: str, **changes: Any) -> dict[str, Any]:
    body = os_body(instance_id, **changes)
    body["parameters"]["os-image"] = {"value": value, "visibility": "public"}
    return body


async def asgi_get(app: Any, ip: str, path: str) -> list[MutableMapping[str, Any]]:
    """Call the app directly and keep every message it sends: the chunks as they went out."""
    sent: list[MutableMapping[str, Any]] = []
    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(b"host", b"imds.test")], "client": (ip, 40000), "server": ("imds.test", 80),
             "scheme": "http", "http_version": "1.1", "root_path": ""}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


async def test_a_node_image_is_streamed_in_chunks(tmp_path: Path):
    """8 MiB + 1 byte under an allowed directory: Content-Length, chunks of at most CHUNK, the bytes exact."""
    images = tmp_path / "images"
    images.mkdir()
    data = image_bytes(BIG + 1)
    (images / "debian.img").write_bytes(data)
    ip = next_ipv4()
    settings = make_settings(ganeti_os_image_dir=(images,), os_image_max_bytes=16 << 20)
    async with running_app(settings) as app, admin_client(app) as admin:
        instance_id = await push_record(admin, [ip])
        await put_os(admin, with_image(instance_id, str(images / "debian.img")))
        sent = await asgi_get(app, ip, PATH)
        start, bodies = sent[0], sent[1:]
        assert start["status"] == 200
        assert dict(start["headers"])[b"content-length"] == str(BIG + 1).encode()
        assert dict(start["headers"])[b"content-type"] == b"application/octet-stream"
        assert max(len(m["body"]) for m in bodies) <= CHUNK
        assert len(bodies) > BIG // CHUNK
        assert [m.get("more_body", False) for m in bodies][-1] is False
        assert hashlib.sha256(b"".join(m["body"] for m in bodies)).digest() == hashlib.sha256(data).digest()
        async with client_from(app, ip) as guest:
            head = await guest.head(PATH)
            assert (head.status_code, head.content, head.headers["content-length"]) == (200, b"", str(BIG + 1))


async def test_node_paths_are_refused_unless_allowed_and_small_enough(tmp_path: Path):
    """No directory, outside it, a link out of it, a missing file, over the cap: a status whose body says why."""
    images, elsewhere = tmp_path / "images", tmp_path / "elsewhere"
    images.mkdir()
    elsewhere.mkdir()
    (elsewhere / "secret.img").write_bytes(b"not yours")
    (images / "link.img").symlink_to(elsewhere / "secret.img")
    (images / "big.img").write_bytes(image_bytes(BIG))
    cases = [
        ((), str(images / "big.img"), 403, "no --ganeti-os-image-dir allows node paths"),
        ((images,), str(elsewhere / "secret.img"), 403, "outside every --ganeti-os-image-dir"),
        ((images,), str(images / "link.img"), 403, "outside every --ganeti-os-image-dir"),
        ((images,), str(images / ".." / "elsewhere" / "secret.img"), 403, "outside every --ganeti-os-image-dir"),
        ((images,), str(images / "missing.img"), 404, "the node file cannot be read"),
        ((images,), str(images / "big.img"), 502, f"larger than {BIG - 1} bytes (--os-image-max-bytes)"),
        ((images,), "relative/path.img", 404, "neither an http(s) URL nor an absolute node path"),
    ]
    for directories, value, status, why in cases:
        ip = next_ipv4()
        settings = make_settings(ganeti_os_image_dir=directories, os_image_max_bytes=BIG - 1)
        async with running_app(settings) as app, admin_client(app) as admin:
            instance_id = await push_record(admin, [ip])
            await put_os(admin, with_image(instance_id, value))
            async with client_from(app, ip) as guest:
                answer = await guest.get(PATH)
        assert (answer.status_code, why in answer.text) == (status, True), (value, answer.text)
        assert b"not yours" not in answer.content


async def test_without_os_image_it_is_404_and_not_listed():
    """No os-image parameter: os/image is 404 and the listing leaves it out; with one, it is listed."""
    ip = next_ipv4()
    examples = Path(__file__).parents[2] / "examples" / "ganeti-os"
    async with running_app(make_settings(os_definitions_dir=examples)) as app, admin_client(app) as admin:
        instance_id = await push_record(admin, [ip])
        await put_os(admin, os_body(instance_id, os_type="tiny"))
        async with client_from(app, ip) as guest:
            assert (await guest.get(PATH)).text == "404 - Not Found"
            assert "image" not in (await guest.get("/ganeti/latest/os")).text.splitlines()
        await put_os(admin, {**os_body(instance_id), "install_parameters": {
            "disk": {"value": "/img", "visibility": "public"}}})
        async with client_from(app, ip) as guest:
            assert "image" not in (await guest.get("/ganeti/latest/os")).text.splitlines()


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with running_upstream() as fake:
        yield fake


async def test_a_url_image_is_fetched_with_the_package_credentials_of_its_origin(upstream: FakeUpstream):
    """Same origin as the package: basic auth from memory; another origin: none; a non-200 or over the cap: 502."""
    data = image_bytes(BIG)
    upstream.answer("/img/debian.img", 200, data, content_type="application/octet-stream")
    upstream.answer("/img/missing.img", 404, b"no")
    package = {"url": f"{upstream.base}/pkg/site.tar.gz", "username": "u", "password": "p:w"}
    other_origin = upstream.base.replace("127.0.0.1", "localhost")
    ip = next_ipv4()
    async with running_app(make_settings(os_image_max_bytes=BIG, fetch_allow=LOOPBACK_FETCHES)) as app, \
            admin_client(app) as admin:
        instance_id = await push_record(admin, [ip])
        results = []
        for url in (f"{upstream.base}/img/debian.img", f"{other_origin}/img/debian.img",
                    f"{upstream.base}/img/missing.img"):
            await put_os(admin, with_image(instance_id, url, package=package))
            async with client_from(app, ip) as guest:
                results.append(await guest.get(PATH))
    assert [r.status_code for r in results] == [200, 200, 502]
    assert results[0].content == data
    assert results[0].headers["content-length"] == str(BIG)
    assert "the image URL answered 404" in results[2].text
    calls = upstream.log("/img/")
    assert [c.basic_auth() for c in calls] == [("u", "p:w"), None, ("u", "p:w")]
    async with running_app(make_settings(os_image_max_bytes=BIG - 1, fetch_allow=LOOPBACK_FETCHES)) as app, \
            admin_client(app) as admin:
        instance_id = await push_record(admin, [ip])
        await put_os(admin, with_image(instance_id, f"{upstream.base}/img/debian.img"))
        async with client_from(app, ip) as guest:
            refused = await guest.get(PATH)
    assert (refused.status_code, f"larger than {BIG - 1} bytes" in refused.text) == (502, True)


@contextmanager
def undeclared_upstream(data: bytes) -> Iterator[str]:
    """An HTTP/1.0 server sending ``data`` without a Content-Length (the end is the connection's close)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/image.img"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_an_image_over_the_cap_mid_stream_aborts_the_connection(tmp_path: Path):
    """A real imds serve: no declared length, 8 MiB against a 4 MiB cap: the client sees a cut response, an error."""
    data = image_bytes(BIG)
    with undeclared_upstream(data) as url, serving(tmp_path, "--db", "memory://", "--os-image-max-bytes",
                                                   str(BIG // 2), *LOOPBACK_FETCH_ARGS) as server:
        instance_id = new_id()
        server.post("/device-metadata", {"id": instance_id, "ipAddresses": [GUEST], "metadata": {"id": instance_id}})
        server.post("/device-os", with_image(instance_id, url))
        received = bytearray()
        with client_at(GUEST) as guest, guest.stream("GET", f"{server.url}{PATH}") as answer:
            assert answer.status_code == 200
            assert "content-length" not in answer.headers
            with pytest.raises(httpx.TransportError):  # noqa: PT012 - reading the body is what fails
                for chunk in answer.iter_bytes():
                    received += chunk
        assert BIG // 4 <= len(received) <= BIG // 2  # bytes went out before the cap was reached, never more
    # Under the cap the same stream ends cleanly, whole.
    with undeclared_upstream(data) as url, serving(tmp_path, "--db", "memory://", *LOOPBACK_FETCH_ARGS) as server:
        instance_id = new_id()
        server.post("/device-metadata", {"id": instance_id, "ipAddresses": [GUEST], "metadata": {"id": instance_id}})
        server.post("/device-os", with_image(instance_id, url))
        with client_at(GUEST) as guest:
            whole = guest.get(f"{server.url}{PATH}", timeout=30.0)
        assert (whole.status_code, hashlib.sha256(whole.content).digest()) == (200, hashlib.sha256(data).digest())
