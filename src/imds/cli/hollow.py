"""``imds import --from-hollow DSN``: a hollow-metadataservice database as an import source.

The database is read (``imds.services.transfer.hollow_source``) in a worker thread with its
own event loop, a few pages ahead of the writes, and handed over as the same ``(label,
object)`` pairs a file gives; ``HollowItems`` makes them the ``Raw`` items of a file
(``imds.services.transfer.source``), so everything after that (checks, limits, warnings,
batches, outcomes, progress, the report) is ``imds import``'s own.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator
from typing import Any

import click

from imds.errors import ImdsError
from imds.services.records.limits import Limits
from imds.services.transfer.hollow_source import HollowSource, preload
from imds.services.transfer.source import Raw

AHEAD = 4  # pages read ahead of the writes at most (memory stays bounded by the page size)
_PUT_WAIT = 1.0  # seconds between checks for a consumer that has gone


class _Done:
    """The end of the pages."""


class HollowObjects:
    """Every hollow instance as ``(label, upsert object)``; ``total`` is known once started, ``read`` grows."""

    def __init__(self, dsn: str, *, page_size: int, limits: Limits) -> None:
        self._dsn, self._page_size, self._limits = dsn, page_size, limits
        self._pages: queue.Queue[Any] = queue.Queue(maxsize=AHEAD)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.total = 0
        self.read = 0

    def start(self) -> int:
        """Connect and count; the instance count, or a ClickException naming the database and the cause."""
        preload()  # the reader thread must import nothing (see hollow_source.preload)
        self._thread = threading.Thread(target=self._work, name="imds-hollow-reader", daemon=True)
        self._thread.start()
        first = self._next()
        self.total = int(first)
        return self.total

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        """Each instance in id order, labelled ``instance N``; the reader stops when iteration ends early."""
        number = 0
        try:
            while not isinstance(page := self._next(), _Done):
                for obj in page:
                    number += 1
                    yield f"instance {number}", obj
        finally:
            self.close()

    def close(self) -> None:
        """Stop the reader (it ends its snapshot and closes its connection) and wait for it."""
        self._stop.set()
        while self._thread is not None and self._thread.is_alive():
            try:  # unblock a reader waiting for room in the queue
                self._pages.get_nowait()
            except queue.Empty:
                self._thread.join(timeout=_PUT_WAIT)
        self._thread = None

    def _next(self) -> Any:
        item = self._pages.get()
        if isinstance(item, ImdsError):
            self.close()
            raise click.ClickException(item.message) from item
        if isinstance(item, BaseException):
            self.close()
            raise item
        return item

    def _work(self) -> None:
        try:
            asyncio.run(self._read())
        except BaseException as exc:  # noqa: BLE001 - handed to the consuming thread, which raises it
            self._put(exc)

    async def _read(self) -> None:
        async with HollowSource(self._dsn) as source:
            self._put(await source.count())
            async for page in source.pages(self._page_size, self._limits):
                self.read += len(page)
                if not self._put(page):
                    return
        self._put(_Done())

    def _put(self, item: object) -> bool:
        """Queue ``item`` unless the consumer has stopped; whether it was queued."""
        while not self._stop.is_set():
            try:
                self._pages.put(item, timeout=_PUT_WAIT)
            except queue.Full:
                continue
            return True
        return False


class HollowItems:
    """A hollow database as ``imds import``'s source, like a file: ``items()`` reads it from the start.

    It is connected and counted when made (``total``; a ClickException when it cannot be read);
    each further ``items()`` is a new reader and snapshot. ``read()``: how many instances the
    current reader has read so far. Its ids are unique (hollow's primary key), so the import's
    checking pass, which looks for ids given twice, runs only for ``--strict``.
    """

    def __init__(self, dsn: str, *, page_size: int, limits: Limits) -> None:
        self._dsn, self._page_size, self._limits = dsn, page_size, limits
        self._current: HollowObjects | None = None
        self._reader: HollowObjects | None = HollowObjects(dsn, page_size=page_size, limits=limits)
        self.total = self._reader.start()

    def items(self) -> Iterator[Raw]:
        """Every instance as a Raw item labelled ``instance N`` (its ``line`` is N)."""
        reader = self._reader
        if reader is None:
            reader = HollowObjects(self._dsn, page_size=self._page_size, limits=self._limits)
            reader.start()
        self._current, self._reader = reader, None
        return (Raw(label, number, obj) for number, (label, obj) in enumerate(reader, 1))

    def read(self) -> int:
        """Instances read so far by the current reader."""
        return self._current.read if self._current is not None else 0

    def close(self) -> None:
        """Stop any reader."""
        for reader in (self._reader, self._current):
            if reader is not None:
                reader.close()
