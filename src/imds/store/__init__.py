"""Storage: ``open_store(url)`` returns a ``Store`` for ``memory://`` or a database URL."""

from __future__ import annotations

from imds.store.interface import Store, WriteTx
from imds.store.memory import MemoryStore

__all__ = ["MemoryStore", "Store", "WriteTx", "open_store"]


def open_store(
    url: str, *, connect_timeout: float = 5.0, statement_timeout: float = 5.0, journal: bool = True,
) -> Store:
    """A store for ``memory://``, ``sqlite:///PATH`` or ``postgresql://...``.

    SQL stores must already be migrated (``imds db upgrade``, or ``imds serve`` with
    ``--migrate``). The timeouts bound every wait on the database (see ``sql.engine``).
    ``journal=False`` (an SQL store whose writes no catalog of this process replays: the
    offline commands) keeps no journal of what a write block did.
    """
    if url.startswith("memory://"):
        return MemoryStore()
    from imds.store.sql.store import SqlStore  # noqa: PLC0415 - SQLAlchemy loads only when a database is used

    return SqlStore(url, connect_timeout=connect_timeout, statement_timeout=statement_timeout, journal=journal)
