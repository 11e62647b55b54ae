"""The connection a group commit writes through: one interface over PostgreSQL and SQLite.

PostgreSQL goes through the async engine (asyncpg): each statement is one round trip and
nothing else. SQLite's async driver (aiosqlite) runs every call on its own thread, and a
statement costs three or four hand-offs to it and back (cursor, execute, fetch, close),
each a thread wake-up of 100 to 200 µs on a virtual machine: ten statements of a few
microseconds took 8 ms. So SQLite writes use a plain (synchronous) connection instead:

- ``COMMIT`` (which waits for fsync), statements run for many rows (bulk import: as
  positional tuples, see ``manyrows``), and
  ``BEGIN IMMEDIATE`` when another process holds the write lock (it waits for it, up to the
  busy timeout) go to the store's writer thread;
- everything else runs on the event loop itself: ``BEGIN IMMEDIATE`` is first tried there
  with no busy timeout (the lock is free unless another process writes), and once the
  lock is held no statement waits for anyone, each a few microseconds of page-cache work;
  a connection goes back to the pool there too once its transaction has ended.

So a group commit hands one call to the thread (its ``COMMIT``), not three: each hand-off
also costs the event loop a GIL round trip with the woken thread.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import CursorResult, Dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncTransaction
from sqlalchemy.sql import Executable

from imds.store.sql import manyrows
from imds.store.sql.connect import confirm_commit

_T = TypeVar("_T")


class Savepoint(Protocol):
    """A nested transaction: one write block of a group, undone alone when it fails."""

    async def commit(self) -> None:
        """Release the savepoint (its work stays in the group's transaction)."""

    async def rollback(self) -> None:
        """Undo the block's work."""


class WriteConnection(Protocol):
    """A connection inside an open write transaction."""

    @property
    def dialect(self) -> Dialect:
        """The database's SQLAlchemy dialect."""

    async def execute(self, statement: Executable, parameters: Any = None) -> CursorResult[Any]:
        """Run one statement (``parameters`` a list runs it once per item); the result is buffered."""

    async def begin_nested(self) -> Savepoint:
        """Open a savepoint."""

    async def commit(self) -> None:
        """Commit the transaction (durable when this returns)."""

    async def close(self) -> None:
        """Give the connection back; an open transaction is rolled back."""


class _AsyncSavepoint:
    def __init__(self, transaction: AsyncTransaction) -> None:
        self._transaction = transaction

    async def commit(self) -> None:
        await self._transaction.commit()

    async def rollback(self) -> None:
        await self._transaction.rollback()


class AsyncWrite:
    """A write connection over the async engine (PostgreSQL)."""

    def __init__(self, conn: AsyncConnection) -> None:
        self._conn = conn

    @classmethod
    async def open(cls, engine: AsyncEngine) -> AsyncWrite:
        """Connect and begin a transaction."""
        conn = await engine.connect()
        try:
            await conn.begin()
        except BaseException:
            await conn.close()
            raise
        return cls(conn)

    @property
    def dialect(self) -> Dialect:
        return self._conn.dialect

    async def execute(self, statement: Executable, parameters: Any = None) -> CursorResult[Any]:
        return await self._conn.execute(statement, parameters)

    async def begin_nested(self) -> Savepoint:
        return _AsyncSavepoint(await self._conn.begin_nested())

    async def commit(self) -> None:
        """Commit; CommitNotConfirmed when the synchronous standby never confirmed it (see ``connect``)."""
        await self._conn.commit()
        confirm_commit((await self._conn.get_raw_connection()).driver_connection)

    async def close(self) -> None:
        await self._conn.close()


class _InlineSavepoint:
    def __init__(self, transaction: sa.NestedTransaction) -> None:
        self._transaction = transaction

    async def commit(self) -> None:
        self._transaction.commit()

    async def rollback(self) -> None:
        self._transaction.rollback()


_LOCK_HELD = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
INLINE_ROWS = 64  # a statement run for more rows than this goes to the thread (bulk import)


class InlineWrite:
    """A write connection over a synchronous SQLite engine: statements inline, waits in a thread.

    Every call that goes to the thread goes to the store's one writer thread, in order, and
    is never dropped halfway: a caller cancelled meanwhile leaves it to finish (a
    connection holding SQLite's write lock must always be closed).
    """

    def __init__(self, conn: sa.Connection, thread: Executor) -> None:
        self._conn = conn
        self._thread = thread

    @classmethod
    async def open(cls, engine: sa.Engine, thread: Executor) -> InlineWrite:
        """Connect and ``BEGIN IMMEDIATE`` (the engine's begin hook): here if the lock is free, else on the thread."""
        conn = _begin_unless_locked(engine)
        if conn is not None:
            return cls(conn, thread)

        def connect() -> sa.Connection:
            conn = engine.connect()
            try:
                conn.begin()
            except BaseException:
                conn.close()
                raise
            return conn

        opening = asyncio.get_running_loop().run_in_executor(thread, connect)
        try:
            return cls(await asyncio.shield(opening), thread)
        except asyncio.CancelledError:
            opening.add_done_callback(lambda done: _close_later(done, thread))
            raise

    @property
    def dialect(self) -> Dialect:
        return self._conn.dialect

    async def execute(self, statement: Executable, parameters: Any = None) -> CursorResult[Any]:
        if isinstance(parameters, list) and len(parameters) > INLINE_ROWS:
            return await self._in_thread(lambda: self._many(statement, parameters))
        return self._conn.execute(statement, parameters)

    def _many(self, statement: Executable, rows: list[Any]) -> CursorResult[Any]:
        """One statement for many rows: as positional tuples when it can be (``manyrows``)."""
        found = manyrows.positional_rows(self._conn.dialect, statement, rows)
        return self._conn.execute(statement, rows) if found is None else self._conn.exec_driver_sql(*found)

    async def begin_nested(self) -> Savepoint:
        return _InlineSavepoint(self._conn.begin_nested())

    async def commit(self) -> None:
        await self._in_thread(self._conn.commit)

    async def close(self) -> None:
        if self._conn.in_transaction():  # rolled back on the thread
            await self._in_thread(self._conn.close)
        else:  # committed: back to the pool, nothing to wait for
            self._conn.close()

    async def _in_thread(self, call: Callable[[], _T]) -> _T:
        return await asyncio.shield(asyncio.get_running_loop().run_in_executor(self._thread, call))


def _begin_unless_locked(engine: sa.Engine) -> sa.Connection | None:
    """A pooled connection in a new write transaction, without waiting; None when that would wait.

    None when another connection holds the write lock, or when the pool has no idle
    connection (opening one sets up the session, which may wait for a lock too).
    """
    pool = engine.pool
    if not isinstance(pool, sa.QueuePool) or not pool.checkedin():
        return None
    conn = engine.connect()
    try:
        raw = conn.connection.dbapi_connection
        assert raw is not None  # noqa: S101 - a pooled connection that was just checked out
        busy = raw.execute("PRAGMA busy_timeout").fetchone()[0]
        raw.execute("PRAGMA busy_timeout=0")
        try:
            conn.begin()
        finally:
            raw.execute(f"PRAGMA busy_timeout={int(busy)}")
    except sa.exc.OperationalError as exc:
        conn.close()
        if getattr(exc.orig, "sqlite_errorcode", 0) & 0xFF in _LOCK_HELD:  # primary code of an extended one
            return None
        raise
    except BaseException:
        conn.close()
        raise
    return conn


def _close_later(opened: asyncio.Future[sa.Connection], thread: Executor) -> None:
    """Close a connection whose opener was cancelled while it was being opened."""
    if not opened.cancelled() and opened.exception() is None:
        thread.submit(opened.result().close)
