"""Every write primitive rides the group commit: batches with their audit rows, channel writes.

A batch (``imds import``, ``POST /device-records``) is one block: its records, addresses,
feed rows and audit rows commit together or not at all, and the writing catalog applies
its journal. Channel writes (events, messages) are blocks of the same groups as record
writes, so both share commits, and each is acknowledged only once committed.
"""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from factories import new_id
from imds.metrics import Metrics
from imds.models import METADATA, USERDATA, AuditEvent, MetadataWrite, Network, UserdataWrite
from imds.services.catalog.catalog import Catalog
from imds.services.records.upsert import Records
from imds.store import Store, open_store
from sql_counting import counting

pytestmark = pytest.mark.anyio


class Boom(Exception):
    """Raised inside a write block on purpose."""


def net(n: int) -> Network:
    return ipaddress.ip_network(f"10.91.{n // 256}.{n % 256}/32")


async def test_a_batch_commits_its_records_addresses_and_audit_rows_together(store: Store) -> None:
    """A batch with a move and a stale item: one entry per record written, the stale one recorded; catalog = store."""
    catalog = Catalog(store)
    await catalog.load()
    records = Records(store, catalog, Metrics())
    a, b, c = new_id(), new_id(), new_id()
    dated = {"updated_at": "2026-01-02T00:00:00Z"}
    await records.put_metadata(MetadataWrite(c, (net(1),), dated), subject="setup")
    results = await records.put_many(
        [
            (MetadataWrite(a, (net(1), net(2)), {"n": 1}), UserdataWrite(a, (net(1), net(2)), b"#a")),
            (None, UserdataWrite(b, (net(3),), b"#b")),
            (MetadataWrite(c, (), {"updated_at": "2025-01-01T00:00:00Z"}), None),  # older: stale
        ],
        subject="importer",
    )
    assert [(r.instance_id, r.applied) for r in results] == [(a, True), (b, True), (c, False)]
    assert results[0].moved == {net(1): c}
    entries = [e.event for e in await store.audit(None, 0, 100) if e.event.subject == "importer"]
    assert [(e.instance_id, e.kind, e.applied) for e in entries] == [
        (c, METADATA, False), (a, METADATA, True), (a, USERDATA, True), (b, USERDATA, True),
    ]
    assert entries[1].detail["moved"] == {"10.91.0.1": c}
    assert entries[2].detail["moved"] == {}  # the move is recorded once, on the first record written
    assert "stale" in entries[0].detail["reason"]
    for instance_id in (a, b, c):
        entry = catalog.get(instance_id)
        assert entry is not None
        assert entry.instance == await store.get(instance_id)
    held = catalog.lookup(ipaddress.ip_address("10.91.0.1"))
    assert held is not None
    assert held.instance.id == a


async def test_a_block_that_raises_leaves_neither_its_records_nor_its_audit_rows(store: Store) -> None:
    """In one group: the raising block's record and audit rows vanish, the others' commit with theirs."""
    ids = [new_id() for _ in range(6)]
    gate = asyncio.Event()

    async def block(n: int) -> None:
        await gate.wait()
        async with store.write() as tx:
            await tx.put_records([(ids[n], {"n": n})], [])
            await tx.mark_changed([ids[n]])
            event = AuditEvent(subject="t", instance_id=ids[n], action="write", kind=METADATA, applied=True, detail={})
            await tx.append_audit_many([event])
            if n == 2:  # the one block that fails
                raise Boom

    tasks = [asyncio.create_task(block(n)) for n in range(6)]
    await asyncio.sleep(0)  # let every task reach the gate
    gate.set()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(outcomes[2], Boom)
    assert [o for n, o in enumerate(outcomes) if n != 2] == [None] * 5
    audited = sorted(e.event.instance_id for e in await store.audit(None, 0, 100))
    assert audited == sorted(i for n, i in enumerate(ids) if n != 2)
    assert sorted(await store.get_many(ids)) == audited


@pytest.mark.stores("sqlite", "postgres")
async def test_channel_writes_join_the_groups_of_record_writes(db_url: str) -> None:
    """Events, messages and upserts released at once share commits; each is durable once acknowledged."""
    store, reader = open_store(db_url), open_store(db_url)
    catalog = Catalog(store)
    records = Records(store, catalog, Metrics())
    try:
        await catalog.load()
        instance_id = new_id()
        await records.put_userdata(UserdataWrite(instance_id, (net(9),), b"#x"), subject="t")
        gate = asyncio.Event()

        async def event(n: int) -> int:
            await gate.wait()
            return (await store.append_event(instance_id, f"step-{n}", n, None, retain=100)).cursor

        async def message(n: int) -> int | None:
            await gate.wait()
            return await store.queue_message(instance_id, b"m%d" % n, max_queued=100)

        async def upsert(n: int) -> None:
            await gate.wait()
            await records.put_metadata(MetadataWrite(new_id(), (net(20 + n),), {"n": n}), subject="t")

        events = [asyncio.create_task(event(n)) for n in range(10)]
        messages = [asyncio.create_task(message(n)) for n in range(10)]
        upserts = [asyncio.create_task(upsert(n)) for n in range(10)]
        await asyncio.sleep(0)  # let every task reach the gate
        with counting(store) as counts:
            gate.set()
            cursors = await asyncio.gather(*events)
            queued = await asyncio.gather(*messages)
            await asyncio.gather(*upserts)
        assert counts["commits"] < 15, counts  # 30 blocks; one commit each would be 30
        assert len(set(cursors)) == 10
        assert None not in queued
        stored = await reader.events_after(instance_id, 0, 100)
        assert sorted(e.cursor for e in stored) == sorted(cursors)
        assert [e.cursor for e in stored] == sorted(e.cursor for e in stored)
        taken = [await reader.take_message(instance_id) for _ in range(11)]
        assert sorted(t for t in taken if t is not None) == sorted(b"m%d" % n for n in range(10))
        assert taken[-1] is None
    finally:
        await store.close()
        await reader.close()
