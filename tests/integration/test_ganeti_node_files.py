"""Special files and loops under --ganeti-os-image-dir: refused before any read, no worker held, SIGTERM still works.

A FIFO's ``open`` waits for a writer, a device's ``open`` may act: each is refused from its
``lstat`` (403 naming os-image and the kind), as are sockets and directories; a symbolic
link loop is a 404 saying so. A real ``imds serve`` asked for a FIFO 64 times at once
answers every request, serves another image right after, and stops on SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
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
