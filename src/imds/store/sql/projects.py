"""GCE project attributes' rows (``project_attributes``, revision 0006): one per project.

Writes run on a write block's connection (``SqlTx``), reads in a read transaction; the
caller opens either.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from imds.models import ProjectAttributes
from imds.store.sql.rows import by_key, utc
from imds.store.sql.tables import project_attributes
from imds.store.sql.writeconn import WriteConnection

_T = project_attributes


def _record(row: Any) -> ProjectAttributes:
    return ProjectAttributes(row.project_id, dict(row.attributes), int(row.revision),
                             utc(row.updated_at) or datetime.now(UTC))


async def put(conn: WriteConnection, project_id: str, attributes: dict[str, str]) -> ProjectAttributes:
    """Create or replace the project's row; the revision is one above the stored one (1 for a new row).

    Writers are serialised (every write block holds the feed-head lock), so reading the
    revision and then writing it cannot race another writer.
    """
    held = await conn.execute(sa.select(_T.c.revision).where(_T.c.project_id == project_id))
    before = held.scalar_one_or_none()
    record = ProjectAttributes(project_id, dict(attributes), 1 if before is None else int(before) + 1,
                               datetime.now(UTC))
    values = {"attributes": record.attributes, "revision": record.revision, "updated_at": record.updated_at}
    if before is None:
        await conn.execute(_T.insert().values(project_id=project_id, **values))
    else:
        await conn.execute(_T.update().where(_T.c.project_id == project_id).values(**values))
    return record


async def remove(conn: WriteConnection, project_id: str) -> bool:
    """Delete the project's row; False when there was none."""
    result = await conn.execute(_T.delete().where(_T.c.project_id == project_id))
    return bool(result.rowcount)


async def read(conn: AsyncConnection, project_ids: Iterable[str] | None) -> dict[str, ProjectAttributes]:
    """The rows of these projects (every row with None), by project id."""
    return await by_key(conn, _T.c.project_id, project_ids, _record)
