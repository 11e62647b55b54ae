"""Coalescing: single requests that arrive together are carried out as one batch.

An admin upsert costs about ten SQL statements whether it carries one instance or a
hundred (``Records.put_many``). ``Coalescer.submit`` queues one item; a drain task runs
whatever is queued as one batch, and what arrives meanwhile waits for the next batch. A
lone request is a batch of one and waits for nobody; under load, batches grow by
themselves (to ``max_batch``) and the statements per write fall.

Each caller still gets its own answer or its own error. A batch that fails with an
error the store did not raise (a bug, an item the batch form rejects) is retried one
item at a time, so one bad item never fails the others; a store outage fails the batch
at once (every item would wait out the same timeout alone). An item whose caller went
away before its batch started is dropped; one already in a batch is carried out.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from imds.errors import StoreUnavailable

_In = TypeVar("_In")
_Out = TypeVar("_Out")


class Coalescer(Generic[_In, _Out]):
    """Runs concurrently submitted items in batches through ``run`` (one result per item, in order)."""

    def __init__(self, run: Callable[[Sequence[_In]], Awaitable[Sequence[_Out]]], *, max_batch: int) -> None:
        self._run = run
        self._max = max_batch
        self._queue: list[tuple[_In, asyncio.Future[_Out]]] = []
        self._running: list[tuple[_In, asyncio.Future[_Out]]] = []  # the batch being carried out
        self._drain: asyncio.Task[None] | None = None

    async def submit(self, item: _In) -> _Out:
        """Queue ``item`` and wait for its batch's result for it."""
        future: asyncio.Future[_Out] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        if self._drain is None:  # its own context: no caller's log bindings on the batch's lines
            self._drain = asyncio.create_task(self._drain_queue(), name="imds-coalesce", context=contextvars.Context())
        return await future

    async def _drain_queue(self) -> None:
        try:
            while self._queue:
                taken, self._queue = self._queue[: self._max], self._queue[self._max :]
                self._running = [(item, future) for item, future in taken if not future.done()]
                if self._running:
                    await self._carry_out(self._running)
        except BaseException:  # cancelled at shutdown: nobody is left waiting forever
            for _, future in self._running + self._queue:
                _settle(future, StoreUnavailable("the service is stopping"))
            self._queue = []
            raise
        finally:
            self._running = []
            self._drain = None

    async def _carry_out(self, batch: list[tuple[_In, asyncio.Future[_Out]]]) -> None:
        try:
            results = await self._run([item for item, _ in batch])
        except Exception as exc:  # noqa: BLE001 - every error goes to its callers, or the items are retried alone
            if len(batch) == 1 or isinstance(exc, StoreUnavailable):
                for _, future in batch:
                    _settle(future, exc)
                return
            for single in batch:  # find the item at fault: the others still succeed
                await self._carry_out([single])
            return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)


def _settle(future: asyncio.Future[_Out], exc: Exception) -> None:
    if not future.done():
        future.set_exception(exc)
