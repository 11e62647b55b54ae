"""``Catalog.catch_up`` applies what was committed before it was called, and stops there.

A follower of a process that writes without pause must not chase that process's newest
commits: each one is applied by ``written`` a moment later, and chasing it re-read every
write from the store while holding the lock ``written`` waits for.
"""

from __future__ import annotations

import ipaddress

import pytest

from imds.metrics import Metrics
from imds.models import MetadataWrite
from imds.services.catalog import catalog as catalog_module
from imds.services.catalog.catalog import Catalog
from imds.services.records.upsert import Records
from imds.store.interface import Change
from imds.store.memory import MemoryStore

pytestmark = pytest.mark.anyio


class WritingWhileRead(MemoryStore):
    """A store another writer commits to each time the feed is read (up to ``writes`` times)."""

    def __init__(self, writes: int) -> None:
        super().__init__()
        self.writes = writes
        self.reads = 0
        self.writer: Records | None = None

    async def changes_since(self, seq: int, limit: int = 1000) -> list[Change]:
        self.reads += 1
        batch = await super().changes_since(seq, limit)
        if self.writer is not None and self.writes:
            self.writes -= 1
            await put(self.writer, f"00000000-0000-4000-8000-{self.writes:012d}", self.writes)
        return batch


def holder(catalog: Catalog, address: str) -> str | None:
    entry = catalog.lookup(ipaddress.ip_address(address))
    return None if entry is None else entry.instance.id


async def put(records: Records, instance_id: str, n: int) -> None:
    address = ipaddress.ip_network(f"10.9.0.{n}/32")
    await records.put_metadata(MetadataWrite(instance_id, (address,), {"id": instance_id}), subject="test")


async def test_catch_up_stops_at_what_was_committed_when_it_started() -> None:
    store = WritingWhileRead(writes=5)
    follower = Catalog(store)
    await follower.load()
    writer_catalog = Catalog(store)  # another process's writes, as the follower sees them
    await writer_catalog.load()
    writer = Records(store, writer_catalog, Metrics())
    await put(writer, "00000000-0000-4000-8000-00000000aaaa", 200)
    store.writer = writer
    applied = await follower.catch_up()
    assert applied == 1  # the write committed before the call; the one committed during it is the next call's
    assert store.reads == 1
    assert holder(follower, "10.9.0.200") == "00000000-0000-4000-8000-00000000aaaa"
    assert holder(follower, "10.9.0.4") is None
    store.writer = None
    assert await follower.catch_up() == 1  # the next call applies it
    assert holder(follower, "10.9.0.4") == "00000000-0000-4000-8000-000000000004"


async def test_a_full_batch_is_followed_by_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog_module, "FEED_BATCH", 2)
    store = WritingWhileRead(writes=0)
    writer_catalog = Catalog(store)
    await writer_catalog.load()
    writer = Records(store, writer_catalog, Metrics())
    follower = Catalog(store)
    await follower.load()
    for n in range(5):
        await put(writer, f"00000000-0000-4000-8000-{n:012d}", n)
    assert await follower.catch_up() == 5  # batches of 2, 2 and 1: all committed before the call
    assert store.reads == 3
    assert [holder(follower, f"10.9.0.{n}") for n in range(5)] == [
        f"00000000-0000-4000-8000-{n:012d}" for n in range(5)
    ]
