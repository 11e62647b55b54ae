"""os/package: fetched on demand with credentials from memory, capped, and refused (502, saying why) when unsafe."""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Iterator
from typing import Any

import pytest

from factories import next_ipv4
from fake_upstream import FakeUpstream, running_upstream
from ganeti_data import os_body, put_os
from helpers import LOOPBACK_FETCHES, admin_client, client_from, make_settings, push_record, running_app
from serve_process import free_port

pytestmark = pytest.mark.anyio
PATH = "/ganeti/latest/os/package"


def archive(*members: tuple[str, str, str], compress: bool = True) -> bytes:
    """A tar(.gz) of (kind, name, data-or-linkname) members; kind is file, dir, sym, hard or fifo."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for kind, name, extra in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(extra.encode())
                tar.addfile(info, io.BytesIO(extra.encode()))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE,
                         "fifo": tarfile.FIFOTYPE}[kind]
            info.linkname = extra
            tar.addfile(info)
    return gzip.compress(raw.getvalue(), mtime=0) if compress else raw.getvalue()


def path_max_escape() -> bytes:
    """CVE-2025-4517's construction: links to long directories, a link past PATH_MAX, ``escape`` through it."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        path, component = "", "d" * 247
        for step in "abcdefghijklmnop":
            directory = tarfile.TarInfo(f"{path}{component}")
            directory.type = tarfile.DIRTYPE
            tar.addfile(directory)
            link = tarfile.TarInfo(f"{path}{step}")
            link.type, link.linkname = tarfile.SYMTYPE, component
            tar.addfile(link)
            path = f"{path}{component}/"
        for name, target in (("a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/" + "l" * 254, "/".join([".."] * 16)),
                             ("escape", "a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/" + "l" * 254 + "/../tmp")):
            link = tarfile.TarInfo(name)
            link.type, link.linkname = tarfile.SYMTYPE, target
            tar.addfile(link)
    return gzip.compress(raw.getvalue(), mtime=0)


GOOD = archive(("dir", "etc", ""), ("file", "etc/motd", "hello"), ("sym", "etc/link", "motd"),
               ("sym", "etc/up", "../etc/motd"), ("hard", "etc/again", "etc/motd"))


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with running_upstream() as fake:
        yield fake


async def serve_package(upstream: FakeUpstream, data: Any, *, status: int = 200, max_bytes: int = 1 << 20,
                        auth: bool = False) -> tuple[int, bytes]:
    """Publish ``data`` at the fake, point an instance's package at it, fetch /ganeti/latest/os/package."""
    upstream.answer("/pkg/site.tar.gz", status, data, content_type="application/gzip")
    package: dict[str, str] = {"url": f"{upstream.base}/pkg/site.tar.gz"}
    if auth:
        package.update(username="pkg-user", password="pkg-pass:with:colons")
    ip = next_ipv4()
    settings = make_settings(os_package_max_bytes=max_bytes, fetch_allow=LOOPBACK_FETCHES)
    async with running_app(settings) as app, admin_client(app) as admin:
        instance_id = await push_record(admin, [ip])
        await put_os(admin, os_body(instance_id, package=package))
        async with client_from(app, ip) as guest:
            answer = await guest.get(PATH)
    return answer.status_code, answer.content


async def test_a_good_package_is_streamed_with_credentials_from_memory(upstream):
    """The package comes back byte for byte; the fetch carried the basic-auth credentials the write held."""
    status, body = await serve_package(upstream, GOOD, auth=True)
    assert (status, body) == (200, GOOD)
    calls = upstream.log("/pkg/")
    assert len(calls) == 1
    assert calls[0].basic_auth() == ("pkg-user", "pkg-pass:with:colons")


@pytest.mark.parametrize(("data", "why"), [
    (archive(("file", "../evil", "x")), "member '../evil' has a '..' component"),
    (archive(("file", "a/../../evil", "x")), "member 'a/../../evil' has a '..' component"),
    (archive(("file", "/etc/cron.d/evil", "x")), "member '/etc/cron.d/evil' has an absolute path"),
    (archive(("sym", "etc/shadow", "/etc/shadow")), "symbolic link 'etc/shadow' points outside the archive"),
    (archive(("sym", "etc/out", "../../root")), "symbolic link 'etc/out' points outside the archive"),
    (archive(("hard", "etc/h", "../outside")), "hard link 'etc/h' points outside the archive"),
    (archive(("hard", "etc/h", "/etc/passwd")), "hard link 'etc/h' points outside the archive"),
    (archive(("fifo", "pipe", "")), "member 'pipe' is a device, FIFO or other special file"),
    (path_max_escape(), "symbolic link 'escape' points outside the archive"),
    (archive(("sym", "l", "d/../etc/passwd"), ("sym", "d", "sub/.."), ("dir", "sub", "")),
     "symbolic link 'l' points outside the archive once unpacked"),
    (archive(("file", "plain", "x"), compress=False), "not a gzip-compressed tar archive"),
    (b"not an archive at all", "not a gzip-compressed tar archive"),
    (GOOD[: len(GOOD) // 2], "not a gzip-compressed tar archive"),
])
async def test_unsafe_archives_are_refused_with_a_reason(upstream, data, why):
    """Crafted archives are a 502 whose plain-text body says what was wrong."""
    status, body = await serve_package(upstream, data)
    assert status == 502
    assert body.decode().startswith("502 - Bad Gateway: package refused: ")
    assert why in body.decode()


async def test_size_cap_and_upstream_failures(upstream):
    """Over --os-package-max-bytes, a non-200 answer, a redirect and an unreachable URL are 502s saying so."""
    status, body = await serve_package(upstream, GOOD, max_bytes=len(GOOD) - 1)
    assert status == 502
    assert f"larger than {len(GOOD) - 1} bytes (--os-package-max-bytes)" in body.decode()
    status, body = await serve_package(upstream, b"", status=404)
    assert (status, body) == (502, b"502 - Bad Gateway: package refused: the package URL answered 404")
    status, body = await serve_package(upstream, b"", status=302)
    assert (status, body) == (502, b"502 - Bad Gateway: package refused: the package URL answered 302")
    ip = next_ipv4()
    async with running_app(make_settings(fetch_allow=LOOPBACK_FETCHES)) as app, admin_client(app) as admin:
        instance_id = await push_record(admin, [ip])
        closed = f"http://127.0.0.1:{free_port()}/p.tgz"
        await put_os(admin, os_body(instance_id, package={"url": closed}))
        async with client_from(app, ip) as guest:
            answer = await guest.get(PATH)
    assert (answer.status_code, answer.text) == (502, "502 - Bad Gateway: package fetch failed: ConnectError")


async def test_no_package_no_path(upstream):
    """Without a package URL os/package is 404 and not listed."""
    ip = next_ipv4()
    async with running_app() as app, admin_client(app) as admin:
        instance_id = await push_record(admin, [ip])
        await put_os(admin, os_body(instance_id))
        async with client_from(app, ip) as guest:
            assert (await guest.get(PATH)).text == "404 - Not Found"
    assert upstream.log("/") == []
