"""Records written outside a server are not held in memory: an import's memory does not grow with the fleet."""

from __future__ import annotations

import uuid

import pytest

from imds.models import MetadataWrite, UserdataWrite
from imds.services.catalog.addresses import parse_network
from imds.services.offline import OfflineRecords
from imds.services.transfer.bulk import Item
from imds.store import open_store

pytestmark = pytest.mark.anyio


async def test_offline_writes_leave_no_index_and_no_journal_chain(sqlite_url: str) -> None:
    """Three batches into SQLite: stored, but the detached catalog indexes none and keeps no journal."""
    store = open_store(sqlite_url)
    try:
        offline = OfflineRecords(store)
        ids = []
        for batch in range(3):
            items = []
            for n in range(4):
                instance_id = str(uuid.uuid4())
                address = (parse_network(f"10.9.{batch}.{n + 1}"),)
                items.append(Item(f"line {n}", instance_id, MetadataWrite(instance_id, address, {"n": n}),
                                  UserdataWrite(instance_id, address, b"\xff\x00")))
                ids.append(instance_id)
            assert [r.outcome for r in await offline.upsert(items, subject="test")] == ["created"] * 4
        assert (await offline.get(ids[-1])).userdata == b"\xff\x00"
        assert len(await offline.all()) == 12
        assert all(offline.catalog.get(instance_id) is None for instance_id in ids)
        async with store.write() as tx:
            await tx.mark_changed([ids[0]])
        await offline.catalog.written(tx.journal)
        assert tx.journal.applied
        assert tx.journal.group is not None
        assert tx.journal.group.before is None
    finally:
        await store.close()


def _items(batch: int, count: int = 3) -> list[Item]:
    items = []
    for n in range(count):
        instance_id = str(uuid.UUID(int=batch << 16 | n, version=4))
        address = (parse_network(f"10.8.{batch}.{n + 1}"),)
        items.append(Item(f"line {n}", instance_id, MetadataWrite(instance_id, address, {"n": n}), None))
    return items


async def test_a_block_on_an_empty_store_reads_nothing_back_and_one_on_a_stored_one_compares(sqlite_url: str) -> None:
    """An empty store is never read back in a block; a store holding instances is, batch by batch.

    Nothing there to compare with, and the block holds the write lock: no read can find an id. Into a store that
    holds instances every batch compares (its unchanged items are not written).
    """
    store = open_store(sqlite_url)
    reads: list[set[str]] = []
    get_many = store.get_many

    async def counted(instance_ids):
        reads.append(set(instance_ids))
        return await get_many(instance_ids)

    store.get_many = counted  # type: ignore[method-assign]
    try:
        offline = OfflineRecords(store)
        first, second = _items(1), _items(2)
        async with offline.transaction() as block:
            assert block.fresh
            done = [r.outcome for b in (first, first[:1]) for r in await offline.upsert(b, subject="t", block=block)]
        assert done == ["created"] * 3 + ["updated"]  # the id met again in the block: its second write says so
        assert reads == []
        async with offline.transaction() as block:
            assert not block.fresh
            done = [r.outcome for b in (first, second) for r in await offline.upsert(b, subject="t", block=block)]
        assert done == ["unchanged"] * 3 + ["created"] * 3
        assert reads == [{i.id for i in first}, {i.id for i in second}]
    finally:
        await store.close()
