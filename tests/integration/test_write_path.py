"""The write path: few SQL statements per write, group commit, and a catalog equal to the store.

Group commit runs the write blocks waiting at one moment in one transaction (one fsync);
each block stays all-or-nothing (a later block runs in a savepoint) and leaves
``write()`` only once committed. The catalog of the writing process applies each write's
journal instead of re-reading the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import random
from collections.abc import AsyncIterator

import pytest

from factories import new_id
from imds.errors import Conflict, RecordNotFound, StoreUnavailable
from imds.metrics import Metrics
from imds.models import METADATA, USERDATA, Instance, MetadataWrite, Network, UserdataWrite, WriteResult
from imds.services.catalog.catalog import Catalog
from imds.services.records.upsert import Records
from imds.store import Store, open_store
from sql_counting import counting

pytestmark = pytest.mark.anyio


class Boom(Exception):
    """Raised inside a write block on purpose."""


@contextlib.asynccontextmanager
async def loaded_records(db_url: str) -> AsyncIterator[tuple[Store, Catalog, Records]]:
    """A store on ``db_url``, its loaded catalog and the Records service over both; the store closed after."""
    store = open_store(db_url)
    catalog = Catalog(store)
    try:
        await catalog.load()
        yield store, catalog, Records(store, catalog, Metrics())
    finally:
        await store.close()


def host(n: int) -> Network:
    return ipaddress.ip_network(f"10.{60 + n // 65536}.{n // 256 % 256}.{n % 256}/32")


@pytest.mark.stores("sqlite", "postgres")
async def test_a_write_takes_few_statements(db_url: str) -> None:
    """An upsert (staleness check, record, addresses, audit row, feed) and its catalog update: at most 10 statements.

    The audit and feed rows are inserted by the group's commit, one statement each per group
    on SQLite; on PostgreSQL one statement inserts both, moves the head and notifies, and the record upsert
    inserts the instance row in the same statement (6).

    Before group commit and journal replay it took 17 (existing instance) to 20 (new one):
    several per primitive, and the catalog re-read six tables.
    """
    async with loaded_records(db_url) as (store, catalog, records):
        first = new_id()
        with counting(store) as new:
            await records.put_metadata(MetadataWrite(first, (host(1), host(2)), {"n": 1}), subject="t")
        with counting(store) as again:
            await records.put_metadata(MetadataWrite(first, (host(1), host(2)), {"n": 2}), subject="t")
        most = (6, 5) if db_url.startswith("postgresql") else (10, 8)
        assert new["statements"] <= most[0], new
        assert again["statements"] <= most[1], again
        assert new["commits"] == again["commits"] == 1
        entry = catalog.get(first)
        assert entry is not None
        assert entry.instance == await store.get(first)


@pytest.mark.stores("sqlite", "postgres")
async def test_concurrent_writes_share_commits(db_url: str) -> None:
    """32 writes released at once commit in a few transactions, at most 7 statements each, all acknowledged."""
    async with loaded_records(db_url) as (store, catalog, records):
        ids = [new_id() for _ in range(32)]
        gate = asyncio.Event()

        async def one(n: int) -> None:
            await gate.wait()
            await records.put_userdata(UserdataWrite(ids[n], (host(100 + n),), f"#{n}".encode()), subject="t")

        tasks = [asyncio.create_task(one(n)) for n in range(32)]
        await asyncio.sleep(0)
        with counting(store) as counts:
            gate.set()
            await asyncio.gather(*tasks)
        assert counts["commits"] <= 8, counts
        assert counts["statements"] <= 7 * 32, counts  # 19 each before; feed and audit rows go in per group
        stored = await store.get_many(ids)
        assert {i: s.userdata for i, s in stored.items()} == {i: f"#{n}".encode() for n, i in enumerate(ids)}
        for instance_id in ids:
            entry = catalog.get(instance_id)
            assert entry is not None
            assert entry.instance == stored[instance_id]


@pytest.mark.stores("sqlite", "postgres")
async def test_upserts_released_together_are_one_block(db_url: str) -> None:
    """32 single upserts released at once run as one batch: one commit, a batch's statements, 32 own results.

    Each write still gets its own answer (its moves and drops), its own feed block and audit
    row, and the catalog holds every write on return.
    """
    async with loaded_records(db_url) as (store, catalog, records):
        ids = [new_id() for _ in range(32)]
        await records.put_metadata(MetadataWrite(ids[0], (host(500),), {"n": -1}), subject="t")
        gate = asyncio.Event()

        async def one(n: int) -> WriteResult:
            await gate.wait()
            # Write 0 drops 500 and holds 501; write n > 0 holds 500 + n and 501 + n, taking 500 + n from write n - 1.
            addresses = (host(500 + n), host(501 + n)) if n else (host(501),)
            return await records.put_metadata(MetadataWrite(ids[n], addresses, {"n": n}), subject=f"s{n}")

        tasks = [asyncio.create_task(one(n)) for n in range(32)]
        await asyncio.sleep(0)
        with counting(store) as counts:
            gate.set()
            results = await asyncio.gather(*tasks)
        assert counts["commits"] == 1, counts
        assert counts["statements"] <= 12, counts  # 32 writes: about 8 each one by one
        assert results[0].dropped == (host(500),)
        for n in range(1, 32):
            assert (results[n].moved, results[n].dropped) == ({host(500 + n): ids[n - 1]}, ()), n
        stored = await store.get_many(ids)
        for n, instance_id in enumerate(ids):
            entry = catalog.get(instance_id)
            assert entry is not None
            assert entry.instance == stored[instance_id]
            assert stored[instance_id].metadata == {"n": n}
        audit = await store.audit(None, 0, 100)
        assert [entry.event.subject for entry in audit][-32:] == [f"s{n}" for n in range(32)]


async def test_a_failing_block_leaves_its_group_intact(store: Store) -> None:
    """In one group, a block that raises and one the database refuses leave nothing; the others all commit."""
    ids = [new_id() for _ in range(12)]
    gate = asyncio.Event()
    exited: dict[str, bool] = {}

    async def good(n: int, *, boom: bool = False) -> None:
        await gate.wait()
        async with store.write() as tx:
            await tx.put_records([(ids[n], {"n": n})], [])
            await tx.replace_addresses_many([(ids[n], (host(200 + n),))])
            await tx.mark_changed([ids[n]])
            if boom:
                raise Boom
        exited[ids[n]] = True

    async def raising(n: int) -> None:
        await good(n, boom=True)

    async def refused(n: int) -> None:
        await gate.wait()
        async with store.write() as tx:
            await tx.put_records([], [(ids[n], b"x")])
            await tx.mark_changed([ids[n]])
            await tx.put_password(new_id(), b"no such instance")  # foreign key (SQL) / missing row (memory)

    bad = {3: raising, 7: refused, 0: raising}
    tasks = [asyncio.create_task(bad.get(n, good)(n)) for n in range(12)]
    await asyncio.sleep(0)
    gate.set()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(outcomes[3], Boom)
    assert isinstance(outcomes[0], Boom)
    assert isinstance(outcomes[7], StoreUnavailable | KeyError)
    survivors = [ids[n] for n in range(12) if n not in bad]
    assert all(outcomes[n] is None for n in range(12) if n not in bad)
    stored = await store.get_many(ids)
    assert sorted(stored) == sorted(survivors)
    for n in range(12):
        if n not in bad:
            assert stored[ids[n]].metadata == {"n": n}
            assert stored[ids[n]].addresses == (host(200 + n),)
    snapshot, position = await store.snapshot()
    expected = sorted(host(200 + n) for n in range(12) if n not in bad)
    assert sorted({a for i in snapshot for a in i.addresses}) == expected
    feed = await store.changes_since(0)
    assert [c.seq for c in feed] == list(range(1, len(survivors) + 1))
    assert position == len(survivors)
    assert sorted(c.instance_id for c in feed) == sorted(survivors)


# --- 10k random operations: the catalog a write path keeps equals one rebuilt from the store ---

OPERATIONS = 10_000
WRITERS = 16
POOL = [host(1000 + n) for n in range(120)]


async def random_operations(records: Records, seed: int) -> None:
    """Random upserts (each moving addresses from a shared pool), batches, deletes and password changes."""
    ids = [new_id() for _ in range(150)]
    lock_of = {i: asyncio.Lock() for i in ids}  # one write at a time per instance keeps the history simple

    async def writer(rng: random.Random, count: int) -> None:
        for number in range(count):
            instance_id = rng.choice(ids)
            addresses = tuple(rng.sample(POOL, rng.choice([0, 1, 1, 2, 3])))
            roll = rng.random()
            if roll < 0.06:  # a batch (imds import): several instances in one block
                chosen = sorted({instance_id, *rng.sample(ids, 3)})
                async with contextlib.AsyncExitStack() as held:
                    for other in chosen:
                        await held.enter_async_context(lock_of[other])
                    await records.put_many([batch_item(rng, other, number) for other in chosen], subject="t")
                continue
            async with lock_of[instance_id]:
                try:
                    if roll < 0.45:
                        document = {"id": instance_id, "n": number, "nested": {"k": [1, 2.5, "x"]}}
                        await records.put_metadata(MetadataWrite(instance_id, addresses, document), subject="t")
                    elif roll < 0.8:
                        await records.put_userdata(UserdataWrite(instance_id, addresses, b"#%d" % number), subject="t")
                    elif roll < 0.92:
                        await records.delete(rng.choice([METADATA, USERDATA]), instance_id, subject="t")
                    elif roll < 0.97:
                        await records.set_password(instance_id, b"pw%d" % number)
                    else:
                        await records.clear_password(instance_id, subject="t")
                except (RecordNotFound, Conflict):
                    pass  # deleting what is absent, a second password: refused, nothing written

    rngs = [random.Random(seed * 100 + n) for n in range(WRITERS)]  # noqa: S311 - test data
    await asyncio.gather(*(writer(rng, OPERATIONS // WRITERS) for rng in rngs))


def batch_item(rng: random.Random, instance_id: str, number: int) -> tuple[MetadataWrite | None, UserdataWrite | None]:
    """One item of a batch: metadata, userdata or both, with addresses from the shared pool."""
    addresses = tuple(rng.sample(POOL, rng.choice([0, 1, 2])))
    kinds = rng.choice(["m", "u", "mu"])
    metadata = MetadataWrite(instance_id, addresses, {"id": instance_id, "n": number}) if "m" in kinds else None
    userdata = UserdataWrite(instance_id, addresses, b"#batch%d" % number) if "u" in kinds else None
    return metadata, userdata


def held(catalog: Catalog) -> dict[str, Instance]:
    return {i: e.instance for i in dict(catalog.holdings()) if (e := catalog.get(i)) is not None}


async def test_random_operations_keep_the_catalog_equal_to_the_store(db_url: str) -> None:
    """After 10k random upserts, moves and deletes by 16 writers, writer and follower catalogs equal a load."""
    store, other = open_store(db_url), None
    catalog = Catalog(store)
    try:
        await catalog.load()
        records = Records(store, catalog, Metrics())
        if not db_url.startswith("memory"):
            other = open_store(db_url)
            follower = Catalog(other)
            await follower.load()
        await random_operations(records, seed=12)
        rebuilt = Catalog(store)
        await rebuilt.load()
        assert len(rebuilt) > 50
        assert held(catalog) == held(rebuilt)
        assert catalog.position == rebuilt.position
        for address in POOL:
            found, expected = catalog.lookup(address.network_address), rebuilt.lookup(address.network_address)
            assert (found and found.instance.id) == (expected and expected.instance.id)
        if other is not None:
            await follower.catch_up()
            assert held(follower) == held(rebuilt)
    finally:
        await store.close()
        if other is not None:
            await other.close()
