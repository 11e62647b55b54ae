"""Files named by node paths in OS parameters: under allowed directories, regular files only, never a stuck worker.

Ganeti gives node paths in OS parameters (``os-image``, ``os-package``,
``os-install-package``); a node path is served only when it resolves inside one of the
allowed directories. ``open_node_file`` refuses, before any byte is read:

- a path outside every allowed directory, also through a link (``Refused``, 403);
- a path that does not resolve: missing, unreadable, a symbolic link loop (``NotFound``);
- anything but a regular file: a FIFO (whose ``open`` would wait for a writer), a device
  (whose ``open`` may act), a socket, a directory (``Refused``). The type is read with
  ``lstat`` before ``open``; ``open`` itself is ``O_NONBLOCK | O_NOFOLLOW`` and ``fstat``
  checks again what was opened.

Every filesystem call runs on the file's own daemon thread (``_Worker``), awaited with a
deadline: a stuck filesystem costs that thread, never a shared worker, and a daemon thread
never keeps the process from exiting on SIGTERM. A call that overruns its deadline is
``UpstreamUnavailable`` and the file gives up.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import queue
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from imds.errors import NotFound, Refused, UpstreamError, UpstreamUnavailable

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"))
_REASONS = {errno.ENOENT: "no such file", errno.ELOOP: "a symbolic link loop", errno.EACCES: "permission denied",
            errno.ENOTDIR: "a path component is not a directory", errno.ENAMETOOLONG: "the path is too long"}


class _Descriptor(int):
    """A descriptor ``_open`` made: closed by ``_settle`` when its caller gave up before it came."""


def _settle(future: asyncio.Future[Any], result: object, error: BaseException | None) -> None:
    if future.cancelled():
        if isinstance(result, _Descriptor):  # opened after its caller gave up
            os.close(result)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class _Worker:
    """One daemon thread running one file's calls in order; a call past its deadline leaves the thread to it."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self.stuck = False
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        while (call := self._calls.get()) is not None:
            loop, future, function, args = call
            result: object = None
            error: BaseException | None = None
            try:
                result = function(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task as it is
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
                loop.call_soon_threadsafe(_settle, future, result, error)

    async def call(self, function: Callable[..., Any], *args: object, seconds: float, what: str) -> Any:
        """``function(*args)`` on the thread, within ``seconds``."""
        if self.stuck:
            raise UpstreamUnavailable(f"{what}: an earlier call is still stuck")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._calls.put((loop, future, function, args))
        try:
            with anyio.fail_after(seconds):
                return await future
        except TimeoutError as exc:
            self.stuck = True
            raise UpstreamUnavailable(f"{what}: no answer from the node's filesystem within {seconds:g} s") from exc

    def stop(self) -> None:
        self._calls.put(None)


def _kind(mode: int) -> str:
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def _open(value: str, directories: tuple[Path, ...], field: str, flag: str) -> _Descriptor:
    """The descriptor of the regular file ``value`` names inside ``directories`` (see the module's rules)."""
    if not any(Path(os.path.realpath(value)).is_relative_to(d) for d in directories):
        raise Refused(f"{field} names a node path outside every {flag}")
    try:
        real = os.path.realpath(value, strict=True)
        if not any(Path(real).is_relative_to(d) for d in directories):
            raise Refused(f"{field} names a node path outside every {flag}")
        if not stat.S_ISREG(mode := os.lstat(real).st_mode):
            raise Refused(f"{field}: the node path is {_kind(mode)}, not a regular file")
        descriptor = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        reason = _REASONS.get(exc.errno or 0, type(exc).__name__)
        raise NotFound(f"{field}: the node file cannot be read ({reason})") from exc
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):  # swapped since the lstat
        os.close(descriptor)
        raise Refused(f"{field}: the node path is {_kind(mode)}, not a regular file")
    fcntl.fcntl(descriptor, fcntl.F_SETFL, fcntl.fcntl(descriptor, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return _Descriptor(descriptor)


class NodeFile:
    """An opened node file: ``size`` when opened, ``read`` at an offset, ``close`` (always call it)."""

    def __init__(self, worker: _Worker, descriptor: int, size: int, *, field: str, seconds: float) -> None:
        self._worker, self._descriptor, self.size = worker, descriptor, size
        self._field, self._seconds = field, seconds

    async def read(self, size: int, offset: int) -> bytes:
        """Up to ``size`` bytes at ``offset`` (b"" at the end)."""
        data: bytes = await self._worker.call(os.pread, self._descriptor, size, offset, seconds=self._seconds,
                                              what=f"{self._field}: reading the node file")
        return data

    async def close(self) -> None:
        """Release the descriptor (on the file's thread, after any read still running) and the thread."""
        if self._descriptor >= 0:
            descriptor, self._descriptor = self._descriptor, -1
            if not self._worker.stuck:
                with contextlib.suppress(UpstreamUnavailable, OSError):
                    await self._worker.call(os.close, descriptor, seconds=self._seconds, what=self._field)
            self._worker.stop()

    async def read_all(self, limit: int, too_large: str) -> bytes:
        """The whole file (at most ``limit`` bytes, else UpstreamError ``too_large``)."""
        if self.size > limit:
            raise UpstreamError(too_large)
        data = bytearray()
        while chunk := await self.read(min(1 << 20, limit + 1 - len(data)), len(data)):
            data += chunk
            if len(data) > limit:
                raise UpstreamError(too_large)
        return bytes(data)


async def open_node_file(value: str, directories: tuple[Path, ...], *, field: str, flag: str,
                         seconds: float) -> NodeFile:
    """The regular file ``value`` names under ``directories`` (``flag`` allows them), opened without blocking."""
    if not directories:
        raise Refused(f"{field} names a node path, and no {flag} allows node paths")
    worker = _Worker(f"imds-node-file {field}")
    try:
        descriptor: int = await worker.call(_open, value, directories, field, flag, seconds=seconds,
                                            what=f"{field}: opening the node file")
        size = os.fstat(descriptor).st_size
    except BaseException:
        worker.stop()
        raise
    return NodeFile(worker, descriptor, size, field=field, seconds=seconds)
