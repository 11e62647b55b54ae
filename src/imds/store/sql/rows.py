"""Small helpers shared by the SQL store's reads and writes: stored values back to models, chunking."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TypeVar

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
