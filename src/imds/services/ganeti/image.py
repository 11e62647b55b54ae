"""The OS image (Ganeti's ``os-image`` parameter), streamed to the instance: never held whole, capped.

The public OS parameter ``os-image`` names either an http(s) URL or an absolute path on
this node (as Ganeti's ``--os-image``). ``ImageSource.open`` checks everything that can
be checked before the first byte goes out, so a refusal is still an HTTP status whose body
says why: a node path outside every ``--ganeti-os-image-dir`` (``Refused``, 403), a missing
or unreadable file (``NotFound``), a URL answering anything but 200 or declaring a length
over ``--os-image-max-bytes`` (``UpstreamError``, 502). URLs are fetched like the package
(no redirects followed; the package's credentials, from memory, only for the package URL's
own origin, never in the URL). The returned ``Image`` yields chunks of at most ``CHUNK``
bytes; a source that turns out longer than the cap (a URL without a declared length, a
file that grew) raises ``StreamCut`` mid-stream, and the front then aborts the connection
rather than end a short body as if it were whole.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import httpx

from imds.errors import NotFound, Refused, StreamCut, UpstreamError, UpstreamUnavailable
from imds.services.ganeti.memory import PackageAuth

IMAGE_PARAMETER = "os-image"
CHUNK = 256 * 1024  # the largest piece of an image in memory at once (per request)


@dataclass(frozen=True)
class Image:
    """An opened image: ``length`` when known before the first byte, its chunks, and ``close`` (always await it).

    ``close`` releases the source even when ``chunks`` never started (a HEAD, a client gone
    before the first byte), which closing an unstarted generator does not do.
    """

    length: int | None
    chunks: AsyncGenerator[bytes]
    close: Callable[[], Awaitable[None]]


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


class ImageSource:
    """Opens ``os-image`` values: allowed node paths and http(s) URLs, under ``max_bytes``."""

    def __init__(self, http: httpx.AsyncClient, *, directories: tuple[Path, ...], max_bytes: int,
                 timeout: float) -> None:
        self._http = http
        self._directories = tuple(Path(os.path.realpath(d)) for d in directories)
        self._max = max_bytes
        self._timeout = timeout

    async def open(self, value: str, *, package_url: str | None, auth: PackageAuth | None) -> Image:
        """The image named by ``value``; an ImdsError saying why it cannot be served (before any byte)."""
        scheme = urlsplit(value).scheme
        if scheme in {"http", "https"}:
            same_origin = package_url is not None and _origin(package_url) == _origin(value)
            return await self._url(value, auth if same_origin else None)
        if value.startswith("/"):
            return await self._file(value)
        msg = "os-image is neither an http(s) URL nor an absolute node path"
        raise NotFound(msg)

    def _too_large(self) -> str:
        return f"image refused: larger than {self._max} bytes (--os-image-max-bytes)"

    async def _file(self, value: str) -> Image:
        if not self._directories:
            msg = "os-image names a node path, and no --ganeti-os-image-dir allows node paths"
            raise Refused(msg)
        real = Path(await anyio.Path(value).resolve())  # links resolved: a link cannot lead out of the directories
        if not any(real.is_relative_to(directory) for directory in self._directories):
            msg = "os-image names a node path outside every --ganeti-os-image-dir"
            raise Refused(msg)
        try:
            handle = await anyio.open_file(real, "rb")
            size = os.fstat(handle.wrapped.fileno()).st_size
        except OSError as exc:
            msg = f"os-image: the node file cannot be read ({type(exc).__name__})"
            raise NotFound(msg) from exc
        if size > self._max:
            await handle.aclose()
            raise UpstreamError(self._too_large())

        async def chunks() -> AsyncGenerator[bytes]:
            sent = 0
            try:
                while sent < size:
                    chunk = await handle.read(min(CHUNK, size - sent))
                    if not chunk:
                        break
                    sent += len(chunk)
                    yield chunk
                if sent != size:  # the file shrank while being sent: a short body must not look whole
                    msg = f"image cut: the node file ended after {sent} of {size} bytes"
                    raise StreamCut(msg)
            finally:
                await handle.aclose()

        return Image(size, chunks(), handle.aclose)

    async def _url(self, url: str, auth: PackageAuth | None) -> Image:
        credentials = (auth.username.reveal(), auth.password.reveal()) if auth is not None else None
        # identity: the bytes counted and sent are the image's own, and Content-Length is their length
        request = self._http.build_request("GET", url, timeout=self._timeout, headers={"accept-encoding": "identity"})
        try:
            response = await self._http.send(request, auth=credentials, stream=True, follow_redirects=False)
        except httpx.HTTPError as exc:
            msg = f"image fetch failed: {type(exc).__name__}"
            raise UpstreamUnavailable(msg) from exc
        declared = response.headers.get("content-length", "")
        encoded = response.headers.get("content-encoding", "identity").lower() != "identity"
        length = int(declared) if declared.isdigit() and not encoded else None
        problem = None
        if response.status_code != httpx.codes.OK:
            problem = f"image refused: the image URL answered {response.status_code}"
        elif length is not None and length > self._max:
            problem = self._too_large()
        if problem is not None:
            await response.aclose()
            raise UpstreamError(problem)
        limit = self._max

        async def chunks() -> AsyncGenerator[bytes]:
            sent = 0
            try:
                async for chunk in response.aiter_bytes(CHUNK):
                    sent += len(chunk)
                    if sent > limit:
                        msg = f"image cut: larger than {limit} bytes (--os-image-max-bytes)"
                        raise StreamCut(msg)
                    yield chunk
            except httpx.HTTPError as exc:
                msg = f"image cut: the image URL failed mid-stream ({type(exc).__name__})"
                raise StreamCut(msg) from exc
            finally:
                await response.aclose()
            if length is not None and sent != length:
                msg = f"image cut: the image URL sent {sent} of {length} bytes"
                raise StreamCut(msg)

        return Image(length, chunks(), response.aclose)
