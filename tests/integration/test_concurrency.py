"""Hundreds of overlapping admin writes, checked against the order in which they committed.

Why the check is exact
----------------------
Every instance is written by exactly one task, one write at a time, so the writes of one
instance are totally ordered by the test itself (program order). The store serialises
writers and each applied write appends one contiguous block to the change feed:
``[its instance, *distinct previous holders of the addresses it took]``. Walking the feed
from the start therefore splits it into blocks deterministically: the entry at a block
start names an instance, whose next unconsumed write (program order) must be the one that
committed there, and that write's response (``moved``) says how long its block is and what
the rest of the block must contain. This yields the commit order of every acknowledged
write, or fails if a write is missing, duplicated, interleaved or committed twice.

The commit order is then checked three ways:

* real time: a write acknowledged before another was sent must have committed first;
* replay: applying the writes one by one in commit order to a plain dict (address →
  holder) must reproduce exactly the ``moved`` and ``dropped`` that each response
  reported — a lost update (two writers both seeing an address free, or a move not seen by
  a concurrent writer) breaks this;
* final state: the store, each replica's in-memory catalog and an instance read
  (``GET /metadata`` and ``/userdata`` from the address itself) all agree with the replay:
  every address belongs to the instance of the last committed write that named it (unless
  that instance later dropped it), no address is held twice, and each instance's records
  are those of its last write of each kind.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import random
import time
from collections import defaultdict, deque
from collections.abc import Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

import httpx
import pytest

from factories import metadata_body, new_id, userdata_body
from helpers import admin_client, client_from, make_settings, running_app
from imds.models import Change, Network
from imds.store import Store, open_store
from imds.web.instance import InstanceFront

pytestmark = pytest.mark.timeout(180)

POOL = [f"10.77.0.{n}" for n in range(1, 25)] + [f"fd77::{n:x}" for n in range(1, 7)]  # 30 host addresses
INSTANCES = 40
RUN_BUDGET_SECONDS = 60.0


@dataclass
class Write:
    """One admin write as the client saw it."""

    number: int
    kind: str
    instance_id: str
    addresses: tuple[str, ...]
    started: int = 0
    acked: int | None = None
    status: int | None = None
    moved: dict[str, str] = field(default_factory=dict)
    dropped: tuple[str, ...] = ()


@dataclass
class Model:
    """The result of applying the writes one at a time in commit order."""

    holders: dict[str, str] = field(default_factory=dict)
    last_metadata: dict[str, int] = field(default_factory=dict)
    last_userdata: dict[str, int] = field(default_factory=dict)


def userdata_of(number: int) -> bytes:
    return f"#!/bin/sh\n# write {number}\n".encode()


def plan(seed: int, instances: int, writes_each: int) -> list[list[Write]]:
    """Per instance, its writes in program order: random kind, random subset of the shared pool."""
    rng = random.Random(seed)  # noqa: S311 - reproducible test data, not cryptography
    numbers = itertools.count(1)
    plans = []
    for _ in range(instances):
        instance_id = new_id()
        writes = []
        for _ in range(writes_each):
            size = rng.choice([0, 1, 2, 2, 3, 3, 4, 5])
            writes.append(
                Write(next(numbers), rng.choice(["metadata", "userdata"]), instance_id, tuple(rng.sample(POOL, size)))
            )
        plans.append(writes)
    return plans


async def run_writes(clients: list[httpx.AsyncClient], plans: list[list[Write]]) -> float:
    """Run one task per instance, all at once; instance i writes through clients[i % len(clients)]."""
    clock = itertools.count(1)
    start = asyncio.Event()

    async def task(client: httpx.AsyncClient, writes: list[Write]) -> None:
        await start.wait()
        for w in writes:
            if w.kind == "metadata":
                path, body = "/device-metadata", metadata_body(w.instance_id, list(w.addresses), write=w.number)
            else:
                body = userdata_body(w.instance_id, list(w.addresses), userdata_of(w.number).decode())
                path, body["userdata_encoding"] = "/device-userdata", "text"
            w.started = next(clock)
            response = await client.post(path, json=body)
            w.acked = next(clock)  # the moment the acknowledgement arrived
            w.status = response.status_code
            if response.status_code == 200:
                answer = response.json()
                assert answer["applied"] is True, answer
                assert sorted(answer["ipAddresses"]) == sorted(w.addresses)
                w.moved, w.dropped = answer["moved"], tuple(answer["dropped"])

    tasks = [asyncio.create_task(task(clients[i % len(clients)], writes)) for i, writes in enumerate(plans)]
    began = time.monotonic()
    start.set()
    await asyncio.gather(*tasks)
    return time.monotonic() - began


async def whole_feed(store: Store) -> list[Change]:
    feed: list[Change] = []
    while batch := await store.changes_since(feed[-1].seq if feed else 0, limit=500):
        feed += batch
    return feed


def commit_order(feed: list[Change], plans: list[list[Write]]) -> list[Write]:
    """Split the feed into one block per write (see the module docstring) and return the writes in commit order."""
    pending = {writes[0].instance_id: deque(writes) for writes in plans}
    order: list[Write] = []
    position = 0
    while position < len(feed):
        head = feed[position]
        queue = pending.get(head.instance_id)
        assert queue, f"feed entry {head} starts a block but no write of {head.instance_id} is left"
        w = queue.popleft()
        losers = set(w.moved.values())
        block = feed[position + 1 : position + 1 + len(losers)]
        assert {c.instance_id for c in block} == losers, f"write {w.number}: block {block} != previous holders {losers}"
        assert len(block) == len(losers)
        order.append(w)
        position += 1 + len(losers)
    left = [w.number for queue in pending.values() for w in queue]
    assert not left, f"acknowledged writes missing from the change feed: {left}"
    seqs = [c.seq for c in feed]
    assert seqs == sorted(set(seqs)), "feed sequence numbers must strictly increase"
    return order


def check_real_time(order: list[Write]) -> None:
    """No write committed before a write that had been acknowledged before it was even sent."""
    for i, earlier in enumerate(order):
        for later in order[i + 1 :]:
            assert later.acked is not None
            assert not later.acked < earlier.started, (
                f"write {later.number} was acknowledged before write {earlier.number} was sent, yet committed after it"
            )


def replay(order: list[Write]) -> Model:
    """Apply the writes in commit order; each response's moved/dropped must match what the replay saw."""
    model = Model()
    for w in order:
        wanted = set(w.addresses)
        moved = {a: model.holders[a] for a in w.addresses if model.holders.get(a, w.instance_id) != w.instance_id}
        dropped = {a for a, holder in model.holders.items() if holder == w.instance_id and a not in wanted}
        assert w.moved == moved, f"write {w.number} reported moved {w.moved}, serial order says {moved}"
        assert set(w.dropped) == dropped, f"write {w.number} reported dropped {w.dropped}, serial order says {dropped}"
        assert len(w.dropped) == len(dropped)
        for a in dropped:
            del model.holders[a]
        for a in wanted:
            model.holders[a] = w.instance_id
        (model.last_metadata if w.kind == "metadata" else model.last_userdata)[w.instance_id] = w.number
    return model


def address_map(addresses_by_id: Iterator[tuple[str, tuple[Network, ...]]]) -> dict[str, str]:
    """Map each address to the instance holding it, failing when an address is held twice."""
    found: dict[str, str] = {}
    for instance_id, networks in addresses_by_id:
        for network in networks:
            address = str(network.network_address)
            assert address not in found, f"{address} is held by both {found[address]} and {instance_id}"
            found[address] = instance_id
    return found


async def check_store(store: Store, model: Model) -> None:
    instances, position = await store.snapshot()
    assert position == (await whole_feed(store))[-1].seq
    assert address_map((i.id, i.addresses) for i in instances) == model.holders
    by_id = {i.id: i for i in instances}
    assert set(by_id) == set(model.last_metadata) | set(model.last_userdata)
    for instance_id, instance in by_id.items():
        number = model.last_metadata.get(instance_id)
        assert (instance.metadata or {}).get("write") == number
        number = model.last_userdata.get(instance_id)
        assert instance.userdata == (userdata_of(number) if number is not None else None)


def check_catalog(app: InstanceFront, model: Model) -> None:
    catalog = app.services.catalog
    entries = catalog._entries
    assert address_map((i, e.instance.addresses) for i, e in entries.items()) == model.holders
    for address in POOL:
        entry = catalog.lookup(ipaddress.ip_address(address))
        assert (entry.instance.id if entry else None) == model.holders.get(address), address


async def check_instance_reads(app: InstanceFront, model: Model) -> None:
    """Each pool address reads its holder's last metadata and userdata (404 when it has none)."""
    for address in POOL:
        holder = model.holders.get(address)
        async with client_from(app, address) as client:
            metadata, userdata = await client.get("/metadata"), await client.get("/userdata")
        number = model.last_metadata.get(holder) if holder else None
        if number is None:
            assert metadata.status_code == 404, (address, metadata.text)
        else:
            assert metadata.status_code == 200, (address, metadata.text)
            assert (metadata.json()["id"], metadata.json()["write"]) == (holder, number)
        number = model.last_userdata.get(holder) if holder else None
        if number is None:
            assert userdata.status_code == 404, (address, userdata.text)
        else:
            assert (userdata.status_code, userdata.content) == (200, userdata_of(number))


def check_acknowledged(plans: list[list[Write]]) -> list[Write]:
    writes = [w for writes in plans for w in writes]
    failures = [(w.number, w.status) for w in writes if w.status != 200]
    assert not [f for f in failures if f[1] is None or f[1] >= 500], f"server errors: {failures}"
    assert not failures, f"writes not acknowledged with 200: {failures}"
    return writes


@pytest.mark.anyio
@pytest.mark.stores("sqlite", "postgres")
async def test_overlapping_writes_serialise_in_commit_order(db_url: str) -> None:
    """240 concurrent upserts over 30 shared addresses leave store, catalog and reads equal to a serial replay.

    See the module docstring for why this fails on a lost update or a doubly held address.
    """
    plans = plan(seed=20240501, instances=INSTANCES, writes_each=6)
    async with running_app(make_settings(db=db_url), store=open_store(db_url)) as app:
        async with admin_client(app) as client:
            elapsed = await run_writes([client], plans)
        writes = check_acknowledged(plans)
        assert len(writes) >= 200
        assert elapsed < RUN_BUDGET_SECONDS
        store = app.services.store
        order = commit_order(await whole_feed(store), plans)
        assert len(order) == len(writes)
        check_real_time(order)
        model = replay(order)
        # the writes really contended: addresses changed hands and were dropped
        assert sum(len(w.moved) for w in writes) >= 50
        assert sum(len(w.dropped) for w in writes) >= 1
        await check_store(store, model)
        # each write refreshed this replica's catalog before answering: no catch-up needed
        check_catalog(app, model)
        await check_instance_reads(app, model)


@pytest.mark.anyio
@pytest.mark.stores("sqlite", "postgres")  # one database two replicas share
async def test_two_replicas_sharing_a_database_converge(db_url: str) -> None:
    """Two replicas writing concurrently to one database serialise, and both catalogs converge on the store."""
    plans = plan(seed=7, instances=INSTANCES, writes_each=5)
    settings = make_settings(db=db_url)
    async with AsyncExitStack() as stack:
        apps = [await stack.enter_async_context(running_app(settings, store=open_store(db_url))) for _ in range(2)]
        clients = [await stack.enter_async_context(admin_client(app)) for app in apps]
        assert apps[0].services.store is not apps[1].services.store
        elapsed = await run_writes(clients, plans)
        writes = check_acknowledged(plans)
        assert len(writes) >= 200
        assert elapsed < RUN_BUDGET_SECONDS
        order = commit_order(await whole_feed(apps[0].services.store), plans)
        check_real_time(order)
        model = replay(order)
        # Both replicas had writes in flight at the same time (so they really competed for
        # the database). Their commits need not interleave: SQLite's write lock is no queue
        # (a waiting connection sleeps and retries in its busy handler), so one replica may
        # commit its whole run before the other gets in; PostgreSQL queues lock waiters.
        replica_of = {writes[0].instance_id: i % 2 for i, writes in enumerate(plans)}
        sent = {r: [(w.started, w.acked or 0) for w in order if replica_of[w.instance_id] == r] for r in (0, 1)}
        overlapping = [(a, b) for a in sent[0] for b in sent[1] if a[0] < b[1] and b[0] < a[1]]
        assert len(overlapping) >= len(order) // 4, "the replicas' writes hardly overlapped in time"
        if db_url.startswith("postgresql"):
            positions = defaultdict(list)
            for index, w in enumerate(order):
                positions[replica_of[w.instance_id]].append(index)
            assert min(positions[1]) < max(positions[0])
            assert min(positions[0]) < max(positions[1])
        for app in apps:
            await check_store(app.services.store, model)
            await app.services.catalog.catch_up()
            assert app.services.catalog.position == (await whole_feed(app.services.store))[-1].seq
            check_catalog(app, model)
            await check_instance_reads(app, model)
        views = [
            {a: e.instance.id for e in app.services.catalog._entries.values() for a in map(str, e.instance.addresses)}
            for app in apps
        ]
        assert views[0] == views[1]
        assert len(views[0]) == len(model.holders)


def test_feed_parser_rejects_an_interleaved_block() -> None:
    """The commit-order parser fails when a write's block is split by another write (so the check has teeth)."""
    a, b, c = new_id(), new_id(), new_id()
    wa = Write(1, "metadata", a, ("10.0.0.1",), moved={"10.0.0.1": c})
    wb = Write(2, "metadata", b, ())
    plans = [[wa], [wb]]
    good = [Change(1, a), Change(2, c), Change(3, b)]
    assert [w.number for w in commit_order(good, plans)] == [1, 2]
    with pytest.raises(AssertionError):
        commit_order([Change(1, a), Change(2, b), Change(3, c)], plans)
    with pytest.raises(AssertionError):
        commit_order([Change(1, a), Change(2, c)], plans)  # b's acknowledged write never reached the feed


def test_replay_rejects_a_lost_update() -> None:
    """The replay fails when two writes both claim to have taken a free address (a lost update)."""
    a, b = new_id(), new_id()
    first = Write(1, "metadata", a, ("10.0.0.1",))
    second = Write(2, "userdata", b, ("10.0.0.1",))  # should have reported moved {10.0.0.1: a}
    with pytest.raises(AssertionError):
        replay([first, second])
    second.moved = {"10.0.0.1": a}
    assert replay([first, second]).holders == {"10.0.0.1": b}
