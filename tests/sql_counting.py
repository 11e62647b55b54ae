"""Count the SQL statements and commits a store's engine runs (the write-path budget tests)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event

from imds.store import Store


@contextmanager
def counting(store: Store) -> Iterator[dict[str, int]]:
    """Count SQL statements and commits on the store's engines while the block runs."""
    engines = store.engines  # type: ignore[attr-defined]
    counts = {"statements": 0, "commits": 0}

    def statement(*_args: Any) -> None:
        counts["statements"] += 1

    def commit(*_args: Any) -> None:
        counts["commits"] += 1

    for engine in engines:
        event.listen(engine, "before_cursor_execute", statement)
        event.listen(engine, "commit", commit)
    try:
        yield counts
    finally:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", statement)
            event.remove(engine, "commit", commit)
