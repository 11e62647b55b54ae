"""The OS image (Ganeti's ``os-image`` parameter), streamed to the instance: never held whole, capped.

The public OS parameter ``os-image`` names either an http(s) URL or an absolute path on
this node (as Ganeti's ``--os-image``). ``ImageSource.open`` checks everything that can
be checked before the first byte goes out, so a refusal is still an HTTP status whose body
says why: a node path outside every ``--ganeti-os-image-dir``, or not a regular file (a
FIFO, device, socket: ``Refused``, 403; ``imds.services.ganeti.nodefiles``), a missing or
unreadable file, a link loop, a URL that does not parse (``NotFound``), a URL whose host
the destination policy refuses (``imds.upstream.destination``: loopback, link-local, this
server...), answering anything but 200 or declaring a length over ``--os-image-max-bytes``
(``UpstreamError``, 502). URLs are fetched like the package (no redirects followed; the
package's credentials, from memory, only for the package URL's own origin, never in the
URL). A node file's reads have a deadline each (``--os-package-timeout``). The returned
``Image`` yields chunks of at most ``CHUNK`` bytes; a source that turns out longer than the
cap (a URL without a declared length, a file that grew), shorter than it declared, or
stuck past a read's deadline raises ``StreamCut`` mid-stream, and the front then aborts
the connection rather than end a short body as if it were whole.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from imds.errors import NotFound, StreamCut, UpstreamError, UpstreamUnavailable
from imds.services.ganeti.memory import PackageAuth
from imds.services.ganeti.nodefiles import open_node_file
from imds.services.ganeti.urls import IMAGE_PARAMETER, url_problem
from imds.upstream.destination import fetch_errors

IMAGE_DIR_FLAG = "--ganeti-os-image-dir"
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
        if (problem := url_problem(value)) is not None:
            raise NotFound(f"os-image {problem}")
        scheme = urlsplit(value).scheme
        if scheme in {"http", "https"}:
            same_origin = package_url is not None and _origin(package_url) == _origin(value)
            return await _started(await self._url(value, auth if same_origin else None))
        if value.startswith("/"):
            return await _started(await self._file(value))
        msg = "os-image is neither an http(s) URL nor an absolute node path"
        raise NotFound(msg)

    def _too_large(self) -> str:
        return f"image refused: larger than {self._max} bytes (--os-image-max-bytes)"

    async def _file(self, value: str) -> Image:
        node = await open_node_file(value, self._directories, field=IMAGE_PARAMETER, flag=IMAGE_DIR_FLAG,
                                    seconds=self._timeout)
        size = node.size
        if size > self._max:
            await node.close()
            raise UpstreamError(self._too_large())

        async def chunks() -> AsyncGenerator[bytes]:
            sent = 0
            try:
                while sent < size:
                    chunk = await node.read(min(CHUNK, size - sent), sent)
                    if not chunk:
                        break
                    sent += len(chunk)
                    yield chunk
                if sent != size:  # the file shrank while being sent: a short body must not look whole
                    msg = f"image cut: the node file ended after {sent} of {size} bytes"
                    raise StreamCut(msg)
            except UpstreamUnavailable as exc:  # a read past its deadline
                raise StreamCut(f"image cut: {exc.message}") from exc
            finally:
                await node.close()

        return Image(size, chunks(), node.close)

    async def _send(self, url: str, credentials: tuple[str, str] | None) -> httpx.Response:
        """The streamed answer to GET ``url``; what went wrong before it, as an ImdsError naming os-image."""
        with fetch_errors("image", "the os-image URL", lambda problem: NotFound(f"os-image {problem}")):
            # identity: the bytes counted and sent are the image's own, and Content-Length is their length
            request = self._http.build_request("GET", url, timeout=self._timeout,
                                               headers={"accept-encoding": "identity"})
            return await self._http.send(request, auth=credentials, stream=True, follow_redirects=False)

    async def _url(self, url: str, auth: PackageAuth | None) -> Image:
        credentials = (auth.username.reveal(), auth.password.reveal()) if auth is not None else None
        response = await self._send(url, credentials)
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
                declared = f" of {length}" if length is not None else ""
                msg = f"image cut: the image URL broke off after {sent}{declared} bytes ({type(exc).__name__})"
                raise StreamCut(msg) from exc
            finally:
                await response.aclose()
            if length is not None and sent != length:
                msg = f"image cut: the image URL sent {sent} of {length} bytes"
                raise StreamCut(msg)

        return Image(length, chunks(), response.aclose)


async def _started(image: Image) -> Image:
    """``image`` with its first chunk already read: a source that fails before its first byte is still a status.

    (Past the headers a failure can only abort the connection; before the first body byte
    some servers turn that into a 500 of their own.)
    """
    try:
        first = await anext(image.chunks, None)
    except BaseException:
        await image.close()
        raise

    async def chunks() -> AsyncGenerator[bytes]:
        try:
            if first is not None:
                yield first
            async for chunk in image.chunks:
                yield chunk
        finally:
            await image.chunks.aclose()

    return Image(image.length, chunks(), image.close)
