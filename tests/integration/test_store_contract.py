"""One contract for every Store: memory://, SQLite and PostgreSQL behave the same.

Each test runs once per implementation (the ``db_url`` fixture) through
``imds.store.open_store``, the way the service opens its store.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
from datetime import UTC, datetime

import pytest

from factories import new_id
from imds.errors import InvalidInput, RecordNotFound
from imds.metrics import Metrics
from imds.models import (
    METADATA,
    USERDATA,
    MetadataWrite,
    Network,
    SpelledIPv4Network,
    SpelledIPv6Network,
    UserdataWrite,
)
from imds.services.catalog.catalog import Catalog
from imds.services.catalog.entry import Entry, RenderCache
from imds.services.records.upsert import Records
from imds.store import Store, WriteTx

pytestmark = pytest.mark.anyio


def net(text: str) -> Network:
    return ipaddress.ip_network(text)


def nets(*texts: str) -> tuple[Network, ...]:
    return tuple(net(t) for t in texts)


async def holders(store: Store) -> dict[Network, str]:
    """Every address in the store, mapped to the instance holding it (asserting no address is held twice)."""
    instances, _ = await store.snapshot()
    found: dict[Network, str] = {}
    for instance in instances:
        for address in instance.addresses:
            assert address not in found, f"{address} held by {found[address]} and {instance.id}"
            found[address] = instance.id
    return found


async def put(store: Store, instance_id: str, addresses: tuple[Network, ...] = (), **records: object):
    """One write transaction that stores the given records and address list and marks the instance changed."""
    async with store.write() as tx:
        metadata = [(instance_id, records["metadata"])] if "metadata" in records else []
        userdata = [(instance_id, records["userdata"])] if "userdata" in records else []
        await tx.put_records(metadata, userdata)  # type: ignore[arg-type]
        (result,) = await tx.replace_addresses_many([(instance_id, addresses)])
        await tx.mark_changed([instance_id, *result[0].values()])
    return result


# --- the protocol itself ---------------------------------------------------------------


async def test_implements_the_runtime_checkable_protocols(store: Store) -> None:
    """Every store is a Store and hands out a WriteTx (runtime_checkable Protocols)."""
    assert isinstance(store, Store)
    async with store.write() as tx:
        assert isinstance(tx, WriteTx)
    await store.ping()


async def test_empty_store(store: Store) -> None:
    """A fresh store has no instances, an empty feed at position 0, and nothing under any id."""
    assert await store.snapshot() == ([], 0)
    assert await store.changes_since(0) == []
    assert await store.get(new_id()) is None
    assert await store.get_many([]) == {}


async def test_writes_and_reads_both_record_types(store: Store) -> None:
    """Metadata, userdata and addresses written in one transaction come back from get() with UTC timestamps."""
    instance_id = new_id()
    before = datetime.now(UTC)
    await put(store, instance_id, nets("10.0.0.1/32"), metadata={"id": instance_id, "hostname": "a"}, userdata=b"#!")
    instance = await store.get(instance_id)
    assert instance is not None
    assert instance.id == instance_id
    assert instance.metadata == {"id": instance_id, "hostname": "a"}
    assert instance.userdata == b"#!"
    assert instance.addresses == nets("10.0.0.1/32")
    for stamp in (instance.metadata_updated_at, instance.userdata_updated_at):
        assert stamp is not None
        assert stamp.utcoffset() is not None
        assert stamp.utcoffset().total_seconds() == 0  # type: ignore[union-attr]
        assert before.replace(microsecond=0) <= stamp.replace(microsecond=0) <= datetime.now(UTC)


async def test_one_record_type_leaves_the_other_absent(store: Store) -> None:
    """An instance with only userdata has metadata None (and vice versa), and has_record tells them apart."""
    only_userdata, only_metadata = new_id(), new_id()
    await put(store, only_userdata, userdata=b"u")
    await put(store, only_metadata, metadata={"k": "v"})
    a, b = await store.get(only_userdata), await store.get(only_metadata)
    assert a is not None
    assert b is not None
    assert (a.metadata, a.metadata_updated_at, a.userdata) == (None, None, b"u")
    assert (b.userdata, b.userdata_updated_at, b.metadata) == (None, None, {"k": "v"})
    async with store.write() as tx:
        assert await tx.has_record(USERDATA, only_userdata)
        assert not await tx.has_record(METADATA, only_userdata)
        assert await tx.has_record(METADATA, only_metadata)
        assert not await tx.has_record(USERDATA, only_metadata)
        assert await tx.metadata_of_many([only_metadata]) == {only_metadata: {"k": "v"}}
        assert await tx.metadata_of_many([only_userdata]) == {}
        assert await tx.metadata_of_many([new_id()]) == {}


async def test_an_unknown_record_kind_is_refused(store: Store) -> None:
    """has_record and remove_record refuse any kind but metadata and userdata (InvalidInput); no table is guessed."""
    instance_id = new_id()
    await put(store, instance_id, metadata={"k": "v"}, userdata=b"u")
    async with store.write() as tx:
        for kind in ("password", "os", "Userdata", ""):
            with pytest.raises(InvalidInput) as refused:
                await tx.has_record(kind, instance_id)
            assert [problem.field for problem in refused.value.problems] == ["kind"]
            assert repr(kind) in refused.value.problems[0].message
            with pytest.raises(InvalidInput):
                await tx.remove_record(kind, instance_id)
    kept = await store.get(instance_id)
    assert kept is not None
    assert (kept.metadata, kept.userdata) == ({"k": "v"}, b"u")


async def test_put_replaces_the_record(store: Store) -> None:
    """A second put of a record type replaces the first entirely (no merge)."""
    instance_id = new_id()
    await put(store, instance_id, metadata={"a": 1, "b": 2}, userdata=b"old")
    await put(store, instance_id, metadata={"c": 3}, userdata=b"new")
    instance = await store.get(instance_id)
    assert instance is not None
    assert (instance.metadata, instance.userdata) == ({"c": 3}, b"new")


async def test_get_many_returns_only_known_ids(store: Store) -> None:
    """get_many answers the ids that exist and silently omits unknown ones and duplicates."""
    a, b, unknown = new_id(), new_id(), new_id()
    await put(store, a, metadata={"n": "a"})
    await put(store, b, userdata=b"b")
    found = await store.get_many([a, unknown, b, a])
    assert set(found) == {a, b}
    assert found[a].metadata == {"n": "a"}
    assert found[b].userdata == b"b"
    assert await store.get_many([unknown]) == {}


# --- addresses -------------------------------------------------------------------------


async def test_replace_addresses_full_list_replaces(store: Store) -> None:
    """The list given is the whole truth: unlisted addresses are dropped and reported, new ones added."""
    instance_id = new_id()
    moved, dropped = await put(store, instance_id, nets("10.9.0.1/32", "10.9.0.2/32"), metadata={})
    assert (moved, dropped) == ({}, ())
    moved, dropped = await put(store, instance_id, nets("10.9.0.2/32", "10.9.0.3/32"), metadata={})
    assert moved == {}
    assert dropped == nets("10.9.0.1/32")
    assert await holders(store) == {net("10.9.0.2/32"): instance_id, net("10.9.0.3/32"): instance_id}
    moved, dropped = await put(store, instance_id, (), metadata={})
    assert moved == {}
    assert set(dropped) == set(nets("10.9.0.2/32", "10.9.0.3/32"))
    assert await holders(store) == {}
    instance = await store.get(instance_id)
    assert instance is not None
    assert instance.addresses == ()


async def test_replace_addresses_moves_from_previous_holder(store: Store) -> None:
    """An address held by another instance moves; the previous holder is returned and keeps its other addresses."""
    a, b = new_id(), new_id()
    await put(store, a, nets("10.8.0.1/32", "10.8.0.2/32"), metadata={"n": "a"})
    moved, dropped = await put(store, b, nets("10.8.0.2/32", "10.8.0.3/32"), userdata=b"b")
    assert moved == {net("10.8.0.2/32"): a}
    assert dropped == ()
    assert await holders(store) == {
        net("10.8.0.1/32"): a,
        net("10.8.0.2/32"): b,
        net("10.8.0.3/32"): b,
    }
    loser = await store.get(a)
    assert loser is not None
    assert loser.addresses == nets("10.8.0.1/32")
    assert loser.metadata == {"n": "a"}


async def test_replace_addresses_reports_each_previous_holder(store: Store) -> None:
    """Taking addresses from two instances at once reports each address with its own previous holder."""
    a, b, c = new_id(), new_id(), new_id()
    await put(store, a, nets("10.7.0.1/32"), metadata={})
    await put(store, b, nets("10.7.0.2/32", "10.7.0.3/32"), metadata={})
    moved, _ = await put(store, c, nets("10.7.0.1/32", "10.7.0.2/32", "10.7.0.4/32"), metadata={})
    assert moved == {net("10.7.0.1/32"): a, net("10.7.0.2/32"): b}
    assert await holders(store) == {
        net("10.7.0.1/32"): c,
        net("10.7.0.2/32"): c,
        net("10.7.0.3/32"): b,
        net("10.7.0.4/32"): c,
    }


async def test_another_spelling_of_a_held_network_moves_it(store: Store) -> None:
    """10.70.17.9/31 and 10.70.17.8/31 are one network: the later write takes it, whatever the spelling.

    SQL rows are keyed by the address as sent, so both spellings stayed, each instance holding
    "its" network, and which one a replica served depended on its load order.
    """
    a, b, c = new_id(), new_id(), new_id()
    await put(store, a, (SpelledIPv4Network("10.70.17.9/31"), net("10.70.18.1/32")), metadata={})
    moved, _ = await put(store, b, nets("10.70.17.8/31"), metadata={})
    assert moved == {net("10.70.17.8/31"): a}
    await put(store, c, (SpelledIPv6Network("2604:1380:4641:1f00::9/127"),), metadata={})
    moved, _ = await put(store, a, (SpelledIPv4Network("10.70.17.9/31"), net("10.70.18.1/32"),
                                    SpelledIPv6Network("2604:1380:4641:1f00::8/127")), metadata={})
    assert moved == {net("10.70.17.8/31"): b, net("2604:1380:4641:1f00::8/127"): c}
    held = await holders(store)  # asserts no network is held twice
    assert held == {net("10.70.17.8/31"): a, net("10.70.18.1/32"): a, net("2604:1380:4641:1f00::8/127"): a}
    found = await store.get(a)
    assert found is not None
    assert sorted(str(address) for address in found.addresses) == [
        "10.70.17.9/31", "10.70.18.1/32", "2604:1380:4641:1f00::8/127"]  # kept as sent
    for loser in (b, c):
        instance = await store.get(loser)
        assert instance is not None
        assert instance.addresses == ()


async def test_replacing_with_own_addresses_moves_nothing(store: Store) -> None:
    """Re-sending the instance's own list reports nothing moved and nothing dropped."""
    instance_id = new_id()
    await put(store, instance_id, nets("10.6.0.1/32", "10.6.0.2/32"), metadata={})
    assert await put(store, instance_id, nets("10.6.0.2/32", "10.6.0.1/32"), metadata={}) == ({}, ())


async def test_forget_instance_removes_instance_and_addresses(store: Store) -> None:
    """forget_instance deletes the instance and frees its addresses, which another instance then takes unmoved."""
    a, b = new_id(), new_id()
    await put(store, a, nets("10.5.0.1/32", "10.5.0.0/24"), metadata={}, userdata=b"x")
    async with store.write() as tx:
        await tx.forget_instance(a)
        await tx.mark_changed([a])
    assert await store.get(a) is None
    assert await holders(store) == {}
    moved, _ = await put(store, b, nets("10.5.0.1/32"), metadata={})
    assert moved == {}
    assert await holders(store) == {net("10.5.0.1/32"): b}


async def test_ipv6_and_cidrs_round_trip(store: Store) -> None:
    """IPv4/IPv6 hosts and CIDRs come back as the same normalised networks, v4 and v6 kept apart."""
    instance_id = new_id()
    addresses = nets("10.4.0.7/32", "10.4.128.0/17", "fd00::a9fe:a9fe/128", "2001:db8:1::/48", "::ffff:10.4.0.8/128")
    await put(store, instance_id, addresses, metadata={})
    instance = await store.get(instance_id)
    assert instance is not None
    assert set(instance.addresses) == set(addresses)
    assert len(instance.addresses) == len(addresses)
    by_text = {str(a): a for a in instance.addresses}
    assert isinstance(by_text["fd00::a9fe:a9fe/128"], ipaddress.IPv6Network)
    assert isinstance(by_text["10.4.128.0/17"], ipaddress.IPv4Network)
    assert by_text["2001:db8:1::/48"].prefixlen == 48
    assert await holders(store) == dict.fromkeys(addresses, instance_id)


# --- record contents -------------------------------------------------------------------


METADATA_DOC = {
    "id": "ünïcødé",
    "hostname": "主机-01.例子.测试",
    "emoji": "🚀✓",
    "escapes": 'tab\tnewline\nquote"backslash\\slash/',
    "nul": "a\u0000b",
    "control": "\u0001\u001f\u007f",
    "numbers": {"int": 42, "negative": -7, "big": 2**53 + 1, "float": 0.1, "exp": 1.5e300, "zero": 0},
    "flags": [True, False, None],
    "empty": {"object": {}, "list": [], "string": ""},
    "nested": {"a": [{"b": [{"c": {"d": ["deep", 1, None, {"e": "ë"}]}}]}]},
    "network": {"addresses": [{"address": "10.0.0.1", "cidr": 31, "public": False}]},
    "updated_at": "2024-05-06T07:08:09.123456Z",
}


async def test_json_metadata_round_trips_exactly(store: Store) -> None:
    """Nested, unicode, escaped and numeric JSON values come back equal, with the same types and key order."""
    instance_id = new_id()
    await put(store, instance_id, metadata=METADATA_DOC)
    instance = await store.get(instance_id)
    assert instance is not None
    assert instance.metadata == METADATA_DOC
    assert list(instance.metadata) == list(METADATA_DOC)
    numbers = instance.metadata["numbers"]
    assert type(numbers["big"]) is int
    assert numbers["big"] == 2**53 + 1
    assert type(numbers["float"]) is float
    async with store.write() as tx:
        assert await tx.metadata_of_many([instance_id]) == {instance_id: METADATA_DOC}


async def test_binary_userdata_round_trips_exactly(store: Store) -> None:
    """Userdata holding all 256 byte values (and the empty string) comes back byte for byte."""
    blob = bytes(range(256)) * 3 + b"\x00"
    a, b = new_id(), new_id()
    await put(store, a, userdata=blob)
    await put(store, b, userdata=b"")
    found = await store.get_many([a, b])
    assert found[a].userdata == blob
    assert type(found[a].userdata) is bytes
    assert found[b].userdata == b""


# --- change feed -----------------------------------------------------------------------


async def test_mark_changed_sequence_strictly_increases(store: Store) -> None:
    """Each marked id gets its own feed entry; seqs strictly increase across and within transactions."""
    a, b, c = new_id(), new_id(), new_id()
    async with store.write() as tx:
        await tx.put_records([(a, {})], [])
        await tx.mark_changed([a, b, a])  # one entry per id, in first-seen order
    async with store.write() as tx:
        await tx.mark_changed([c])
    async with store.write() as tx:
        await tx.mark_changed([a])
    feed = await store.changes_since(0)
    assert [change.instance_id for change in feed] == [a, b, c, a]
    seqs = [change.seq for change in feed]
    assert seqs[0] > 0
    assert all(later > earlier for earlier, later in itertools.pairwise(seqs))


async def test_changes_since_is_ordered_and_respects_limit(store: Store) -> None:
    """changes_since returns the entries after the given seq, oldest first, at most ``limit`` of them."""
    ids = [new_id() for _ in range(7)]
    for instance_id in ids:
        async with store.write() as tx:
            await tx.mark_changed([instance_id])
    feed = await store.changes_since(0)
    assert [c.instance_id for c in feed] == ids
    seqs = [c.seq for c in feed]
    assert await store.changes_since(0, limit=3) == feed[:3]
    assert await store.changes_since(seqs[2]) == feed[3:]
    assert await store.changes_since(seqs[2], limit=2) == feed[3:5]
    assert await store.changes_since(seqs[-1]) == []
    # paging with limit walks the whole feed exactly once
    paged, position = [], 0
    while batch := await store.changes_since(position, limit=2):
        paged += batch
        position = batch[-1].seq
    assert paged == feed


async def test_write_without_changes_leaves_feed_alone(store: Store) -> None:
    """A transaction that marks nothing changed appends nothing to the feed."""
    async with store.write() as tx:
        await tx.put_records([(new_id(), {})], [])
    instances, position = await store.snapshot()
    assert len(instances) == 1
    assert position == 0
    assert await store.changes_since(0) == []


async def test_snapshot_returns_every_instance_and_feed_position(store: Store) -> None:
    """snapshot() holds every instance with its records and addresses, and the seq of the last feed entry."""
    a, b, c = new_id(), new_id(), new_id()
    await put(store, a, nets("10.3.0.1/32"), metadata={"n": "a"})
    await put(store, b, nets("10.3.0.2/32", "fd00:3::/64"), userdata=b"b")
    await put(store, c, (), metadata={"n": "c"}, userdata=b"c")
    instances, position = await store.snapshot()
    assert position == (await store.changes_since(0))[-1].seq
    by_id = {i.id: i for i in instances}
    assert set(by_id) == {a, b, c}
    assert len(instances) == 3
    assert by_id[a].metadata == {"n": "a"}
    assert by_id[a].addresses == nets("10.3.0.1/32")
    assert by_id[b].userdata == b"b"
    assert set(by_id[b].addresses) == set(nets("10.3.0.2/32", "fd00:3::/64"))
    assert (by_id[c].metadata, by_id[c].userdata, by_id[c].addresses) == ({"n": "c"}, b"c", ())
    assert by_id == await store.get_many([a, b, c])


async def test_snapshot_chunks_stream_the_same_snapshot_in_stored_form(store: Store) -> None:
    """snapshot_chunks(2) yields the snapshot in pages of at most 2 (position and total on each), stored form.

    Each streamed row, made a catalog entry, materialises to exactly the instance ``snapshot``
    parsed (document, addresses in order, timestamps, userdata, password).
    """
    for n in range(5):
        records = {"metadata": {"n": n, "name": "ünï ✓", "deep": {"list": [n, None, 1.5]}},
                   **({"userdata": b"u"} if n % 2 else {})}
        wide = ("10.44.0.0/16",) if n == 0 else ()
        await put(store, new_id(), nets(f"10.4.0.{n + 1}/32", f"fd00:4::{n + 1}/128", *wide), **records)
    instances, position = await store.snapshot()
    pages = [page async for page in store.snapshot_chunks(2)]
    assert [len(chunk) for chunk, _, _ in pages] == [2, 2, 1]
    assert {(seq, total) for _, seq, total in pages} == {(position, 5)}
    streamed = [stored for chunk, _, _ in pages for stored in chunk]
    assert sorted(stored.id for stored in streamed) == sorted(instance.id for instance in instances)
    cache = RenderCache(1 << 20)
    by_id = {instance.id: instance for instance in instances}
    for stored in streamed:
        assert Entry(stored, cache).instance == by_id[stored.id]


async def test_snapshot_chunks_is_one_snapshot_while_writes_land(store: Store) -> None:
    """Writes committed between two pages (a changed instance, a new one) are not in the stream, nor its position."""
    ids = sorted(new_id() for _ in range(3))
    for n, instance_id in enumerate(ids):
        await put(store, instance_id, nets(f"10.5.0.{n + 1}/32"), metadata={"v": 1})
    stream = store.snapshot_chunks(1)
    first = await anext(stream)
    await put(store, ids[-1], nets("10.5.0.9/32"), metadata={"v": 2})
    await put(store, "ffffffff-ffff-4fff-bfff-ffffffffffff", nets("10.5.0.10/32"), metadata={"v": 2})
    pages = [first, *[page async for page in stream]]
    streamed = [stored for chunk, _, _ in pages for stored in chunk]
    assert sorted(stored.id for stored in streamed) == ids
    assert [json.loads(stored.document or "null") for stored in streamed] == [{"v": 1}] * 3
    assert [stored.addresses for stored in streamed if stored.id == ids[-1]] == [["10.5.0.3/32"]]
    assert {(seq, total) for _, seq, total in pages} == {(first[1], 3)}
    assert (await store.changes_since(first[1]))  # the writes are in the feed after the snapshot's position


# --- atomicity -------------------------------------------------------------------------


class Boom(Exception):
    """Raised inside a write block to force a rollback."""


async def test_exception_in_write_rolls_everything_back(store: Store) -> None:
    """An exception inside write() leaves nothing behind: records, address moves, drops, forgets and feed."""
    a, b, fresh = new_id(), new_id(), new_id()
    await put(store, a, nets("10.2.0.1/32", "10.2.0.2/32"), metadata={"v": 1}, userdata=b"a1")
    await put(store, b, nets("10.2.0.3/32"), metadata={"v": 1})
    before_instances, before_position = await store.snapshot()
    before_feed = await store.changes_since(0)

    async def everything_then_fail() -> None:
        async with store.write() as tx:
            await tx.put_records([(a, {"v": 2})], [])
            await tx.put_records([], [(a, b"a2")])
            await tx.put_records([(fresh, {"v": "fresh"})], [])
            await tx.replace_addresses_many([(fresh, nets("10.2.0.2/32", "10.2.0.9/32"))])  # moves one of a's
            await tx.replace_addresses_many([(a, nets("10.2.0.3/32"))])  # drops a's, moves b's
            await tx.remove_record(METADATA, b)
            await tx.forget_instance(b)
            await tx.mark_changed([a, b, fresh])
            raise Boom

    with pytest.raises(Boom):
        await everything_then_fail()

    instances, position = await store.snapshot()
    assert position == before_position
    assert sorted(instances, key=lambda i: i.id) == sorted(before_instances, key=lambda i: i.id)
    assert await store.changes_since(0) == before_feed
    assert await store.get(fresh) is None
    assert await holders(store) == {net("10.2.0.1/32"): a, net("10.2.0.2/32"): a, net("10.2.0.3/32"): b}

    # the store is still usable, and the next entry comes after everything before the rollback
    await put(store, fresh, nets("10.2.0.9/32"), metadata={"v": "fresh"})
    feed = await store.changes_since(before_position)
    assert [c.instance_id for c in feed] == [fresh]
    assert feed[0].seq > before_position


async def test_failed_write_does_not_block_the_next(store: Store) -> None:
    """After a rolled-back write the store accepts writes again (the writer lock was released)."""
    instance_id = new_id()

    async def fail() -> None:
        async with store.write() as tx:
            await tx.put_records([], [(instance_id, b"never")])
            await tx.mark_changed([instance_id])
            raise Boom

    for _ in range(3):
        with pytest.raises(Boom):
            await fail()
    await put(store, instance_id, userdata=b"ok")
    instance = await store.get(instance_id)
    assert instance is not None
    assert instance.userdata == b"ok"
    assert [c.instance_id for c in await store.changes_since(0)] == [instance_id]


# --- Records (services/records/upsert.py) over each store --------------------------------------


@pytest.fixture
def records(store: Store) -> Records:
    """The write rules over this store, with a catalog that is refreshed after each write."""
    return Records(store, Catalog(store), Metrics())


def meta(instance_id: str, *addresses: str, **document: object) -> MetadataWrite:
    return MetadataWrite(instance_id, nets(*addresses), {"id": instance_id, **document})


def user(instance_id: str, *addresses: str, data: bytes = b"#cloud-config\n") -> UserdataWrite:
    return UserdataWrite(instance_id, nets(*addresses), data)


async def test_records_move_address_across_record_types(store: Store, records: Records) -> None:
    """A userdata write for B takes an address from A's metadata write; A keeps its metadata, reachable by id."""
    a, b = new_id(), new_id()
    first = await records.put_metadata(meta(a, "10.1.0.1/32", "10.1.0.2/32", hostname="a"), subject="t")
    assert first.applied
    assert first.moved == {}
    second = await records.put_userdata(user(b, "10.1.0.2/32", "10.1.0.3/32"), subject="t")
    assert second.applied
    assert second.moved == {net("10.1.0.2/32"): a}
    assert await holders(store) == {net("10.1.0.1/32"): a, net("10.1.0.2/32"): b, net("10.1.0.3/32"): b}
    kept = await records.get(METADATA, a)
    assert kept.metadata == {"id": a, "hostname": "a"}
    assert kept.addresses == nets("10.1.0.1/32")
    assert (await records.get(USERDATA, b)).userdata == b"#cloud-config\n"
    # both instances are in the feed for the move, so other replicas learn about the loser too
    assert [c.instance_id for c in await store.changes_since(0)][-2:] == [b, a]


async def test_records_staleness_guard(store: Store, records: Records) -> None:
    """An older top-level updated_at changes nothing (addresses included); an equal or newer one applies."""
    instance_id = new_id()
    t1, t2, t3 = "2024-01-01T00:00:00Z", "2024-01-01T00:00:00.000001+00:00", "2024-06-01T12:00:00+02:00"
    assert (await records.put_metadata(meta(instance_id, "10.11.0.1/32", updated_at=t2, v=2), subject="t")).applied
    instances, position = await store.snapshot()

    stale = await records.put_metadata(meta(instance_id, "10.11.0.2/32", updated_at=t1, v=1), subject="t")
    assert not stale.applied
    assert stale.reason is not None
    assert "stale" in stale.reason
    assert (stale.moved, stale.dropped, stale.addresses) == ({}, (), ())
    assert await store.snapshot() == (instances, position)
    assert await holders(store) == {net("10.11.0.1/32"): instance_id}

    equal = await records.put_metadata(meta(instance_id, "10.11.0.3/32", updated_at=t2, v="equal"), subject="t")
    assert equal.applied
    assert equal.dropped == nets("10.11.0.1/32")
    assert (await records.get(METADATA, instance_id)).metadata == {"id": instance_id, "updated_at": t2, "v": "equal"}

    newer = await records.put_metadata(meta(instance_id, "10.11.0.4/32", updated_at=t3, v=3), subject="t")
    assert newer.applied
    stored = await store.get(instance_id)
    assert stored is not None
    assert stored.metadata == {"id": instance_id, "updated_at": t3, "v": 3}
    assert stored.addresses == nets("10.11.0.4/32")


async def test_records_stale_write_cannot_take_addresses(store: Store, records: Records) -> None:
    """A stale metadata write naming another instance's address leaves that address where it was."""
    a, b = new_id(), new_id()
    await records.put_metadata(meta(a, "10.12.0.1/32", updated_at="2024-02-02T00:00:00Z"), subject="t")
    await records.put_userdata(user(b, "10.12.0.2/32"), subject="t")
    stale = await records.put_metadata(meta(a, "10.12.0.2/32", updated_at="2024-01-01T00:00:00Z"), subject="t")
    assert not stale.applied
    assert await holders(store) == {net("10.12.0.1/32"): a, net("10.12.0.2/32"): b}


async def test_records_delete_semantics(store: Store, records: Records) -> None:
    """Deleting metadata while userdata remains keeps addresses; deleting the last record type removes them."""
    instance_id = new_id()
    await records.put_metadata(meta(instance_id, "10.13.0.1/32", "fd00:13::1/128"), subject="t")
    await records.put_userdata(user(instance_id, "10.13.0.1/32", "fd00:13::1/128", data=b"u"), subject="t")
    position = (await store.snapshot())[1]

    await records.delete(METADATA, instance_id, subject="t")
    left = await store.get(instance_id)
    assert left is not None
    assert (left.metadata, left.userdata) == (None, b"u")
    assert set(left.addresses) == set(nets("10.13.0.1/32", "fd00:13::1/128"))
    with pytest.raises(RecordNotFound):
        await records.get(METADATA, instance_id)
    assert (await records.get(USERDATA, instance_id)).userdata == b"u"

    with pytest.raises(RecordNotFound) as absent:
        await records.delete(METADATA, instance_id, subject="t")
    assert (absent.value.kind, absent.value.instance_id) == (METADATA, instance_id)

    await records.delete(USERDATA, instance_id, subject="t")
    assert await store.get(instance_id) is None
    assert await holders(store) == {}
    assert [c.instance_id for c in await store.changes_since(position)] == [instance_id, instance_id]


async def test_records_delete_userdata_keeps_metadata_addresses(store: Store, records: Records) -> None:
    """Deleting userdata while metadata remains keeps the addresses with the metadata."""
    instance_id = new_id()
    await records.put_userdata(user(instance_id, "10.14.0.1/32"), subject="t")
    await records.put_metadata(meta(instance_id, "10.14.0.1/32", "10.14.0.2/32"), subject="t")
    await records.delete(USERDATA, instance_id, subject="t")
    assert await holders(store) == {net("10.14.0.1/32"): instance_id, net("10.14.0.2/32"): instance_id}
    with pytest.raises(RecordNotFound):
        await records.delete(USERDATA, instance_id, subject="t")


async def test_records_delete_of_unknown_instance_raises(store: Store, records: Records) -> None:
    """Deleting either record type of an instance that was never written raises RecordNotFound and logs no change."""
    unknown = new_id()
    for kind in (METADATA, USERDATA):
        with pytest.raises(RecordNotFound):
            await records.delete(kind, unknown, subject="t")
    assert await store.snapshot() == ([], 0)
