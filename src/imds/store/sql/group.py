"""Group commit: the write blocks that wait at the same moment share one transaction.

``GroupCommit.member()`` hands each block a write context (``make_tx(conn, seq)``) inside
the group's open transaction. One fsync (SQLite) or one commit round trip (PostgreSQL)
then covers every block of the group, yet each block stays all-or-nothing (a savepoint)
and leaves ``member()`` only after the commit that made it durable.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Generic, Protocol, TypeVar

from sqlalchemy.exc import SQLAlchemyError

from imds.errors import StoreUnavailable
from imds.store.journal import Group, Journal
from imds.store.sql import statements
from imds.store.sql.writeconn import Savepoint, WriteConnection

_T = TypeVar("_T")
GROUP_MAX = 256  # write blocks per group commit, so one commit never waits on an endless queue


class OwnHeads(Protocol):
    """Told of this process's own commits, so their ``NOTIFY`` wakes no follower here (``FeedListener``)."""

    def expect(self, head: int) -> None:
        """A commit moving the feed head to ``head`` is about to be sent."""

    def failed(self, head: int) -> None:
        """That commit failed (or its outcome is unknown)."""


class Block(Protocol):
    """What a write context tells the group: the feed head it reached, its feed and audit rows, its journal.

    Feed and audit rows are inserted by the group's commit (one statement each for the
    whole group), so a block that raises simply leaves its rows unsent.
    """

    seq: int
    feed_rows: list[dict[str, Any]]
    audit_rows: list[dict[str, Any]]
    journal: Journal


_Tx = TypeVar("_Tx", bound=Block)


class _Batch:
    """One open transaction that write blocks join one after another (group commit)."""

    def __init__(self, conn: WriteConnection, seq: int) -> None:
        self.conn = conn
        self.start = self.seq = seq
        self.feed_rows: list[dict[str, Any]] = []
        self.audit_rows: list[dict[str, Any]] = []
        self.group = Group(seq)
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class GroupCommit(Generic[_Tx]):
    """Commits the write blocks that wait at the same moment in one transaction.

    Blocks run one at a time (``_turn``). The first block of a batch opens the
    transaction and locks the feed head; each later block runs inside a savepoint, so
    one that raises is rolled back alone. When a block ends and nobody is waiting for a
    turn (or the batch is full), it commits the batch: the feed rows in one insert, the
    audit rows in another, the feed head, ``NOTIFY`` on PostgreSQL, one commit. This
    process's catalog applies its own commits (``Catalog.written``), so ``notify`` (the
    feed listener) is told which heads are its own and wakes no follower for them. Every block of the batch leaves
    ``write()`` only after that commit, and raises StoreUnavailable if it failed.
    """

    def __init__(
        self, connect: Callable[[], Awaitable[WriteConnection]], explain: Callable[[BaseException], str],
        make_tx: Callable[[WriteConnection, int], _Tx], *, notify: OwnHeads | None,
    ) -> None:
        self._connect = connect  # a connection in a new write transaction
        self._make_tx = make_tx
        self._notify = notify  # PostgreSQL: NOTIFY with each commit, and tell the listener which are ours
        self._explain = explain
        self._turn = asyncio.Lock()
        self._waiting = 0
        self._batch: _Batch | None = None
        self._last: Group | None = None  # the group committed last
        self._flushes: set[asyncio.Task[None]] = set()

    @asynccontextmanager
    async def member(self) -> AsyncIterator[_Tx]:
        self._waiting += 1
        try:
            await self._turn.acquire()
        except BaseException:
            self._waiting -= 1
            self._flush_soon()  # it may have been the member a batch was kept open for
            raise
        self._waiting -= 1
        try:
            batch = self._batch if self._batch is not None else await self._open()
            tx = self._make_tx(batch.conn, batch.seq)
            savepoint = await self._guard(batch.conn.begin_nested()) if batch.group.members else None
            try:
                yield tx
            except (SQLAlchemyError, OSError) as exc:
                await self._undo(batch, savepoint)
                raise StoreUnavailable(f"database write failed: {self._explain(exc)}") from exc
            except BaseException:
                await self._undo(batch, savepoint)
                raise
            if savepoint is not None:
                await self._guard(savepoint.commit(), batch)
            batch.seq = tx.seq
            batch.feed_rows += tx.feed_rows
            batch.audit_rows += tx.audit_rows
            batch.group.add(tx.journal)
            await self._settle()
        finally:
            self._turn.release()
        await batch.done

    async def _guard(self, step: Awaitable[_T], batch: _Batch | None = None) -> _T:
        """Await a database step; on failure give up the open batch and raise StoreUnavailable."""
        try:
            return await step
        except (SQLAlchemyError, OSError) as exc:
            error = StoreUnavailable(f"database write failed: {self._explain(exc)}")
            await self._abandon(batch or self._batch, error)
            raise error from exc

    async def _open(self) -> _Batch:
        async def begin() -> _Batch:
            conn = await self._connect()
            try:
                lock = statements.FEED_HEAD_LOCKED if self._notify is None else statements.PG_FEED_HEAD_LOCKED
                head = await conn.execute(lock)
                return _Batch(conn, int(head.scalar_one()))
            except BaseException:
                await conn.close()
                raise

        self._batch = await self._guard(begin())
        return self._batch

    async def _undo(self, batch: _Batch, savepoint: Savepoint | None) -> None:
        """Roll back one block (its savepoint, or the batch when it was the first); commit the rest if due."""
        if savepoint is None:
            await self._abandon(batch, None)
            return
        await self._guard(savepoint.rollback(), batch)
        with contextlib.suppress(StoreUnavailable):  # the finished blocks hear of it through ``done``
            await self._settle()

    async def _settle(self) -> None:
        """Commit the open batch unless another block is waiting to join it (and it has room)."""
        batch = self._batch
        members = 0 if batch is None else len(batch.group.members)
        if batch is not None and members and (self._waiting == 0 or members >= GROUP_MAX):
            await self._commit(batch)

    async def _commit(self, batch: _Batch) -> None:
        async def finish() -> None:
            if self._notify is None:
                await self._finish_rows(batch)
                await batch.conn.commit()
                return
            moves = batch.seq != batch.start
            if moves:
                self._notify.expect(batch.seq)
            try:
                if moves or batch.audit_rows:
                    await batch.conn.execute(statements.GROUP_ROWS_AND_HEAD, statements.group_rows_and_head(
                        batch.feed_rows, batch.audit_rows, batch.seq))
                await batch.conn.commit()
            except BaseException:
                if moves:
                    self._notify.failed(batch.seq)
                raise

        await self._guard(finish(), batch)
        batch.group.follow(self._last)
        self._last = batch.group
        self._batch = None
        await batch.conn.close()
        batch.done.set_result(None)

    @staticmethod
    async def _finish_rows(batch: _Batch) -> None:
        """SQLite: the group's feed rows, its audit rows and the head, one statement each."""
        if batch.feed_rows:
            await batch.conn.execute(statements.FEED_ROWS, batch.feed_rows)
        if batch.audit_rows:
            await batch.conn.execute(statements.AUDIT_ROWS, batch.audit_rows)
        if batch.seq != batch.start:
            await batch.conn.execute(statements.MOVE_HEAD, {"head": batch.seq})

    async def _abandon(self, batch: _Batch | None, error: StoreUnavailable | None) -> None:
        """Roll back and drop ``batch``; its finished blocks fail with ``error``."""
        if batch is None:
            return
        if self._batch is batch:
            self._batch = None
        with contextlib.suppress(SQLAlchemyError, OSError):
            await batch.conn.close()  # closing rolls back whatever is open
        if batch.done.done():
            return
        if batch.group.members:
            batch.done.set_exception(error or StoreUnavailable("database write failed"))
            batch.done.exception()  # retrieved here: the committing block may be its only member
        else:
            batch.done.set_result(None)

    def _flush_soon(self) -> None:
        """Commit an open batch whose next member went away while waiting."""

        async def flush() -> None:
            async with self._turn:
                with contextlib.suppress(StoreUnavailable):
                    await self._settle()

        task = asyncio.get_running_loop().create_task(flush())
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def close(self) -> None:
        """Roll back a batch still open (its blocks fail) and end pending flushes."""
        for task in list(self._flushes):
            with contextlib.suppress(asyncio.CancelledError, StoreUnavailable):
                await task
        await self._abandon(self._batch, StoreUnavailable("the store was closed"))
