"""The in-memory view of every instance that the instance-facing path reads.

Loaded from a store snapshot at startup and kept coherent two ways: a write on this
replica refreshes the instances it touched before it answers, and a follower polls the
store's change feed for writes made by other replicas. A read never touches the store.

Refreshes run one at a time and read the store inside that critical section, so a later
refresh never applies older state than an earlier one.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Callable, Iterable, Iterator

from imds import log
from imds.errors import StoreUnavailable
from imds.models import Address, Instance, Network, OsRecord
from imds.services.addresses import AddressIndex
from imds.services.entry import Entry, RenderCache
from imds.store.interface import Store, StoredInstance, stored_form

__all__ = ["Catalog", "Entry"]
_log = log.get("catalog")
LOAD_CHUNK = 5000


class Catalog:
    """Instances by id and by address (longest-prefix match)."""

    def __init__(self, store: Store, *, poll_interval: float = 1.0, render_cache_bytes: int = 256 << 20) -> None:
        self._store = store
        self._cache = RenderCache(render_cache_bytes)
        self._poll_interval = poll_interval
        self._entries: dict[str, Entry] = {}
        self._index = AddressIndex()
        self._lock = asyncio.Lock()
        self.position = 0
        self.loaded = False
        # Loading progress for /readyz and the log: phase ("waiting", "reading", "indexing", "loaded").
        self.phase = "waiting"
        self.indexed = 0
        self.total = 0
        # Called with (instance id, generation) when an OS record leaves the catalog (its instance
        # or record was deleted, or a newer write replaced it), locally or through the change feed:
        # the secret vault forgets what it held for that generation (services/os_secrets.py).
        self.on_os_gone: Callable[[str, str], None] | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, address: Address) -> Entry | None:
        """The instance whose longest matching prefix contains ``address``."""
        instance_id = self._index.lookup(address)
        return None if instance_id is None else self._entries.get(instance_id)

    def containing(self, address: Address) -> list[tuple[Network, str]]:
        """Every held entry (network, instance id) containing ``address``, longest prefix first."""
        return self._index.containing(address)

    def holdings(self) -> Iterator[tuple[str, tuple[Network, ...]]]:
        """(instance id, its addresses) for every instance held."""
        for instance_id, entry in self._entries.items():
            yield instance_id, entry.addresses

    def get(self, instance_id: str) -> Entry | None:
        """The instance with this id, if the catalog holds it."""
        return self._entries.get(instance_id)

    async def load(self) -> None:
        """Replace everything with a fresh snapshot of the store.

        Indexing yields to the event loop every ``LOAD_CHUNK`` instances (and logs its
        progress), so a listener that is already accepting keeps answering meanwhile.
        """
        async with self._lock:
            self.phase = "reading"
            _log.info("catalog.loading", phase=self.phase)
            previous = self._entries
            for old in previous.values():
                old.wake()
            self._cache.clear()
            self.phase, self.total, self.indexed = "indexing", 0, 0
            self._entries = {}
            self._index = AddressIndex()
            position = 0
            async for chunk, seq, total in self._store.snapshot_chunks(LOAD_CHUNK):
                position, self.total = seq, total
                for stored in chunk:
                    self._place(stored)
                # Loaded entries live until replaced: keep the cyclic GC from re-scanning them on every
                # collection the load triggers (a third of a million-instance load). Refcounting still frees them.
                gc.freeze()
                self.indexed += len(chunk)
                if self.indexed < self.total:
                    _log.info("catalog.loading", phase=self.phase, indexed=self.indexed, total=self.total)
                    await asyncio.sleep(0)
            for instance_id, old in previous.items():
                new = self._entries.get(instance_id)
                self._os_left(instance_id, old.os, None if new is None else new.os)
            self.position = position
            self.loaded = True
            self.phase = "loaded"
        _log.info("catalog.loaded", instances=self.indexed, position=position)

    def progress(self) -> dict[str, object]:
        """Where loading stands: phase, instances indexed and the total (known once read)."""
        return {"phase": self.phase, "indexed": self.indexed, "total": self.total}

    async def refresh(self, instance_ids: Iterable[str]) -> None:
        """Re-read these instances from the store and apply what it holds now."""
        ids = list(dict.fromkeys(instance_ids))
        async with self._lock:
            found = await self._store.get_many(ids)
            for instance_id in ids:
                self._apply(instance_id, found.get(instance_id))

    async def catch_up(self) -> int:
        """Apply change-feed entries written since the last position; returns how many."""
        applied = 0
        while True:
            batch = await self._store.changes_since(self.position)
            if not batch:
                return applied
            await self.refresh(change.instance_id for change in batch)
            self.position = max(self.position, batch[-1].seq)
            applied += len(batch)

    async def follow(self) -> None:
        """Poll the change feed until cancelled; a store outage only delays coherence."""
        while True:
            await asyncio.sleep(self._poll_interval)
            with contextlib.suppress(StoreUnavailable):
                await self.catch_up()

    def _os_left(self, instance_id: str, old: OsRecord | None, new: OsRecord | None) -> None:
        gone = None if old is None else old.generation
        if gone is not None and self.on_os_gone is not None and (new is None or new.generation != gone):
            self.on_os_gone(instance_id, gone)

    def _apply(self, instance_id: str, instance: Instance | None) -> None:
        old = self._entries.get(instance_id)
        if old is not None:
            self._os_left(instance_id, old.os, None if instance is None else instance.os)
            old.wake()
            self._cache.drop(old)
        if instance is None:
            self._entries.pop(instance_id, None)
            self._index.forget(instance_id)
            return
        self._place(stored_form(instance))

    def _place(self, stored: StoredInstance) -> None:
        entry = self._entries[stored.id] = Entry(stored, self._cache)
        self._index.assign_packed(stored.id, entry.packed)
