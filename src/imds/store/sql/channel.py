"""The instance<->host channel's rows (events up, messages down); see ``imds.services.channel``.

Writes run on a group-commit block's connection (``SqlStore._channel_tx``), reads in a
read transaction; the caller opens either.
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from imds.models import Event
from imds.store.sql.rows import utc
from imds.store.sql.tables import instance_events, instance_messages
from imds.store.sql.writeconn import WriteConnection


async def append_event(  # noqa: PLR0913 - the event's fields, as Store.append_event takes them
    conn: WriteConnection, instance_id: str, state: str, code: int | None, message: str | None, *, retain: int
) -> Event:
    """Insert one event and delete the instance's events older than its newest ``retain``."""
    t = instance_events
    now = datetime.now(UTC)
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


async def events_after(conn: AsyncConnection, instance_id: str, after: int, limit: int) -> list[Event]:
    """The instance's events with a cursor above ``after``, oldest first."""
    t = instance_events
    rows = await conn.execute(
        sa.select(t).where(t.c.instance_id == instance_id, t.c.cursor > after).order_by(t.c.cursor).limit(limit)
    )
    return [
        Event(int(r.cursor), r.instance_id, r.state, r.code, r.message, utc(r.created_at) or datetime.now(UTC))
        for r in rows
    ]


async def latest_event_cursor(conn: AsyncConnection) -> int:
    """The highest event cursor, 0 when there is none."""
    found = (await conn.execute(sa.select(sa.func.max(instance_events.c.cursor)))).scalar_one_or_none()
    return int(found or 0)


async def queue_message(conn: WriteConnection, instance_id: str, body: bytes, *, max_queued: int) -> int | None:
    """Queue a message; its id, or None when ``max_queued`` are waiting."""
    t = instance_messages
    waiting = (await conn.execute(sa.select(sa.func.count()).where(t.c.instance_id == instance_id))).scalar_one()
    if waiting >= max_queued:
        return None
    inserted = await conn.execute(t.insert().values(instance_id=instance_id, body=body, created_at=datetime.now(UTC)))
    return int(inserted.inserted_primary_key[0])  # type: ignore[index]


async def take_message(conn: WriteConnection, instance_id: str) -> bytes | None:
    """Remove and return the instance's oldest message, or None."""
    t = instance_messages
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
