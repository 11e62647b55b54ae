"""Records straight from the database, for commands that run without a server.

``imds configdrive build``, ``imds get|list|delete`` and ``imds import|export`` with
``--db`` / ``--data-dir`` open the store through here (the CLI never opens it itself), and
every write takes the admin API's path (``Records``: the same rules, one transaction, the
change feed that a running ``imds serve`` follows).

::

    async with offline_records("sqlite:///var/lib/imds/imds.db") as offline:
        instance = await offline.get("7d0ab2bc-3a53-4d5e-8f44-2b2b9c1f6a10")
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path

from imds.errors import ConfigError
from imds.metrics import Metrics
from imds.services.catalog.catalog import Catalog
from imds.services.ganeti.crypto import PrivateCipher
from imds.services.ganeti.definitions import OsDefinitions
from imds.services.ganeti.records import OsRecords
from imds.services.notices.records import NoticeRecords
from imds.services.records.upsert import Records
from imds.services.transfer.bulk import Block
from imds.services.transfer.stored import StoredRecords
from imds.store import Store, open_store
from imds.store.journal import Journal


class _Detached(Catalog):
    """No in-memory index outside a server: servers see these writes through the change feed.

    A write is marked applied and cut from the ones before it, so an import holds neither
    the instances it wrote nor the chain of their journals (its memory stays flat).
    """

    async def refresh(self, instance_ids: Iterable[str]) -> None:  # noqa: ARG002 - the overridden signature
        return None

    async def written(self, journal: Journal) -> None:
        """Nothing to index: mark the pending groups applied (walking them cuts the chain's links)."""
        for group in journal.pending():
            for member in group.members:
                member.applied = True


class OfflineRecords(StoredRecords):
    """Reads and writes on one opened store, outside a server."""

    def __init__(self, store: Store, cipher: PrivateCipher | None = None) -> None:
        self.catalog: Catalog = _Detached(store)  # indexes nothing (see _Detached)
        super().__init__(
            store, Records(store, self.catalog, Metrics()),
            OsRecords(store, self.catalog, cipher=cipher or PrivateCipher([]), definitions=OsDefinitions.load(None)),
            NoticeRecords(store, self.catalog),
        )

    async def delete(self, kind: str, instance_id: str, *, subject: str) -> None:
        """Delete one record type, as ``DELETE /device-{kind}/{id}`` does (RecordNotFound when absent)."""
        await self.records.delete(kind, instance_id, subject=subject)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Block]:
        """One store block for many batches: everything they write commits together, or nothing does.

        While it is open the database's write lock is held (other writers wait: SQLite's
        writers, and PostgreSQL's, which lock the feed head first).
        """
        block: Block | None = None
        try:
            async with self.store.write() as tx:
                block = Block(tx)
                yield block
        except BaseException:
            for undo in block.undo if block is not None else ():
                undo()
            raise
        await self.catalog.written(tx.journal)


@asynccontextmanager
async def offline_records(url: str, *, private_key_file: Path | None = None) -> AsyncIterator[OfflineRecords]:
    """The records in the database at ``url`` (migrated); the store is closed on exit.

    ``private_key_file`` (``--private-key-file``) opens and seals private OS values.
    """
    if url.startswith("memory://"):
        raise ConfigError("memory:// holds nothing outside a running server: give --db / --data-dir, or --url")
    store = open_store(url, journal=False)  # no catalog here replays the writes (see _Detached)
    try:
        yield OfflineRecords(store, PrivateCipher.from_file(private_key_file))
    finally:
        await store.close()
