"""``SqlStore``: the ``Store`` protocol over SQLAlchemy Core (SQLite or PostgreSQL).

Rows become ``imds.models`` values in the modules it delegates to, by concern: ``tx``
(a write block), ``group`` (group commit), ``reads``, ``channel`` (events and messages),
``listen`` (the feed's NOTIFY). Here SQLAlchemy errors become ``StoreUnavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection

from imds.config.database import parse_database
from imds.errors import StoreUnavailable
from imds.models import Acknowledgement, AuditEntry, Change, Event, Instance, Notice, ProjectAttributes
from imds.store.interface import StoredInstance
from imds.store.sql import channel, notices, projects, reads
from imds.store.sql.diagnose import describe, is_not_migrated, not_migrated, sqlite_problem
from imds.store.sql.engine import (
    connector_for,
    create_engine,
    create_sqlite_write_engine,
    is_sqlite,
    postgresql_engine,
)
from imds.store.sql.group import GroupCommit
from imds.store.sql.listen import FeedListener
from imds.store.sql.tx import SqlTx
from imds.store.sql.writeconn import AsyncWrite, InlineWrite, WriteConnection

PING_WAIT = 1.0  # seconds a ping (``/readyz``) waits for the database at most


def _retrieved(done: asyncio.Future[None]) -> None:
    """Mark a ping's outcome as seen: nobody may be waiting for it any more."""
    if not done.cancelled():
        done.exception()


class SqlStore:
    """Store over an SQLAlchemy async engine. The database must be migrated."""

    def __init__(
        self, url: str, *, connect_timeout: float = 5.0, statement_timeout: float = 5.0, journal: bool = True,
    ) -> None:
        """``journal=False``: no catalog in this process replays the writes (``imds.store.sql.tx.SqlTx``)."""
        self._url = url
        if (problem := sqlite_problem(url)) is not None:
            raise StoreUnavailable(f"cannot open the database: {problem}")
        self._connect: Callable[[], Awaitable[WriteConnection]]
        self._writer: ThreadPoolExecutor | None = None
        self._write_engine: sa.Engine | None = None
        self._listener: FeedListener | None = None
        self._ping_wait = min(PING_WAIT, connect_timeout)
        self._pinging: asyncio.Future[None] | None = None
        if is_sqlite(url):
            try:
                self._engine = create_engine(url, connect_timeout=connect_timeout, statement_timeout=statement_timeout)
            except OSError as exc:  # the SQLite file's directory cannot be created
                raise StoreUnavailable(f"cannot open the database: {describe(url, exc)}") from exc
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="imds-sqlite-writer")
            self._write_engine = create_sqlite_write_engine(url, statement_timeout=statement_timeout)
            self._connect = functools.partial(InlineWrite.open, self._write_engine, self._writer)
        else:
            connector = connector_for(url, connect_timeout=connect_timeout, statement_timeout=statement_timeout)
            self._engine = postgresql_engine(connector)
            self._connect = functools.partial(AsyncWrite.open, self._engine)
            self._listener = FeedListener(connector)
        make_tx = SqlTx if journal else functools.partial(SqlTx, journaled=False)
        self._group = GroupCommit(self._connect, self._explain, make_tx, notify=self._listener)

    @property
    def engines(self) -> tuple[sa.Engine, ...]:
        """Every (synchronous face of an) engine the store runs statements on: reads, and writes when separate."""
        separate = () if self._write_engine is None else (self._write_engine,)
        return (self._engine.sync_engine, *separate)

    @asynccontextmanager
    async def write(self) -> AsyncIterator[SqlTx]:
        """One write block of a group commit (see ``group``)."""
        async with self._group.member() as tx:
            yield tx

    async def changed(self, within: float) -> None:
        """Wait for a NOTIFY (PostgreSQL) or ``within`` seconds."""
        if self._listener is not None:
            await self._listener.wait(within)
            return
        await asyncio.sleep(within)  # SQLite: poll (this process's own writes reach its catalog directly)

    @asynccontextmanager
    async def _read(self, *, snapshot: bool = False) -> AsyncIterator[AsyncConnection]:
        """A read transaction; ``snapshot`` makes every statement see one moment (REPEATABLE READ).

        SQLite's read transaction (WAL) already sees one moment from its first read on.
        """
        options: dict[str, Any] = {"imds_read": True}
        if snapshot and not is_sqlite(self._url):
            options.update(isolation_level="REPEATABLE READ", postgresql_readonly=True)
        try:
            async with self._engine.connect() as plain:
                conn = await plain.execution_options(**options)
                async with conn.begin():
                    yield conn
        except (SQLAlchemyError, OSError) as exc:
            raise StoreUnavailable(f"database read failed: {self._explain(exc)}") from exc

    def _explain(self, exc: BaseException) -> str:
        """Which database and why, in one line (see ``diagnose``); never SQL or a password."""
        return not_migrated(self._url, exc) if is_not_migrated(exc) else describe(self._url, exc)

    async def get(self, instance_id: str) -> Instance | None:
        """One instance, or None."""
        return (await self.get_many([instance_id])).get(instance_id)

    async def get_many(self, instance_ids: Iterable[str]) -> dict[str, Instance]:
        """The instances that exist among ``instance_ids``, by id (one snapshot)."""
        ids = list(dict.fromkeys(instance_ids))
        if not ids:
            return {}
        async with self._read(snapshot=True) as conn:
            return await reads.load(conn, ids)

    async def snapshot(self) -> tuple[list[Instance], int]:
        """Every instance and the feed position, in one snapshot."""
        async with self._read(snapshot=True) as conn:
            seq = await reads.position(conn)
            return list((await reads.load(conn, None)).values()), seq

    async def snapshot_chunks(self, size: int) -> AsyncIterator[tuple[list[StoredInstance], int, int]]:
        """The snapshot in stored form, ``size`` instances at a time, in one read transaction."""
        async with self._read(snapshot=True) as conn:
            async for chunk in reads.stored_chunks(conn, size):
                yield chunk

    async def changes_since(self, seq: int, limit: int = 1000) -> list[Change]:
        """Change-feed entries after ``seq``, oldest first."""
        async with self._read() as conn:
            return await reads.changes_after(conn, seq, limit)

    async def projects(self, project_ids: Iterable[str] | None = None) -> dict[str, ProjectAttributes]:
        """The attributes of these projects (every project's with None), by project id."""
        async with self._read() as conn:
            return await projects.read(conn, project_ids)

    async def notices(self, notice_ids: Iterable[str] | None = None) -> dict[str, Notice]:
        """These notices (every one with None), by id."""
        async with self._read() as conn:
            return await notices.read(conn, notice_ids)

    async def acknowledgements(self, notice_ids: Iterable[str]) -> list[Acknowledgement]:
        """The acknowledgements of these notices, oldest first."""
        async with self._read() as conn:
            return await notices.acks(conn, notice_ids)

    async def ping(self) -> None:
        """Return when the database answers (a read of the feed head) within ``PING_WAIT`` seconds.

        One ping at a time: a caller that gives up leaves it running, and the next caller
        waits for the same one, so a frozen database never piles up pings, and ``/readyz``
        answers within ``PING_WAIT`` whatever the database does.
        """
        if self._pinging is None or self._pinging.done():
            self._pinging = asyncio.ensure_future(self._ping_once())
            self._pinging.add_done_callback(_retrieved)
        try:
            async with asyncio.timeout(self._ping_wait):
                await asyncio.shield(self._pinging)
        except TimeoutError:
            where = parse_database(self._url).where
            msg = f"database read failed: {where}: no answer within {self._ping_wait:g} s (still waiting)"
            raise StoreUnavailable(msg) from None

    async def _ping_once(self) -> None:
        async with self._read() as conn:
            await reads.position(conn)

    async def audit(self, instance_id: str | None, after: int, limit: int) -> list[AuditEntry]:
        """Audit entries after ``after``, oldest first."""
        async with self._read() as conn:
            return await reads.audit_entries(conn, instance_id, after, limit)

    async def close(self) -> None:
        """Stop the listener and a ping, roll back an open group, release both engines."""
        if self._pinging is not None:
            self._pinging.cancel()
            with contextlib.suppress(BaseException):
                await self._pinging
        if self._listener is not None:
            await self._listener.close()
        await self._group.close()
        await self._engine.dispose()
        if self._writer is not None and self._write_engine is not None:
            await asyncio.get_running_loop().run_in_executor(self._writer, self._write_engine.dispose)
            self._writer.shutdown()

    # --- the instance<->host channel ------------------------------------------------------

    @asynccontextmanager
    async def _channel_tx(self) -> AsyncIterator[WriteConnection]:
        """A channel write (events, messages): one all-or-nothing block of a group commit.

        Blocks are serialised (in this process by the group, across processes by the
        feed-head lock every group holds), so an instance's event cursors are allocated
        and committed in one order; the caller hears back only after the commit.
        """
        async with self._group.member() as tx:
            yield tx.conn

    async def append_event(
        self, instance_id: str, state: str, code: int | None, message: str | None, *, retain: int
    ) -> Event:
        """Store one event; keep the instance's newest ``retain``."""
        async with self._channel_tx() as conn:
            return await channel.append_event(conn, instance_id, state, code, message, retain=retain)

    async def events_after(self, instance_id: str, after: int, limit: int) -> list[Event]:
        """The instance's events after ``after``, oldest first."""
        async with self._read() as conn:
            return await channel.events_after(conn, instance_id, after, limit)

    async def latest_event_cursor(self) -> int:
        """The highest event cursor (0 when there is none)."""
        async with self._read() as conn:
            return await channel.latest_event_cursor(conn)

    async def queue_message(self, instance_id: str, body: bytes, *, max_queued: int) -> int | None:
        """Queue a message; its id, or None when the queue is full."""
        async with self._channel_tx() as conn:
            return await channel.queue_message(conn, instance_id, body, max_queued=max_queued)

    async def take_message(self, instance_id: str) -> bytes | None:
        """Remove and return the oldest message, exactly once, or None."""
        async with self._channel_tx() as conn:
            return await channel.take_message(conn, instance_id)
