"""Special files and loops under --ganeti-os-image-dir: refused before any read, no worker held, SIGTERM still works.

A FIFO's ``open`` waits for a writer, a device's ``open`` may act: each is refused from its
``lstat`` (403 naming os-image and the kind), as are sockets and directories; a symbolic
link loop is a 404 saying so. A real ``imds serve`` asked for a FIFO 64 times at once
answers every request, serves another image right after, and stops on SIGTERM.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import socket
import stat
import tarfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from factories import new_id, next_ipv4
from ganeti_data import os_body, put_os
from helpers import admin_client, client_from, make_settings, push_record, running_app
from serve_process import client_at, serving

pytestmark = pytest.mark.anyio
PATH = "/ganeti/latest/os/image"
IMAGE = b"a regular image\n" * 4096
REQUESTS = 64
FIELDS = {"package": "os-package", "os-install-package": "os-install-package"}  # leaf → parameter


def with_image(instance_id: str, value: str) -> dict[str, Any]:
    body = os_body(instance_id)
    body["parameters"]["os-image"] = {"value": value, "visibility": "public"}
    return body


@contextlib.contextmanager
def releasing(fifo: Path) -> Iterator[None]:
    """Should anything block opening ``fifo`` for reading, open it for writing (then close) after 10 s: no hang."""
    done = threading.Event()

    def release() -> None:
        while not done.wait(10.0):
            with contextlib.suppress(OSError):  # ENXIO: nobody is waiting to read it, as it should be
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=15)


@pytest.fixture
def images(tmp_path: Path) -> Iterator[Path]:
    """An image directory with one of each: regular file, FIFO, device, socket, directory, loop, link to the FIFO."""
    if os.geteuid() != 0:
        pytest.fail("test_ganeti_node_files needs root (mknod for the device node)")
    directory = tmp_path / "images"
    directory.mkdir()
    (directory / "good.img").write_bytes(IMAGE)
    os.mkfifo(directory / "pipe.img")
    os.mknod(directory / "device.img", stat.S_IFCHR | 0o600, os.makedev(1, 3))  # what /dev/null is
    (directory / "dir.img").mkdir()
    (directory / "loop-a.img").symlink_to(directory / "loop-b.img")
    (directory / "loop-b.img").symlink_to(directory / "loop-a.img")
    (directory / "to-pipe.img").symlink_to("pipe.img")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(directory / "socket.img"))
        with releasing(directory / "pipe.img"):
            yield directory


@pytest.mark.parametrize(("name", "status", "why"), [
    ("pipe.img", 403, "os-image: the node path is a FIFO, not a regular file"),
    ("to-pipe.img", 403, "os-image: the node path is a FIFO, not a regular file"),
    ("device.img", 403, "os-image: the node path is a character device, not a regular file"),
    ("socket.img", 403, "os-image: the node path is a socket, not a regular file"),
    ("dir.img", 403, "os-image: the node path is a directory, not a regular file"),
    ("loop-a.img", 404, "os-image: the node file cannot be read (a symbolic link loop)"),
    ("missing.img", 404, "os-image: the node file cannot be read (no such file)"),
])
async def test_special_files_and_loops_are_refused_naming_the_field(images: Path, name: str, status: int, why: str):
    """A status whose plain-text body names os-image and what the path is; the good image still serves."""
    ip = next_ipv4()
    async with running_app(make_settings(ganeti_os_image_dir=(images,))) as app, admin_client(app) as admin:
        instance_id = await push_record(admin, [ip])
        await put_os(admin, with_image(instance_id, str(images / name)))
        async with client_from(app, ip) as guest:
            answer = await guest.get(PATH)
        await put_os(admin, with_image(instance_id, str(images / "good.img")))
        async with client_from(app, ip) as guest:
            good = await guest.get(PATH)
    assert (answer.status_code, answer.text.split(": ", 1)[-1]) == (status, why)
    assert (good.status_code, good.content) == (200, IMAGE)


def test_a_fifo_asked_for_many_times_holds_nothing_and_sigterm_stops_the_server(tmp_path: Path, images: Path):
    """64 concurrent FIFO requests each answered 403; then the good image is served; SIGTERM ends the process."""
    with serving(tmp_path, "--db", "memory://", "--ganeti-os-image-dir", str(images),
                 "--max-requests-per-source", "0", "--max-connections-per-source", "0") as server:
        fifo_id, good_id = new_id(), new_id()
        for instance_id, address, image in ((fifo_id, "127.0.0.5", "pipe.img"), (good_id, "127.0.0.6", "good.img")):
            server.post("/device-metadata", {"id": instance_id, "ipAddresses": [address],
                                             "metadata": {"id": instance_id}})
            server.post("/device-os", with_image(instance_id, str(images / image)))

        def fifo(_: int) -> tuple[int, str]:
            with client_at("127.0.0.5") as guest:
                answer = guest.get(f"{server.url}{PATH}", timeout=30.0)
            return answer.status_code, answer.text

        with ThreadPoolExecutor(max_workers=16) as pool:
            answers = list(pool.map(fifo, range(REQUESTS)))
        with client_at("127.0.0.6") as guest:
            good = guest.get(f"{server.url}{PATH}", timeout=30.0)
        code, _seconds = server.terminate()
    assert answers == [(403, "403 - Forbidden: os-image: the node path is a FIFO, not a regular file")] * REQUESTS
    assert (good.status_code, good.content) == (200, IMAGE)
    assert code == 0


def package_bytes(*members: tuple[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def definitions(base: Path) -> Path:
    """``base/os/tiny``: Ganeti's layout, declaring os-package and os-install-package."""
    tiny = base / "os" / "tiny"
    tiny.mkdir(parents=True)
    for script in ("create", "export", "import", "rename"):
        (tiny / script).write_text("#!/bin/sh\n")
    (tiny / "ganeti_api_version").write_text("20\n")
    (tiny / "parameters.list").write_text("os-package the package\nos-install-package the definition\n")
    return tiny.parent


async def node_package_answers(settings: Any, parameters: dict[str, str]) -> dict[str, tuple[int, bytes, str]]:
    """(status, body, content type) of os/package and os/os-install-package with these public parameters."""
    ip = next_ipv4()
    async with running_app(settings) as app, admin_client(app) as admin:
        instance_id = await push_record(admin, [ip])
        body = os_body(instance_id, os_type="tiny")
        body["parameters"] = {name: {"value": value, "visibility": "public"} for name, value in parameters.items()}
        body["install_parameters"] = {}
        await put_os(admin, body)
        async with client_from(app, ip) as guest:
            answers = {leaf: await guest.get(f"/ganeti/latest/os/{leaf}") for leaf in ("package", "os-install-package")}
    return {leaf: (a.status_code, a.content, a.headers.get("content-type", "")) for leaf, a in answers.items()}


async def test_node_packages_are_served_from_allowed_directories_only(tmp_path: Path, images: Path):
    """os-package / os-install-package node paths: the file (metad's content type) when allowed, a status why not."""
    good = package_bytes(("etc/motd", b"hi\n"))
    (images / "site.tar.gz").write_bytes(good)
    (images / "install.tgz").write_bytes(package_bytes(("os/create", b"#!/bin/sh\n"), ("environment", b"A=1\n")))
    (images / "evil.tar.gz").write_bytes(package_bytes(("../escape", b"x")))
    elsewhere = tmp_path / "elsewhere.tar.gz"
    elsewhere.write_bytes(good)
    allowed = make_settings(ganeti_os_package_dir=(images,), os_definitions_dir=definitions(tmp_path),
                            os_package_max_bytes=4096)
    answers = await node_package_answers(allowed, {"os-package": str(images / "site.tar.gz"),
                                                   "os-install-package": str(images / "install.tgz")})
    assert answers["package"] == (200, good, "application/x-tgz")
    assert answers["os-install-package"][:2] == (200, (images / "install.tgz").read_bytes())
    cases = [(str(images / "evil.tar.gz"), 502, "{} refused: member '../escape' has a '..' component"),
             (str(elsewhere), 403, "{} names a node path outside every --ganeti-os-package-dir"),
             (str(images / "pipe.img"), 403, "{}: the node path is a FIFO, not a regular file"),
             (str(images / "good.img"), 502, "{} refused: larger than 4096 bytes (--os-package-max-bytes)")]
    for value, status, why in cases:
        answers = await node_package_answers(allowed, {"os-package": value, "os-install-package": value})
        for leaf, field in FIELDS.items():
            code, text, _ = answers[leaf]
            assert (code, text.decode().split(": ", 1)[-1]) == (status, why.format(field)), leaf


async def test_without_a_package_directory(tmp_path: Path, images: Path):
    """No --ganeti-os-package-dir: os-package says so (403); os-install-package is the loaded definition's archive."""
    (images / "site.tar.gz").write_bytes(package_bytes(("etc/motd", b"hi\n")))
    settings = make_settings(os_definitions_dir=definitions(tmp_path))
    answers = await node_package_answers(settings, {"os-package": str(images / "site.tar.gz"),
                                                    "os-install-package": str(images / "site.tar.gz")})
    refusal = b"403 - Forbidden: os-package names a node path, and no --ganeti-os-package-dir allows node paths"
    assert answers["package"][:2] == (403, refusal)
    status, archive, kind = answers["os-install-package"]
    assert (status, kind) == (200, "application/gzip")
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        assert "tiny/create" in tar.getnames()
