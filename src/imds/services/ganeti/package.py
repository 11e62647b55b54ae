"""The personalization package: fetched on demand, held in memory under a cap, checked, never on disk.

The whole archive is read into memory (at most ``--os-package-max-bytes``) and checked
before the first byte goes to the instance, so a refused archive is a 502 whose body
says why rather than a truncated 200. Refused: anything that is not a gzip-compressed
tar, a member with an absolute path or a ``..`` component, a symbolic or hard link whose
target leaves the tree, and device or FIFO members. ``imds.upstream.package`` downloads it
(no redirects: the credentials must not travel to another origin).
"""

from __future__ import annotations

import io
import posixpath
import tarfile
import zlib

import httpx

from imds.errors import UpstreamError
from imds.services.ganeti.memory import PackageAuth
from imds.upstream.package import PackageDownloader

_SHOWN = 100  # characters of a member name shown in a refusal


class PackageFetcher:
    """Fetches packages (through ``imds.upstream.package``), capped and timed, and checks them."""

    def __init__(self, http: httpx.AsyncClient, *, max_bytes: int, timeout: float) -> None:
        self._downloader = PackageDownloader(http, max_bytes=max_bytes, timeout=timeout)

    async def fetch(self, url: str, auth: PackageAuth | None) -> bytes:
        """The checked archive; UpstreamError (502) saying why when it cannot be served."""
        credentials = (auth.username.reveal(), auth.password.reveal()) if auth is not None else None
        data = await self._downloader.get(url, credentials)
        problem = archive_problem(data)
        if problem is not None:
            msg = f"package refused: {problem}"
            raise UpstreamError(msg)
        return data


def archive_problem(data: bytes) -> str | None:
    """Why this tar.gz must not be served, or None when every member stays inside the tree."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            for member in archive:
                problem = _member_problem(member)
                if problem is not None:
                    return problem
    except (tarfile.TarError, EOFError, zlib.error, OSError):
        return "not a gzip-compressed tar archive (or a truncated one)"
    return None


def _escapes(path: str) -> bool:
    """Whether a path, taken relative to the archive root, is absolute or climbs out of it."""
    if path.startswith("/") or posixpath.isabs(path):
        return True
    normal = posixpath.normpath(path)
    return normal == ".." or normal.startswith("../")


def _member_problem(member: tarfile.TarInfo) -> str | None:
    shown = repr(member.name[:_SHOWN])
    if member.name.startswith("/"):
        return f"member {shown} has an absolute path"
    if ".." in member.name.split("/"):
        return f"member {shown} has a '..' component"
    if member.issym():
        target = posixpath.join(posixpath.dirname(member.name), member.linkname)
        if member.linkname.startswith("/") or _escapes(target):
            return f"symbolic link {shown} points outside the archive ({member.linkname[:_SHOWN]!r})"
    if member.islnk() and _escapes(member.linkname):
        return f"hard link {shown} points outside the archive ({member.linkname[:_SHOWN]!r})"
    if member.ischr() or member.isblk() or member.isfifo():
        return f"member {shown} is a device or FIFO"
    return None
