"""The personalization package: fetched on demand, held in memory under a cap, checked, never on disk.

The whole archive is read into memory (at most ``--os-package-max-bytes``) and checked
before the first byte goes to the instance, so a refused archive is a 502 whose body
says why rather than a truncated 200. The check is ``imds.tarball``'s, the one the guest
tool unpacks with: unpacked in imagination against an empty root, every member must stay
inside it (links followed as the kernel would, chains included), and devices, FIFOs and
other special files are refused, as is anything that is not a gzip-compressed tar. It
runs in a worker thread (a large archive takes a while to decompress).
``imds.upstream.package`` downloads it (no redirects: the credentials must not travel to
another origin). ``NodePackages`` serves the node files Ganeti names in the ``os-package``
and ``os-install-package`` parameters, as ganeti-metad does, under the same limits and check.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import httpx

from imds import tarball
from imds.errors import UpstreamError
from imds.services.ganeti.memory import PackageAuth
from imds.services.ganeti.nodefiles import open_node_file
from imds.upstream.package import PackageDownloader

PACKAGE_DIR_FLAG = "--ganeti-os-package-dir"


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


class NodePackages:
    """``os-package`` and ``os-install-package`` node paths: the node's files, as ganeti-metad serves them, safely.

    The same rules as an ``os-image`` node path (``imds.services.ganeti.nodefiles``: under a
    ``--ganeti-os-package-dir``, a regular file, each call with a deadline), then the same
    limits and check as a fetched package: at most ``--os-package-max-bytes``, held in memory,
    and served only when ``imds.tarball`` accepts it.
    """

    def __init__(self, directories: tuple[Path, ...], *, max_bytes: int, timeout: float) -> None:
        self.directories = tuple(Path(os.path.realpath(d)) for d in directories)
        self._max = max_bytes
        self._timeout = timeout

    async def read(self, value: str, field: str) -> bytes:
        """The checked archive the node path ``value`` (the parameter ``field``) names; an ImdsError saying why not."""
        node = await open_node_file(value, self.directories, field=field, flag=PACKAGE_DIR_FLAG,
                                    seconds=self._timeout)
        try:
            data = await node.read_all(self._max, f"{field} refused: larger than {self._max} bytes "
                                                  "(--os-package-max-bytes)")
        finally:
            await node.close()
        await checked(data, field)
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
