"""``SqlStore``: the ``Store`` protocol over SQLAlchemy Core (SQLite or PostgreSQL).

Rows become ``imds.models`` values here; SQLAlchemy errors become ``StoreUnavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import ipaddress
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncTransaction

from imds.errors import StoreUnavailable
from imds.models import METADATA, USERDATA, Change, Instance, JsonObject, Network, OsRecord
from imds.store.journal import ADDRESSES, FORGET, PUT, REMOVE, Journal, Op
from imds.store.sql.diagnose import describe, is_not_migrated, not_migrated, sqlite_problem
from imds.store.sql.engine import create_engine, is_sqlite
from imds.store.sql.listen import CHANNEL, FeedListener
from imds.store.sql.os_rows import os_document, os_record
from imds.store.sql.tables import (
    changes,
    feed_head,
    instance_ip_addresses,
    instance_metadata,
    instance_os,
    instance_passwords,
    instance_userdata,
    instances,
)

_CHUNK = 500  # stays far below SQLite's bound-parameter limit
_GROUP_MAX = 256  # write blocks per group commit, so one commit never waits on an endless queue
_T = TypeVar("_T")
_RECORD_TABLES = {METADATA: instance_metadata}


def _record_table(kind: str) -> sa.Table:
    return _RECORD_TABLES.get(kind, instance_userdata)


def _utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every datetime imds stores is UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start : start + _CHUNK]


class _SqlTx:
    """One write block inside a (possibly shared) transaction; ``seq`` is the feed head so far.

    Fewer statements than one per primitive: instance rows are created with an upsert
    and remembered, records are upserted in one statement, an address list is read in
    one query, and change-feed rows are written by the group's commit in one insert.
    """

    def __init__(self, conn: AsyncConnection, seq: int) -> None:
        self._conn = conn
        self.seq = seq
        self.journal = Journal(start=seq, end=seq)
        self.feed_rows: list[dict[str, Any]] = []
        self._known: set[str] = set()  # instance rows known to exist in this transaction
        self._insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert

    async def _ensure_instance(self, instance_id: str) -> None:
        if instance_id in self._known:
            return
        await self._conn.execute(self._insert(instances).values(id=instance_id).on_conflict_do_nothing())
        self._known.add(instance_id)

    async def _put(self, table: sa.Table, instance_id: str, values: dict[str, Any]) -> datetime:
        await self._ensure_instance(instance_id)
        now = datetime.now(UTC)
        values = {**values, "updated_at": now}
        statement = self._insert(table).values(instance_id=instance_id, **values)
        await self._conn.execute(statement.on_conflict_do_update(index_elements=[table.c.instance_id], set_=values))
        return now

    async def metadata_of(self, instance_id: str) -> JsonObject | None:
        row = await self._conn.execute(
            sa.select(instance_metadata.c.document).where(instance_metadata.c.instance_id == instance_id)
        )
        document: JsonObject | None = row.scalar_one_or_none()
        if document is not None:
            self._known.add(instance_id)
        return document

    async def has_record(self, kind: str, instance_id: str) -> bool:
        table = _record_table(kind)
        row = await self._conn.execute(sa.select(table.c.instance_id).where(table.c.instance_id == instance_id))
        found = row.first() is not None
        if found:
            self._known.add(instance_id)
        return found

    async def put_metadata(self, instance_id: str, document: JsonObject) -> None:
        at = await self._put(instance_metadata, instance_id, {"document": document})
        self.journal.ops.append(Op(PUT, instance_id, METADATA, copy.deepcopy(document), at))

    async def put_userdata(self, instance_id: str, userdata: bytes) -> None:
        at = await self._put(instance_userdata, instance_id, {"userdata": userdata})
        self.journal.ops.append(Op(PUT, instance_id, USERDATA, bytes(userdata), at))

    async def remove_record(self, kind: str, instance_id: str) -> bool:
        table = _record_table(kind)
        result = await self._conn.execute(table.delete().where(table.c.instance_id == instance_id))
        if result.rowcount:
            self.journal.ops.append(Op(REMOVE, instance_id, METADATA if table is instance_metadata else USERDATA))
        return bool(result.rowcount)

    async def replace_addresses(
        self, instance_id: str, addresses: Sequence[Network]
    ) -> tuple[dict[Network, str], tuple[Network, ...]]:
        await self._ensure_instance(instance_id)
        t = instance_ip_addresses
        wanted = {str(a): a for a in addresses}
        held: list[str] = []
        owners: dict[str, str] = {}
        # One query finds both this instance's addresses and the holders of the wanted ones.
        for number, chunk in enumerate(_chunks(list(wanted)) if wanted else [()]):
            mine = t.c.instance_id == instance_id if number == 0 else sa.false()
            query = sa.select(t.c.address, t.c.instance_id).where(mine | t.c.address.in_(chunk))
            rows = await self._conn.execute(query)
            for row in rows:
                if row.instance_id == instance_id:
                    held.append(row.address)
                if row.address in wanted:
                    owners[row.address] = row.instance_id
        dropped = sorted(a for a in held if a not in wanted)
        if dropped:
            await self._conn.execute(t.delete().where(t.c.address.in_(dropped)))
        moved = {wanted[a]: owner for a, owner in owners.items() if owner != instance_id}
        if moved:
            await self._conn.execute(
                t.update().where(t.c.address.in_([str(a) for a in moved])).values(instance_id=instance_id)
            )
        new = [{"address": a, "instance_id": instance_id} for a in wanted if a not in owners]
        if new:
            await self._conn.execute(t.insert(), new)
        self.journal.ops.append(Op(ADDRESSES, instance_id, value=tuple(wanted.values()), moved=moved))
        return moved, tuple(ipaddress.ip_network(a) for a in dropped)

    async def forget_instance(self, instance_id: str) -> None:
        await self._conn.execute(
            instance_ip_addresses.delete().where(instance_ip_addresses.c.instance_id == instance_id)
        )
        await self.remove_password(instance_id)  # the foreign key cascades too; this does not rely on it
        await self.remove_os(instance_id)
        await self._conn.execute(instances.delete().where(instances.c.id == instance_id))
        self._known.discard(instance_id)
        self.journal.ops.append(Op(FORGET, instance_id))

    async def mark_changed(self, instance_ids: Iterable[str]) -> None:
        # The rows are inserted when the group commits (one insert), so a block that
        # raises later leaves none behind.
        for instance_id in dict.fromkeys(instance_ids):
            self.seq += 1
            self.feed_rows.append({"seq": self.seq, "instance_id": instance_id})
        self.journal.end = self.seq

    async def put_password(self, instance_id: str, password: bytes) -> bool:
        t = instance_passwords
        held = await self._conn.execute(sa.select(t.c.instance_id).where(t.c.instance_id == instance_id))
        if held.first() is not None:
            return False
        await self._conn.execute(
            t.insert().values(instance_id=instance_id, password=password, updated_at=datetime.now(UTC))
        )
        self.journal.ops.append(Op(PUT, instance_id, "password", bytes(password)))
        return True

    async def remove_password(self, instance_id: str) -> bool:
        t = instance_passwords
        result = await self._conn.execute(t.delete().where(t.c.instance_id == instance_id))
        if result.rowcount:
            self.journal.ops.append(Op(REMOVE, instance_id, "password"))
        return bool(result.rowcount)

    async def os_of(self, instance_id: str) -> OsRecord | None:
        t = instance_os
        row = await self._conn.execute(sa.select(t.c.document).where(t.c.instance_id == instance_id))
        document: JsonObject | None = row.scalar_one_or_none()
        return None if document is None else os_record(document)

    async def put_os(self, instance_id: str, record: OsRecord) -> None:
        document = os_document(record)
        await self._put(instance_os, instance_id, {"document": document})
        self.journal.ops.append(Op(PUT, instance_id, "os", os_record(copy.deepcopy(document))))

    async def remove_os(self, instance_id: str) -> bool:
        t = instance_os
        result = await self._conn.execute(t.delete().where(t.c.instance_id == instance_id))
        if result.rowcount:
            self.journal.ops.append(Op(REMOVE, instance_id, "os"))
        return bool(result.rowcount)


class _Batch:
    """One open transaction that write blocks join one after another (group commit)."""

    def __init__(self, conn: AsyncConnection, seq: int) -> None:
        self.conn = conn
        self.start = self.seq = seq
        self.feed_rows: list[dict[str, Any]] = []
        self.group: list[Journal] = []
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()


class _GroupCommit:
    """Commits the write blocks that wait at the same moment in one transaction.

    Blocks run one at a time (``_turn``). The first block of a batch opens the
    transaction and locks the feed head; each later block runs inside a savepoint, so
    one that raises is rolled back alone. When a block ends and nobody is waiting for a
    turn (or the batch is full), it commits the batch: the feed rows in one insert, the
    feed head, ``NOTIFY`` on PostgreSQL, one commit. Every block of the batch leaves
    ``write()`` only after that commit, and raises StoreUnavailable if it failed.
    """

    def __init__(self, engine: AsyncEngine, url: str, explain: Callable[[BaseException], str]) -> None:
        self._engine = engine
        self._postgres = not is_sqlite(url)
        self._explain = explain
        self._turn = asyncio.Lock()
        self._waiting = 0
        self._batch: _Batch | None = None
        self._flushes: set[asyncio.Task[None]] = set()

    @asynccontextmanager
    async def member(self) -> AsyncIterator[_SqlTx]:
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
            tx = _SqlTx(batch.conn, batch.seq)
            savepoint = await self._guard(batch.conn.begin_nested()) if batch.group else None
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
            tx.journal.group = batch.group
            batch.group.append(tx.journal)
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
            conn = await self._engine.connect()
            try:
                await conn.begin()
                head = await conn.execute(sa.select(feed_head.c.seq).where(feed_head.c.id == 1).with_for_update())
                return _Batch(conn, int(head.scalar_one()))
            except BaseException:
                await conn.close()
                raise

        self._batch = await self._guard(begin())
        return self._batch

    async def _undo(self, batch: _Batch, savepoint: AsyncTransaction | None) -> None:
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
        if batch is not None and batch.group and (self._waiting == 0 or len(batch.group) >= _GROUP_MAX):
            await self._commit(batch)

    async def _commit(self, batch: _Batch) -> None:
        async def finish() -> None:
            if batch.feed_rows:
                await batch.conn.execute(changes.insert(), batch.feed_rows)
            if batch.seq != batch.start:
                await batch.conn.execute(feed_head.update().where(feed_head.c.id == 1).values(seq=batch.seq))
                if self._postgres:
                    await batch.conn.execute(sa.select(sa.func.pg_notify(CHANNEL, str(batch.seq))))
            await batch.conn.commit()

        await self._guard(finish(), batch)
        self._batch = None
        await batch.conn.close()
        batch.done.set_result(None)

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
        if batch.group:
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


class SqlStore:
    """Store over an SQLAlchemy async engine. The database must be migrated."""

    def __init__(self, url: str) -> None:
        self._url = url
        if (problem := sqlite_problem(url)) is not None:
            raise StoreUnavailable(f"cannot open the database: {problem}")
        try:
            self._engine = create_engine(url)
        except OSError as exc:  # the SQLite file's directory cannot be created
            raise StoreUnavailable(f"cannot open the database: {describe(url, exc)}") from exc
        self._group = _GroupCommit(self._engine, url, self._explain)
        self._listener = FeedListener(url) if not is_sqlite(url) else None

    @asynccontextmanager
    async def write(self) -> AsyncIterator[_SqlTx]:
        async with self._group.member() as tx:
            yield tx

    async def changed(self, within: float) -> None:
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

    async def _load(self, conn: AsyncConnection, ids: Sequence[str] | None) -> dict[str, Instance]:
        def where(column: sa.Column[Any], chunk: Sequence[str] | None) -> Any:
            return sa.true() if chunk is None else column.in_(chunk)

        parts: dict[str, dict[str, Any]] = {}
        for chunk in [None] if ids is None else list(_chunks(ids)):
            for row in await conn.execute(sa.select(instances.c.id).where(where(instances.c.id, chunk))):
                parts[row.id] = {"id": row.id, "addresses": []}
            for row in await conn.execute(
                sa.select(instance_metadata).where(where(instance_metadata.c.instance_id, chunk))
            ):
                parts[row.instance_id].update(metadata=row.document, metadata_updated_at=_utc(row.updated_at))
            for row in await conn.execute(
                sa.select(instance_userdata).where(where(instance_userdata.c.instance_id, chunk))
            ):
                parts[row.instance_id].update(userdata=bytes(row.userdata), userdata_updated_at=_utc(row.updated_at))
            for row in await conn.execute(
                sa.select(instance_ip_addresses).where(where(instance_ip_addresses.c.instance_id, chunk))
            ):
                parts[row.instance_id]["addresses"].append(ipaddress.ip_network(row.address))
            for row in await conn.execute(
                sa.select(instance_passwords).where(where(instance_passwords.c.instance_id, chunk))
            ):
                parts[row.instance_id]["password"] = bytes(row.password)
            for row in await conn.execute(sa.select(instance_os).where(where(instance_os.c.instance_id, chunk))):
                parts[row.instance_id]["os"] = os_record(row.document)
        return {
            i: Instance(**{**p, "addresses": tuple(sorted(p["addresses"], key=str))}) for i, p in parts.items()
        }

    async def get(self, instance_id: str) -> Instance | None:
        return (await self.get_many([instance_id])).get(instance_id)

    async def get_many(self, instance_ids: Iterable[str]) -> dict[str, Instance]:
        ids = list(dict.fromkeys(instance_ids))
        if not ids:
            return {}
        async with self._read(snapshot=True) as conn:
            return await self._load(conn, ids)

    async def snapshot(self) -> tuple[list[Instance], int]:
        async with self._read(snapshot=True) as conn:
            seq = (await conn.execute(sa.select(feed_head.c.seq).where(feed_head.c.id == 1))).scalar_one()
            return list((await self._load(conn, None)).values()), int(seq)

    async def changes_since(self, seq: int, limit: int = 1000) -> list[Change]:
        async with self._read() as conn:
            rows = await conn.execute(
                sa.select(changes.c.seq, changes.c.instance_id)
                .where(changes.c.seq > seq)
                .order_by(changes.c.seq)
                .limit(limit)
            )
            return [Change(int(r.seq), r.instance_id) for r in rows]

    async def ping(self) -> None:
        async with self._read() as conn:
            await conn.execute(sa.select(feed_head.c.seq).where(feed_head.c.id == 1))

    async def close(self) -> None:
        if self._listener is not None:
            await self._listener.close()
        await self._group.close()
        await self._engine.dispose()
