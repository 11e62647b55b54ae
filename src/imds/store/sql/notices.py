"""Lifecycle notices' rows (``notices``, ``notice_acks``, revision 0007): one row per notice, one per acknowledgement.

Writes run on a write block's connection (``SqlTx``), reads in a read transaction; the
caller opens either.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from imds.models import Acknowledgement, Notice
from imds.store.sql.rows import by_key, chunks, utc
from imds.store.sql.tables import notice_acks, notices
from imds.store.sql.writeconn import WriteConnection

_N, _A = notices, notice_acks
_COLUMNS = ("scope", "target", "kind", "state", "time", "window_end", "description", "target_state", "revision",
            "created_at", "updated_at")


def _notice(row: Any) -> Notice:
    return Notice(row.scope, row.target, row.kind, utc(row.time), row.state,  # type: ignore[arg-type]
                  utc(row.window_end), row.description, row.target_state, id=row.id, revision=int(row.revision),
                  created_at=utc(row.created_at), updated_at=utc(row.updated_at))


def _ack(row: Any) -> Acknowledgement:
    return Acknowledgement(row.notice_id, row.instance_id, utc(row.at))  # type: ignore[arg-type]


async def one(conn: WriteConnection, notice_id: str) -> Notice | None:
    """The stored notice, or None (inside a write block)."""
    row = (await conn.execute(sa.select(_N).where(_N.c.id == notice_id))).first()
    return None if row is None else _notice(row)


async def put(conn: WriteConnection, notice: Notice) -> None:
    """Create or replace the notice's row as given (writers are serialised: a read then a write cannot race)."""
    values = {name: getattr(notice, name) for name in _COLUMNS}
    held = await conn.execute(sa.select(_N.c.id).where(_N.c.id == notice.id))
    if held.first() is None:
        await conn.execute(_N.insert().values(id=notice.id, **values))
    else:
        await conn.execute(_N.update().where(_N.c.id == notice.id).values(**values))


async def remove(conn: WriteConnection, notice_id: str) -> bool:
    """Delete the notice and its acknowledgements (the foreign key cascades too; this does not rely on it)."""
    await conn.execute(_A.delete().where(_A.c.notice_id == notice_id))
    result = await conn.execute(_N.delete().where(_N.c.id == notice_id))
    return bool(result.rowcount)


async def acknowledge(conn: WriteConnection, notice_id: str, instance_id: str, at: datetime) -> Acknowledgement:
    """Insert the acknowledgement unless the instance gave one; the stored one."""
    where = (_A.c.notice_id == notice_id) & (_A.c.instance_id == instance_id)
    row = (await conn.execute(sa.select(_A).where(where))).first()
    if row is not None:
        return _ack(row)
    await conn.execute(_A.insert().values(notice_id=notice_id, instance_id=instance_id, at=at))
    return Acknowledgement(notice_id, instance_id, at)


async def read(conn: AsyncConnection, notice_ids: Iterable[str] | None) -> dict[str, Notice]:
    """These notices (every one with None) that exist, by id."""
    return await by_key(conn, _N.c.id, notice_ids, _notice)


async def acks(conn: AsyncConnection, notice_ids: Iterable[str]) -> list[Acknowledgement]:
    """The acknowledgements of these notices, oldest first."""
    found: list[Acknowledgement] = []
    for chunk in chunks(list(dict.fromkeys(notice_ids))):
        rows = await conn.execute(sa.select(_A).where(_A.c.notice_id.in_(list(chunk))))
        found += [_ack(row) for row in rows]
    return sorted(found, key=lambda a: (a.at, a.notice_id, a.instance_id))
