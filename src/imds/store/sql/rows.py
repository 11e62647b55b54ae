"""Small helpers shared by the SQL store's reads and writes: stored values back to models, chunking, reads by key."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from imds import models
from imds.models import Network

_T = TypeVar("_T")
CHUNK = 500  # stays far below SQLite's bound-parameter limit


def stored_network(text: str) -> Network:
    """A stored address (normalised, or an address with a prefix kept as sent: ``models.stored_network``)."""
    return models.stored_network(text)


def utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every datetime imds stores is UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def chunks(items: Sequence[_T]) -> Iterable[Sequence[_T]]:
    """``items`` in slices of at most ``CHUNK``."""
    for start in range(0, len(items), CHUNK):
        yield items[start : start + CHUNK]


async def by_key(
    conn: AsyncConnection, key: sa.Column[str], wanted: Iterable[str] | None, made: Callable[[Any], _T],
) -> dict[str, _T]:
    """The rows of ``key``'s table whose ``key`` is in ``wanted`` (every row with None), ``made`` values, by key."""
    table = key.table
    if wanted is None:
        return {getattr(row, key.name): made(row) for row in await conn.execute(sa.select(table))}
    found: dict[str, _T] = {}
    for chunk in chunks(list(dict.fromkeys(wanted))):
        rows = await conn.execute(sa.select(table).where(key.in_(list(chunk))))
        found.update({getattr(row, key.name): made(row) for row in rows})
    return found
