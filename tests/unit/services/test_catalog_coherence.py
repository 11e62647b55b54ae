"""After 10,000 seeded random upserts, moves and deletes, the catalog equals one rebuilt from the store.

The writes go through ``Records`` on SQLite (the admin API's rules: full address lists, an
address taken by a later write moves, a deleted last record forgets the addresses; upserts
in small ``put_many`` batches, the import path), so the live catalog is kept by ``refresh``
alone; a second catalog then loads the store's snapshot in stored form. Their compact
indexes, entries and longest-prefix answers must be the same.
"""

from __future__ import annotations

import contextlib
import ipaddress
import random

import pytest

from imds.errors import RecordNotFound
from imds.metrics import Metrics
from imds.models import METADATA, USERDATA, Address, MetadataWrite, Network, UserdataWrite
from imds.services.catalog.catalog import Catalog
from imds.services.records.upsert import Records
from imds.store import Store, open_store

pytestmark = pytest.mark.anyio

OPERATIONS = 10_000
SUBJECT = "coherence-test"


def random_network(rng: random.Random) -> Network:
    """A host or a CIDR out of a small pool, so writes often take addresses from other instances."""
    if rng.random() < 0.6:
        prefix = rng.choice((32, 32, 32, 24, 16))
        value = (0x0A000000 | rng.getrandbits(12) << 4) >> (32 - prefix) << (32 - prefix)
        return ipaddress.IPv4Network((value, prefix))
    prefix = rng.choice((128, 128, 64))
    value = ((0x20010DB8 << 96) | rng.getrandbits(10)) >> (128 - prefix) << (128 - prefix)
    return ipaddress.IPv6Network((value, prefix))


def naive_lookup(holders: dict[Network, str], address: Address) -> str | None:
    """Longest-prefix match spelled out: every held network containing the address, longest wins."""
    matches = [network for network in holders if network.version == address.version and address in network]
    return holders[max(matches, key=lambda network: network.prefixlen)] if matches else None


def random_item(rng: random.Random, instance_id: str) -> tuple[MetadataWrite | None, UserdataWrite | None]:
    addresses = tuple(dict.fromkeys(random_network(rng) for _ in range(rng.randint(0, 3))))
    roll = rng.random()
    metadata = MetadataWrite(instance_id, addresses, {"id": instance_id, "n": rng.getrandbits(16), "name": "ünï ✓"})
    userdata = UserdataWrite(instance_id, addresses, rng.randbytes(8))
    return (metadata, None) if roll < 0.6 else (None, userdata) if roll < 0.8 else (metadata, userdata)


async def apply_random_operations(rng: random.Random, records: Records, ids: list[str]) -> int:
    """A batch of 1-8 upserts (often moving addresses), or one delete; how many operations that was."""
    if rng.random() < 0.75:
        items = [random_item(rng, rng.choice(ids)) for _ in range(rng.randint(1, 8))]
        await records.put_many(items, subject=SUBJECT)
        return len(items)
    with contextlib.suppress(RecordNotFound):  # deleting what is absent changes nothing
        await records.delete(rng.choice((METADATA, METADATA, USERDATA)), rng.choice(ids), subject=SUBJECT)
    return 1


async def test_the_live_catalog_equals_one_rebuilt_from_the_store_after_random_writes(sqlite_url):
    rng = random.Random(20261123)  # noqa: S311 - seeded test data, not secrets
    store = open_store(sqlite_url)
    try:
        await check_random_writes(rng, store)
    finally:
        await store.close()


async def check_random_writes(rng: random.Random, store: Store) -> None:
    live = Catalog(store, render_cache_bytes=64 << 10)
    await live.load()
    records = Records(store, live, Metrics())
    ids = [f"00000000-0000-4000-8000-{n:012d}" for n in range(150)]
    done = 0
    while done < OPERATIONS:
        done += await apply_random_operations(rng, records, ids)
        entry = live.get(rng.choice(ids))  # entries are read (materialised, cached, evicted) along the way
        if entry is not None:
            entry.render("probe", lambda instance: repr(instance).encode())

    rebuilt = Catalog(store)
    await rebuilt.load()
    instances, _ = await store.snapshot()
    assert len(instances) > 20  # the random walk left a populated fleet, not an empty one
    assert live._index._tables == rebuilt._index._tables
    assert live._index._lengths == rebuilt._index._lengths
    assert {i: set(keys) for i, keys in live._index._held.items()} == {
        i: set(keys) for i, keys in rebuilt._index._held.items()
    }
    assert sorted(live.holdings()) == sorted(rebuilt.holdings())
    by_id = {instance.id: instance for instance in instances}
    assert {entry_id: live.get(entry_id).instance for entry_id in by_id} == by_id  # type: ignore[union-attr]

    holders = {network: instance.id for instance in instances for network in instance.addresses}
    assert len(holders) == sum(len(instance.addresses) for instance in instances)  # each address held once
    for _ in range(2000):
        network = random_network(rng)
        probe = network.network_address + rng.getrandbits(2) if network.num_addresses > 4 else network.network_address
        expected = naive_lookup(holders, probe)
        assert [None if found is None else found.id for found in (live.lookup(probe), rebuilt.lookup(probe))] == [
            expected, expected], probe
