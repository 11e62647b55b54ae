"""Downloading the Ganeti personalization package into memory under a size cap.

Redirects are not followed (the credentials must not travel to another origin); the URL
must answer 200 itself. Refusals are UpstreamError (502) saying why; a transport failure
is UpstreamUnavailable.
"""

from __future__ import annotations

import httpx

from imds.errors import UpstreamError, UpstreamUnavailable
from imds.upstream.destination import fetch_errors


class PackageDownloader:
    """GETs a package with the service's HTTP client, at most ``max_bytes``, within ``timeout`` seconds."""

    def __init__(self, http: httpx.AsyncClient, *, max_bytes: int, timeout: float) -> None:
        self._http = http
        self._max = max_bytes
        self._timeout = timeout

    async def get(self, url: str, credentials: tuple[str, str] | None) -> bytes:
        """The body of a 200 answer (HTTP Basic ``credentials`` when given).

        A body shorter than its ``Content-Length`` (or a chunked one that breaks off) is
        UpstreamUnavailable saying so; a refused destination (``imds.upstream.destination``)
        or a URL that does not parse is UpstreamError naming ``package.url``.
        """
        data = bytearray()
        with fetch_errors("package", "package.url", _invalid_url):
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
                    async for chunk in response.aiter_bytes():
                        data += chunk
                        if len(data) > self._max:
                            raise UpstreamError(self._too_large())
            except httpx.RemoteProtocolError as exc:
                msg = f"package cut: the package URL sent {len(data)} bytes and broke off ({exc})"
                raise UpstreamUnavailable(msg) from exc
        return bytes(data)

    def _too_large(self) -> str:
        return f"package refused: larger than {self._max} bytes (--os-package-max-bytes)"


def _invalid_url(problem: str) -> UpstreamError:
    return UpstreamError(f"package refused: package.url {problem}")
