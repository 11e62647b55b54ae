"""The SQL store's reads, each inside a read transaction the caller opened: rows become models here."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from imds.models import AuditEntry, AuditEvent, Change, Instance
from imds.store.interface import StoredInstance
from imds.store.sql.os_rows import os_record
from imds.store.sql.rows import chunks, stored_network, utc
from imds.store.sql.statements import among
from imds.store.sql.tables import (
    audit_log,
    changes,
    feed_head,
    instance_ip_addresses,
    instance_metadata,
    instance_os,
    instance_passwords,
    instance_userdata,
    instances,
)

_YIELD_EVERY = 2048  # address rows converted between two yields to the event loop
_ABSENT: tuple[None, None] = (None, None)
FEED_POSITION = sa.select(feed_head.c.seq).where(feed_head.c.id == 1)


async def position(conn: AsyncConnection) -> int:
    """The change-feed head: the seq of the newest entry (0 when the feed is empty)."""
    return int((await conn.execute(FEED_POSITION)).scalar_one())


@functools.cache
def _loads(dialect: str, every: bool) -> tuple[sa.Select[Any], ...]:
    """``load``'s statements, built once: every row of each table, or the rows of ``ids`` (a list parameter)."""
    keys = (instances.c.id, instance_metadata.c.instance_id, instance_userdata.c.instance_id,
            instance_ip_addresses.c.instance_id, instance_passwords.c.instance_id, instance_os.c.instance_id)
    return tuple(sa.select(instances.c.id if key.table is instances else key.table)
                 .where(sa.true() if every else among(key, "ids", dialect)) for key in keys)


async def load(conn: AsyncConnection, ids: Sequence[str] | None) -> dict[str, Instance]:
    """The instances among ``ids`` (every instance when None) that exist, by id, each whole."""
    ids_, metadata, userdata, addresses, passwords, os_rows = _loads(conn.dialect.name, ids is None)
    parts: dict[str, dict[str, Any]] = {}
    for chunk in [None] if ids is None else list(chunks(ids)):
        wanted = None if chunk is None else {"ids": list(chunk)}
        for row in (await conn.execute(ids_, wanted)).all():
            parts[row.id] = {"id": row.id, "addresses": []}
        for row in (await conn.execute(metadata, wanted)).all():
            parts[row.instance_id].update(metadata=row.document, metadata_updated_at=utc(row.updated_at))
        for row in (await conn.execute(userdata, wanted)).all():
            parts[row.instance_id].update(userdata=bytes(row.userdata), userdata_updated_at=utc(row.updated_at))
        for count, row in enumerate((await conn.execute(addresses, wanted)).all(), 1):
            parts[row.instance_id]["addresses"].append(stored_network(row.address))
            if count % _YIELD_EVERY == 0:
                await asyncio.sleep(0)  # one instance with 60,000 addresses must not hold the event loop
        for row in (await conn.execute(passwords, wanted)).all():
            parts[row.instance_id]["password"] = bytes(row.password)
        for row in (await conn.execute(os_rows, wanted)).all():
            parts[row.instance_id]["os"] = os_record(row.document)
    return {
        i: Instance(**{**p, "addresses": tuple(sorted(p["addresses"], key=str))}) for i, p in parts.items()
    }


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


async def stored_chunks(conn: AsyncConnection, size: int) -> AsyncIterator[tuple[list[StoredInstance], int, int]]:
    """``Store.snapshot_chunks`` within ``conn``'s (snapshot) transaction."""
    seq = await position(conn)
    total = int((await conn.execute(sa.select(sa.func.count()).select_from(instances))).scalar_one())
    last: str | None = None
    while True:
        rows = (await conn.execute(_page(last, size))).all()
        if not rows:
            return
        yield await _stored(conn, rows, (last, rows[-1][0])), seq, total
        last = rows[-1][0]


async def _stored(conn: AsyncConnection, page: Sequence[Any], span: tuple[str | None, str]) -> list[StoredInstance]:
    """One ``_page`` of instances (exactly those with ``span[0] < id <= span[1]``) in stored form."""
    def where(column: sa.Column[Any]) -> Any:
        return _in_span(column, span)

    userdata = {row.instance_id: (bytes(row.userdata), utc(row.updated_at)) for row in await conn.execute(
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
            utc(updated), data, data_updated,
            passwords.get(instance_id), os_records.get(instance_id),
        ))
    return found


async def changes_after(conn: AsyncConnection, seq: int, limit: int) -> list[Change]:
    """Change-feed entries after ``seq``, oldest first, at most ``limit``."""
    rows = await conn.execute(
        sa.select(changes.c.seq, changes.c.instance_id).where(changes.c.seq > seq).order_by(changes.c.seq).limit(limit)
    )
    return [Change(int(r.seq), r.instance_id) for r in rows]


async def audit_entries(conn: AsyncConnection, instance_id: str | None, after: int, limit: int) -> list[AuditEntry]:
    """Audit entries with ``seq > after`` (of one instance, or all), oldest first, at most ``limit``."""
    t = audit_log
    query = sa.select(t).where(t.c.seq > after).order_by(t.c.seq).limit(limit)
    if instance_id is not None:
        query = query.where(t.c.instance_id == instance_id)
    return [
        AuditEntry(int(r.seq), utc(r.at) or r.at, AuditEvent(r.subject, r.instance_id, r.action, r.kind,
                                                             bool(r.applied), r.detail))
        for r in await conn.execute(query)
    ]
