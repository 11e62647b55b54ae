"""The personalization package: fetched on demand, held in memory under a cap, checked, never on disk.

The whole archive is read into memory (at most ``--os-package-max-bytes``) and checked
before the first byte goes to the instance, so a refused archive is a 502 whose body
says why rather than a truncated 200. Refused: anything that is not a gzip-compressed
tar, a member with an absolute path or a ``..`` component, a symbolic or hard link whose
target leaves the tree, and device or FIFO members. Redirects are not followed (the
credentials must not travel to another origin); the URL must answer 200 itself.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
import zlib

import httpx

from imds.errors import UpstreamError, UpstreamUnavailable
from imds.services.os_secrets import PackageAuth

_SHOWN = 100  # characters of a member name shown in a refusal


class PackageFetcher:
    """Fetches packages with the service's HTTP client, capped and timed."""

    def __init__(self, http: httpx.AsyncClient, *, max_bytes: int, timeout: float) -> None:
        self._http = http
        self._max = max_bytes
        self._timeout = timeout

    async def fetch(self, url: str, auth: PackageAuth | None) -> bytes:
        """The checked archive; UpstreamError (502) saying why when it cannot be served."""
        credentials = (auth.username.reveal(), auth.password.reveal()) if auth is not None else None
        try:
            async with self._http.stream(
                "GET", url, auth=credentials, timeout=self._timeout, follow_redirects=False
            ) as response:
                if response.status_code != httpx.codes.OK:
                    msg = f"package refused: the package URL answered {response.status_code}"
                    raise UpstreamError(msg)
                declared = response.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > self._max:
                    raise UpstreamError(self._too_large())
                data = bytearray()
                async for chunk in response.aiter_bytes():
                    data += chunk
                    if len(data) > self._max:
                        raise UpstreamError(self._too_large())
        except httpx.HTTPError as exc:
            msg = f"package fetch failed: {type(exc).__name__}"
            raise UpstreamUnavailable(msg) from exc
        problem = archive_problem(bytes(data))
        if problem is not None:
            msg = f"package refused: {problem}"
            raise UpstreamError(msg)
        return bytes(data)

    def _too_large(self) -> str:
        return f"package refused: larger than {self._max} bytes (--os-package-max-bytes)"


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
