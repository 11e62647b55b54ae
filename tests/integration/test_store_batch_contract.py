"""The batch forms of a write transaction (imds import) give what their items give one by one, in every store.

Each scenario runs on the store under test (memory, SQLite, PostgreSQL: the ``store``
fixture) with whole batches, and on a fresh MemoryStore with batches of one item, one
after another (the reference); results and final contents must be equal.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

import pytest

from factories import new_id
from imds.metrics import Metrics
from imds.models import MetadataWrite, Network, UserdataWrite
from imds.services.catalog.catalog import Catalog
from imds.services.records.upsert import Records
from imds.store import MemoryStore, Store

pytestmark = pytest.mark.anyio


def nets(*texts: str) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(t) for t in texts)


async def contents(store: Store) -> dict[str, tuple]:
    instances, _ = await store.snapshot()
    return {i.id: (sorted(map(str, i.addresses)), i.metadata, i.userdata) for i in instances}


async def test_batch_forms_equal_their_items_one_by_one(store: Store) -> None:
    """Records, then addresses that move within the batch and from outside it, a repeated id, dropped ones."""
    x, a, b = new_id(), new_id(), new_id()
    reference = MemoryStore()
    for target in (store, reference):
        async with target.write() as tx:
            await tx.put_records([(x, {"id": x})], [])
            await tx.replace_addresses_many([(x, nets("10.50.0.1/32", "10.50.0.2/32", "fd50::/64"))])
    lists: Sequence[tuple[str, tuple[Network, ...]]] = [
        (a, nets("10.50.0.1/32", "10.50.0.3/32")),  # takes one of x's
        (b, nets("10.50.0.3/32", "fd50::/64")),  # takes a's new one and x's network
        (a, nets("10.50.0.4/32")),  # a again: drops 10.50.0.1 (then nobody holds it)
        (x, nets("10.50.0.2/32", "10.50.0.4/32")),  # x takes a's
    ]
    metadata = [(a, {"id": a, "v": 1}), (b, {"id": b}), (a, {"id": a, "v": 2})]
    userdata = [(b, b"\x00\xff"), (x, b"#!")]
    async with store.write() as tx:
        assert await tx.metadata_of_many([x, a, b]) == {x: {"id": x}}
        await tx.put_records(metadata, userdata)
        batch = await tx.replace_addresses_many(lists)
        await tx.mark_changed([x, a, b])
    async with reference.write() as tx:
        for item in metadata:
            await tx.put_records([item], [])
        for item in userdata:
            await tx.put_records([], [item])
        single = [(await tx.replace_addresses_many([item]))[0] for item in lists]
        await tx.mark_changed([x, a, b])
    assert batch == single
    assert batch[2] == ({}, nets("10.50.0.1/32"))
    assert await contents(store) == await contents(reference)
    async with store.write() as tx:
        assert await tx.metadata_of_many([x, a, b, new_id()]) == {x: {"id": x}, a: {"id": a, "v": 2}, b: {"id": b}}


async def test_records_put_many_follows_the_single_write_rules(store: Store) -> None:
    """Staleness per item (also against an earlier item of the same batch), moves and the feed, as put_* do."""
    a, b = new_id(), new_id()
    old, new = "2024-01-01T00:00:00Z", "2024-02-01T00:00:00Z"
    records = Records(store, Catalog(store), Metrics())
    items = [
        (MetadataWrite(a, nets("10.51.0.1/32"), {"id": a, "updated_at": new}), None),
        (MetadataWrite(a, nets("10.51.0.9/32"), {"id": a, "updated_at": old}), None),  # stale vs the first
        (None, UserdataWrite(b, nets("10.51.0.1/32"), b"ud")),  # takes a's address
    ]
    results = await records.put_many(items, subject="t")
    assert [r.applied for r in results] == [True, False, True]
    assert results[1].reason is not None
    assert results[1].reason.startswith("stale")
    assert results[2].moved == {nets("10.51.0.1/32")[0]: a}
    assert await contents(store) == {a: ([], {"id": a, "updated_at": new}, None), b: (["10.51.0.1/32"], None, b"ud")}
    # One feed block per applied item, in order, as single writes make: [a], then [b, a] (the move's loser).
    assert [c.instance_id for c in await store.changes_since(0)] == [a, b, a]
