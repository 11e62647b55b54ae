"""The personalization package: fetched on demand, held in memory under a cap, checked, never on disk.

The whole archive is read into memory (at most ``--os-package-max-bytes``) and checked
before the first byte goes to the instance, so a refused archive is a 502 whose body
says why rather than a truncated 200. The check is ``imds.tarball``'s, the one the guest
tool unpacks with: unpacked in imagination against an empty root, every member must stay
inside it (links followed as the kernel would, chains included), and devices, FIFOs and
other special files are refused, as is anything that is not a gzip-compressed tar. It
runs in a worker thread (a large archive takes a while to decompress).
``imds.upstream.package`` downloads it (no redirects: the credentials must not travel to
another origin).
"""

from __future__ import annotations

import anyio
import httpx

from imds import tarball
from imds.errors import UpstreamError
from imds.services.ganeti.memory import PackageAuth
from imds.upstream.package import PackageDownloader


class PackageFetcher:
    """Fetches packages (through ``imds.upstream.package``), capped and timed, and checks them."""

    def __init__(self, http: httpx.AsyncClient, *, max_bytes: int, timeout: float) -> None:
        self._downloader = PackageDownloader(http, max_bytes=max_bytes, timeout=timeout)

    async def fetch(self, url: str, auth: PackageAuth | None) -> bytes:
        """The checked archive; UpstreamError (502) saying why when it cannot be served."""
        credentials = (auth.username.reveal(), auth.password.reveal()) if auth is not None else None
        data = await self._downloader.get(url, credentials)
        await checked(data, "package")
        return data


async def checked(data: bytes, what: str) -> None:
    """UpstreamError ``<what> refused: <why>`` unless ``data`` is a tar.gz ``imds.tarball`` would unpack."""
    problem = await anyio.to_thread.run_sync(tarball.check, data)
    if problem is not None:
        msg = f"{what} refused: {problem}"
        raise UpstreamError(msg)


def archive_problem(data: bytes) -> str | None:
    """Why this tar.gz must not be served, or None (``imds.tarball.check``)."""
    return tarball.check(data)
