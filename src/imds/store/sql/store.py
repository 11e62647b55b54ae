"""``SqlStore``: the ``Store`` protocol over SQLAlchemy Core (SQLite or PostgreSQL).

Rows become ``imds.models`` values here; SQLAlchemy errors become ``StoreUnavailable``.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection

from imds.errors import StoreUnavailable
from imds.models import (
    METADATA,
    USERDATA,
    AuditEntry,
    AuditEvent,
    Change,
    Event,
    Instance,
    JsonObject,
    Network,
    OsRecord,
    stored_network,
)
from imds.store.interface import StoredInstance
from imds.store.journal import ADDRESSES, FORGET, PUT, REMOVE, Journal, Op
from imds.store.sql import statements
from imds.store.sql.diagnose import describe, is_not_migrated, not_migrated, sqlite_problem
from imds.store.sql.engine import create_engine, create_sqlite_write_engine, is_sqlite
from imds.store.sql.group import GroupCommit
from imds.store.sql.listen import FeedListener
from imds.store.sql.os_rows import os_document, os_record
from imds.store.sql.tables import (
    audit_log,
    changes,
    feed_head,
    instance_events,
    instance_ip_addresses,
    instance_messages,
    instance_metadata,
    instance_os,
    instance_passwords,
    instance_userdata,
    instances,
)
from imds.store.sql.writeconn import AsyncWrite, InlineWrite, WriteConnection

_T = TypeVar("_T")
_CHUNK = 500  # stays far below SQLite's bound-parameter limit
_YIELD_EVERY = 2048  # address rows converted between two yields to the event loop
_ABSENT: tuple[None, None] = (None, None)


def _stored_network(text: str) -> Network:
    """A stored address (normalised, or an address with a prefix kept as sent: ``models.stored_network``)."""
    return stored_network(text)

_RECORD_TABLES = {METADATA: instance_metadata}


def _record_table(kind: str) -> sa.Table:
    return _RECORD_TABLES.get(kind, instance_userdata)


def _utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every datetime imds stores is UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def _chunks(items: Sequence[_T]) -> Iterable[Sequence[_T]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start : start + _CHUNK]


def _page(last: str | None, size: int) -> Any:
    """The next ``size`` instances after id ``last``, one row each: id, document text, its time, addresses.

    The stored JSON comes back as text, never parsed here; the addresses as one
    space-separated string (group_concat / string_agg), so an instance costs one row.
    """
    a, m = instance_ip_addresses, instance_metadata
    addresses = (sa.select(sa.func.aggregate_strings(a.c.address, " ")).where(a.c.instance_id == instances.c.id)
                 .scalar_subquery())
    query = (sa.select(instances.c.id, sa.cast(m.c.document, sa.Text), m.c.updated_at, addresses)
             .select_from(instances.outerjoin(m, m.c.instance_id == instances.c.id))
             .order_by(instances.c.id).limit(size))
    return query if last is None else query.where(instances.c.id > last)


def _in_span(column: sa.Column[Any], span: tuple[str | None, str]) -> Any:
    """``span[0] < column <= span[1]`` (no lower bound when ``span[0]`` is None): a range scan of ids."""
    low, high = span
    return sa.and_(column <= high, sa.true() if low is None else column > low)


def _replay_address_lists(
    before: dict[str, str], lists: Sequence[tuple[str, Sequence[Network]]]
) -> tuple[dict[str, str], list[tuple[dict[Network, str], tuple[Network, ...]]]]:
    """``replace_addresses`` applied in order in memory: the final holders, and each call's (moved, dropped)."""
    owners = dict(before)
    holding: dict[str, set[str]] = {}
    for address, holder in owners.items():
        holding.setdefault(holder, set()).add(address)
    results: list[tuple[dict[Network, str], tuple[Network, ...]]] = []
    for instance_id, addresses in lists:
        wanted = {str(a): a for a in addresses}
        mine = holding.setdefault(instance_id, set())
        dropped = sorted(a for a in mine if a not in wanted)
        for address in dropped:
            del owners[address]
            mine.discard(address)
        moved: dict[Network, str] = {}
        for address, network in wanted.items():
            previous = owners.get(address)
            if previous is not None and previous != instance_id:
                moved[network] = previous
                holding[previous].discard(address)
            owners[address] = instance_id
            mine.add(address)
        results.append((moved, tuple(stored_network(a) for a in dropped)))
    return owners, results


class _SqlTx:
    """One write block inside a (possibly shared) transaction; ``seq`` is the feed head so far.

    Fewer statements than one per primitive: instance rows are created with an upsert
    and remembered, records are upserted in one statement, an address list is read in
    one query, and change-feed and audit rows are written by the group's commit (one
    insert each for the whole group).
    """

    def __init__(self, conn: WriteConnection, seq: int) -> None:
        self.conn = conn
        self.seq = seq
        self.journal = Journal(start=seq, end=seq)
        self.feed_rows: list[dict[str, Any]] = []
        self.audit_rows: list[dict[str, Any]] = []
        self._known: set[str] = set()  # instance rows known to exist in this transaction
        self._dialect = conn.dialect.name
        self._insert = pg_insert if self._dialect == "postgresql" else sqlite_insert

    async def _ensure_instance(self, instance_id: str) -> None:
        if instance_id in self._known:
            return
        await self.conn.execute(self._insert(instances).values(id=instance_id).on_conflict_do_nothing())
        self._known.add(instance_id)

    async def _put(self, table: sa.Table, instance_id: str, values: dict[str, Any]) -> datetime:
        await self._ensure_instance(instance_id)
        now = datetime.now(UTC)
        values = {**values, "updated_at": now}
        statement = self._insert(table).values(instance_id=instance_id, **values)
        await self.conn.execute(statement.on_conflict_do_update(index_elements=[table.c.instance_id], set_=values))
        return now

    async def metadata_of(self, instance_id: str) -> JsonObject | None:
        row = await self.conn.execute(
            sa.select(instance_metadata.c.document).where(instance_metadata.c.instance_id == instance_id)
        )
        document: JsonObject | None = row.scalar_one_or_none()
        if document is not None:
            self._known.add(instance_id)
        return document

    async def has_record(self, kind: str, instance_id: str) -> bool:
        table = _record_table(kind)
        row = await self.conn.execute(sa.select(table.c.instance_id).where(table.c.instance_id == instance_id))
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
        result = await self.conn.execute(table.delete().where(table.c.instance_id == instance_id))
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
            rows = await self.conn.execute(query)
            for row in rows:
                if row.instance_id == instance_id:
                    held.append(row.address)
                if row.address in wanted:
                    owners[row.address] = row.instance_id
        dropped = sorted(a for a in held if a not in wanted)
        if dropped:
            await self.conn.execute(t.delete().where(t.c.address.in_(dropped)))
        moved = {wanted[a]: owner for a, owner in owners.items() if owner != instance_id}
        if moved:
            await self.conn.execute(
                t.update().where(t.c.address.in_([str(a) for a in moved])).values(instance_id=instance_id)
            )
        new = [{"address": a, "instance_id": instance_id} for a in wanted if a not in owners]
        for batch in _chunks(new):  # in batches: 60,000 rows' parameters built at once held the event loop
            await self.conn.execute(t.insert(), batch)
        self.journal.ops.append(Op(ADDRESSES, instance_id, value=tuple(wanted.values()), moved=moved))
        return moved, tuple(stored_network(a) for a in dropped)

    async def forget_instance(self, instance_id: str) -> None:
        await self.conn.execute(
            instance_ip_addresses.delete().where(instance_ip_addresses.c.instance_id == instance_id)
        )
        await self.remove_password(instance_id)  # the foreign key cascades too; this does not rely on it
        await self.remove_os(instance_id)
        await self.conn.execute(instances.delete().where(instances.c.id == instance_id))
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
        held = await self.conn.execute(sa.select(t.c.instance_id).where(t.c.instance_id == instance_id))
        if held.first() is not None:
            return False
        await self.conn.execute(
            t.insert().values(instance_id=instance_id, password=password, updated_at=datetime.now(UTC))
        )
        self.journal.ops.append(Op(PUT, instance_id, "password", bytes(password)))
        return True

    async def remove_password(self, instance_id: str) -> bool:
        t = instance_passwords
        result = await self.conn.execute(t.delete().where(t.c.instance_id == instance_id))
        if result.rowcount:
            self.journal.ops.append(Op(REMOVE, instance_id, "password"))
        return bool(result.rowcount)

    async def os_of(self, instance_id: str) -> OsRecord | None:
        t = instance_os
        row = await self.conn.execute(sa.select(t.c.document).where(t.c.instance_id == instance_id))
        document: JsonObject | None = row.scalar_one_or_none()
        return None if document is None else os_record(document)

    async def put_os(self, instance_id: str, record: OsRecord) -> None:
        document = os_document(record)
        await self._put(instance_os, instance_id, {"document": document})
        self.journal.ops.append(Op(PUT, instance_id, "os", os_record(copy.deepcopy(document))))

    async def remove_os(self, instance_id: str) -> bool:
        t = instance_os
        result = await self.conn.execute(t.delete().where(t.c.instance_id == instance_id))
        if result.rowcount:
            self.journal.ops.append(Op(REMOVE, instance_id, "os"))
        return bool(result.rowcount)

    # --- batch forms (imds import): a few statements per batch instead of several per instance

    async def _ensure_instances(self, instance_ids: Iterable[str]) -> None:
        ids = [i for i in dict.fromkeys(instance_ids) if i not in self._known]
        if ids:  # one statement: the rows that exist already are left alone
            await self.conn.execute(statements.ensure_instances(self._dialect), [{"id": i} for i in ids])
        self._known.update(ids)

    async def metadata_of_many(self, instance_ids: Sequence[str]) -> dict[str, JsonObject]:
        documents: dict[str, JsonObject] = {}
        for chunk in _chunks(list(dict.fromkeys(instance_ids))):
            rows = await self.conn.execute(statements.documents_of(self._dialect), {"ids": list(chunk)})
            documents.update({row.instance_id: row.document for row in rows})
        self._known.update(documents)  # a metadata row means the instance row exists
        return documents

    async def put_records(
        self, metadata: Sequence[tuple[str, JsonObject]], userdata: Sequence[tuple[str, bytes]]
    ) -> None:
        if self._dialect != "postgresql":  # PostgreSQL's upserts insert the instance rows themselves
            await self._ensure_instances([i for i, _ in metadata] + [i for i, _ in userdata])
        at = await self._put_many(instance_metadata, "document", dict(metadata))
        self.journal.ops += [Op(PUT, i, METADATA, copy.deepcopy(document), at) for i, document in metadata]
        at = await self._put_many(instance_userdata, "userdata", dict(userdata))
        self.journal.ops += [Op(PUT, i, USERDATA, bytes(data), at) for i, data in userdata]

    async def _put_many(self, table: sa.Table, column: str, values: dict[str, Any]) -> datetime:
        now = datetime.now(UTC)
        if values and self._dialect == "postgresql":  # one statement: the instance rows and the records
            new = [i for i in values if i not in self._known]
            await self.conn.execute(statements.PG_UPSERT_RECORDS[table.name],
                                    statements.pg_upsert_records(new, values, now))
            self._known.update(new)
        elif values:  # one upsert for the whole batch
            await self.conn.execute(statements.upsert_record(self._dialect, table.name),
                                    [{"instance_id": i, column: v, "updated_at": now} for i, v in values.items()])
        return now

    async def replace_addresses_many(
        self, lists: Sequence[tuple[str, Sequence[Network]]]
    ) -> list[tuple[dict[Network, str], tuple[Network, ...]]]:
        ids = list(dict.fromkeys(instance_id for instance_id, _ in lists))
        await self._ensure_instances(ids)
        before: dict[str, str] = {}  # address → holder, for every address this batch touches
        wanted_all = list(dict.fromkeys(str(a) for _, addresses in lists for a in addresses))
        # One query per chunk finds both the batch's instances' addresses and the wanted ones' holders.
        chunks = itertools.zip_longest(_chunks(ids), _chunks(wanted_all), fillvalue=())
        for number, (id_chunk, address_chunk) in enumerate(chunks):
            if number:
                await asyncio.sleep(0)  # SQLite runs these on the event loop: let reads in between chunks
            rows = await self.conn.execute(statements.addresses_touched(self._dialect),
                                           {"ids": list(id_chunk), "addresses": list(address_chunk)})
            before.update({row.address: row.instance_id for row in rows})
        owners, results = _replay_address_lists(before, lists)
        gone = [a for a in before if a not in owners]
        for chunk in _chunks(gone):
            await self.conn.execute(statements.drop_addresses(self._dialect), {"addresses": list(chunk)})
        moved = [{"key": a, "holder": owners[a]} for a in before if a in owners and owners[a] != before[a]]
        if moved:
            await self.conn.execute(statements.MOVE_ADDRESS, moved)
        new = [{"address": a, "instance_id": holder} for a, holder in owners.items() if a not in before]
        if new:
            await self.conn.execute(statements.ADD_ADDRESSES, new)
        for (instance_id, addresses), (moved_from, _) in zip(lists, results, strict=True):
            wanted = tuple({str(a): a for a in addresses}.values())
            self.journal.ops.append(Op(ADDRESSES, instance_id, value=wanted, moved=moved_from))
        return results

    async def append_audit(self, event: AuditEvent) -> None:
        await self.append_audit_many([event])

    async def append_audit_many(self, events: Sequence[AuditEvent]) -> None:
        # Inserted by the group's commit, in this transaction, with the other blocks' rows.
        now = datetime.now(UTC)
        self.audit_rows += [
            {"at": now, "subject": e.subject, "instance_id": e.instance_id, "action": e.action, "kind": e.kind,
             "applied": e.applied, "detail": e.detail}
            for e in events
        ]


class SqlStore:
    """Store over an SQLAlchemy async engine. The database must be migrated."""

    def __init__(self, url: str, *, connect_timeout: float = 5.0, statement_timeout: float = 5.0) -> None:
        self._url = url
        if (problem := sqlite_problem(url)) is not None:
            raise StoreUnavailable(f"cannot open the database: {problem}")
        try:
            self._engine = create_engine(url, connect_timeout=connect_timeout, statement_timeout=statement_timeout)
        except OSError as exc:  # the SQLite file's directory cannot be created
            raise StoreUnavailable(f"cannot open the database: {describe(url, exc)}") from exc
        self._connect: Callable[[], Awaitable[WriteConnection]]
        self._writer: ThreadPoolExecutor | None = None
        self._write_engine: sa.Engine | None = None
        if is_sqlite(url):
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="imds-sqlite-writer")
            self._write_engine = create_sqlite_write_engine(url, statement_timeout=statement_timeout)
            self._connect = functools.partial(InlineWrite.open, self._write_engine, self._writer)
        else:
            self._connect = functools.partial(AsyncWrite.open, self._engine)
        self._listener = FeedListener(url) if not is_sqlite(url) else None
        self._group = GroupCommit(self._connect, self._explain, _SqlTx, notify=self._listener)

    @property
    def engines(self) -> tuple[sa.Engine, ...]:
        """Every (synchronous face of an) engine the store runs statements on: reads, and writes when separate."""
        separate = () if self._write_engine is None else (self._write_engine,)
        return (self._engine.sync_engine, *separate)

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
            rows = await conn.execute(
                sa.select(instance_ip_addresses).where(where(instance_ip_addresses.c.instance_id, chunk))
            )
            for count, row in enumerate(rows, 1):
                parts[row.instance_id]["addresses"].append(_stored_network(row.address))
                if count % _YIELD_EVERY == 0:
                    await asyncio.sleep(0)  # one instance with 60,000 addresses must not hold the event loop
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

    async def snapshot_chunks(self, size: int) -> AsyncIterator[tuple[list[StoredInstance], int, int]]:
        async with self._read(snapshot=True) as conn:
            seq = int((await conn.execute(sa.select(feed_head.c.seq).where(feed_head.c.id == 1))).scalar_one())
            total = int((await conn.execute(sa.select(sa.func.count()).select_from(instances))).scalar_one())
            last: str | None = None
            while True:
                rows = (await conn.execute(_page(last, size))).all()
                if not rows:
                    return
                yield await self._stored(conn, rows, (last, rows[-1][0])), seq, total
                last = rows[-1][0]

    async def _stored(
        self, conn: AsyncConnection, page: Sequence[Any], span: tuple[str | None, str]
    ) -> list[StoredInstance]:
        """One ``_page`` of instances (exactly those with ``span[0] < id <= span[1]``) in stored form."""
        def where(column: sa.Column[Any]) -> Any:
            return _in_span(column, span)

        userdata = {row.instance_id: (bytes(row.userdata), _utc(row.updated_at)) for row in await conn.execute(
            sa.select(instance_userdata).where(where(instance_userdata.c.instance_id)))}
        passwords = {row.instance_id: bytes(row.password) for row in await conn.execute(
            sa.select(instance_passwords).where(where(instance_passwords.c.instance_id)))}
        os_records = {row.instance_id: os_record(row.document) for row in await conn.execute(
            sa.select(instance_os).where(where(instance_os.c.instance_id)))}
        found = []
        for instance_id, document, updated, addresses in page:
            data, data_updated = userdata.get(instance_id, _ABSENT)
            found.append(StoredInstance(
                instance_id, sorted(addresses.split(" ")) if addresses else [], document,
                _utc(updated), data, data_updated,
                passwords.get(instance_id), os_records.get(instance_id),
            ))
        return found

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

    async def audit(self, instance_id: str | None, after: int, limit: int) -> list[AuditEntry]:
        t = audit_log
        query = sa.select(t).where(t.c.seq > after).order_by(t.c.seq).limit(limit)
        if instance_id is not None:
            query = query.where(t.c.instance_id == instance_id)
        async with self._read() as conn:
            rows = await conn.execute(query)
            return [
                AuditEntry(int(r.seq), _utc(r.at) or r.at, AuditEvent(
                    r.subject, r.instance_id, r.action, r.kind, bool(r.applied), r.detail))
                for r in rows
            ]

    async def close(self) -> None:
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
        t = instance_events
        now = datetime.now(UTC)
        async with self._channel_tx() as conn:
            inserted = await conn.execute(
                t.insert().values(instance_id=instance_id, state=state, code=code, message=message, created_at=now)
            )
            cursor = int(inserted.inserted_primary_key[0])  # type: ignore[index]
            oldest_kept = (
                sa.select(t.c.cursor).where(t.c.instance_id == instance_id)
                .order_by(t.c.cursor.desc()).offset(retain - 1).limit(1).scalar_subquery()
            )
            await conn.execute(t.delete().where(t.c.instance_id == instance_id, t.c.cursor < oldest_kept))
        return Event(cursor, instance_id, state, code, message, now)

    async def events_after(self, instance_id: str, after: int, limit: int) -> list[Event]:
        t = instance_events
        async with self._read() as conn:
            rows = await conn.execute(
                sa.select(t).where(t.c.instance_id == instance_id, t.c.cursor > after).order_by(t.c.cursor).limit(limit)
            )
            return [
                Event(int(r.cursor), r.instance_id, r.state, r.code, r.message, _utc(r.created_at) or datetime.now(UTC))
                for r in rows
            ]

    async def latest_event_cursor(self) -> int:
        async with self._read() as conn:
            found = (await conn.execute(sa.select(sa.func.max(instance_events.c.cursor)))).scalar_one_or_none()
            return int(found or 0)

    async def queue_message(self, instance_id: str, body: bytes, *, max_queued: int) -> int | None:
        t = instance_messages
        async with self._channel_tx() as conn:
            count = sa.select(sa.func.count()).where(t.c.instance_id == instance_id)
            waiting = (await conn.execute(count)).scalar_one()
            if waiting >= max_queued:
                return None
            inserted = await conn.execute(
                t.insert().values(instance_id=instance_id, body=body, created_at=datetime.now(UTC))
            )
            return int(inserted.inserted_primary_key[0])  # type: ignore[index]

    async def take_message(self, instance_id: str) -> bytes | None:
        t = instance_messages
        async with self._channel_tx() as conn:
            # SKIP LOCKED: a concurrent reader takes the next message instead of waiting for this one.
            oldest = await conn.execute(
                sa.select(t.c.id, t.c.body).where(t.c.instance_id == instance_id)
                .order_by(t.c.id).limit(1).with_for_update(skip_locked=True)
            )
            row = oldest.first()
            if row is None:
                return None
            deleted = await conn.execute(t.delete().where(t.c.id == row.id))
            return bytes(row.body) if deleted.rowcount == 1 else None
