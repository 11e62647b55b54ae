"""Lifecycle notices in every Store (memory://, SQLite, PostgreSQL), and two catalogs following them.

The store keeps one row per notice and one per guest acknowledgement (the first one counts);
the change feed names a notice write ``notice:<id>``; a catalog applies its own writes from
the journal and another catalog's from the feed, resetting exactly the entries the notice
reaches (the instance itself, its project's or its facility's members).
"""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime, timedelta

import pytest

from factories import new_id
from helpers import FakeClock
from imds.metrics import Metrics
from imds.models import (
    ACTIVE,
    FACILITY_SCOPE,
    INSTANCE_SCOPE,
    PROJECT_SCOPE,
    MetadataWrite,
    Notice,
    NoticeDraft,
    NoticeKey,
)
from imds.services.catalog.catalog import Catalog
from imds.services.notices.records import NoticeRecords
from imds.services.records.upsert import Records
from imds.services.render.events import gce_items
from imds.store import Store

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)


class Boom(Exception):
    pass


def notice(notice_id: str = "0d59937288b749b32", **fields: object) -> Notice:
    values: dict[str, object] = {"scope": PROJECT_SCOPE, "target": "acme", "kind": "maintenance", "time": T0,
                                 "window_end": T0 + timedelta(hours=2), "description": "kernel",
                                 "created_at": T0 - timedelta(days=1), "updated_at": T0 - timedelta(days=1)}
    values.update(fields)
    return Notice(id=notice_id, **values)  # type: ignore[arg-type]


async def test_put_read_replace_remove(store: Store):
    """put_notice stores exactly what it is given (times in UTC); notices() reads some or all; remove says if it did."""
    first = notice()
    other = notice("1a2b3c4d5e6f70819", scope=INSTANCE_SCOPE, target=new_id(), kind="stop", window_end=None,
                   description="", state=ACTIVE)
    async with store.write() as tx:
        await tx.put_notice(first)
        await tx.put_notice(other)
        assert await tx.notice_of(first.id) == first
    changed = notice(state="canceled", revision=2, updated_at=T0)
    async with store.write() as tx:
        await tx.put_notice(changed)
    found = await store.notices([first.id, "ffffffffffffffff0"])
    assert found == {first.id: changed}
    assert found[first.id].time.tzinfo is not None
    assert set(await store.notices()) == {first.id, other.id}
    assert (await store.notices())[other.id] == other
    async with store.write() as tx:
        assert await tx.remove_notice(first.id) is True
        assert await tx.remove_notice(first.id) is False
        assert await tx.notice_of(first.id) is None
    assert set(await store.notices()) == {other.id}


async def test_acknowledgements_keep_the_first_and_go_with_the_notice(store: Store):
    """The first acknowledgement of each instance is kept; a delete removes them with the notice."""
    stored = notice()
    guest, neighbour = new_id(), new_id()
    async with store.write() as tx:
        await tx.put_notice(stored)
        first = await tx.acknowledge(stored.id, guest, T0)
    async with store.write() as tx:
        again = await tx.acknowledge(stored.id, guest, T0 + timedelta(minutes=5))
        await tx.acknowledge(stored.id, neighbour, T0 + timedelta(minutes=1))
    assert first.at == again.at == T0
    acks = await store.acknowledgements([stored.id])
    assert [(a.instance_id, a.at) for a in acks] == [(guest, T0), (neighbour, T0 + timedelta(minutes=1))]
    async with store.write() as tx:
        await tx.remove_notice(stored.id)
    assert await store.acknowledgements([stored.id]) == []


async def test_a_block_that_raises_leaves_no_notice_behind(store: Store):
    """All or nothing, as every write block."""

    async def write_then_fail() -> None:
        async with store.write() as tx:
            await tx.put_notice(notice())
            await tx.mark_changed([NoticeKey(notice().id)])
            raise Boom

    with pytest.raises(Boom):
        await write_then_fail()
    assert await store.notices() == {}
    assert await store.changes_since(0) == []


async def _instances(store: Store, records: Records) -> dict[str, str]:
    ids = {name: new_id() for name in ("guest", "neighbour", "elsewhere")}
    placed = {"guest": ("acme", "da11"), "neighbour": ("acme", "ny5"), "elsewhere": ("other", "da11")}
    for n, (name, (project, facility)) in enumerate(placed.items()):
        document = {"id": ids[name], "project_id": project, "facility": facility}
        address = ipaddress.ip_network(f"10.9.0.{n + 1}/32")
        await records.put_metadata(MetadataWrite(ids[name], (address,), document), subject="t")
    return ids


async def test_two_catalogs_follow_notices_and_reset_whom_they_reach(store: Store):
    """The writer's catalog applies its journal, the other catches up from the feed; only reached ETags change."""
    clock = FakeClock((T0 - timedelta(hours=1)).timestamp())
    writer, follower = Catalog(store, clock=clock), Catalog(store, clock=clock)
    await writer.load()
    await follower.load()
    ids = await _instances(store, Records(store, writer, Metrics()))
    await follower.catch_up()
    etags = {c: {name: c.get(i).etag for name, i in ids.items()} for c in (writer, follower)}  # type: ignore[union-attr]
    notices = NoticeRecords(store, writer, clock=clock)
    project = await notices.create(
        NoticeDraft(PROJECT_SCOPE, "acme", "migrate", T0, window_end=T0 + timedelta(hours=1)), subject="t")
    await follower.catch_up()
    for catalog in (writer, follower):
        assert catalog.notice(project.id) == project
        for name in ("guest", "neighbour"):
            assert catalog.get(ids[name]).etag != etags[catalog][name]  # type: ignore[union-attr]
        assert catalog.get(ids["elsewhere"]).etag == etags[catalog]["elsewhere"]  # type: ignore[union-attr]
    assert writer.get(ids["guest"]).etag == follower.get(ids["guest"]).etag  # type: ignore[union-attr]
    facility = await notices.create(NoticeDraft(FACILITY_SCOPE, "da11", "rebalance", T0), subject="t")
    mine = await notices.create(NoticeDraft(INSTANCE_SCOPE, ids["neighbour"], "stop", T0), subject="t")
    await follower.catch_up()
    for catalog in (writer, follower):
        def seen(name: str, catalog: Catalog = catalog) -> set[str]:
            entry = catalog.get(ids[name])
            assert entry is not None
            return {s.notice.id for s in entry.context().notices}

        assert seen("guest") == {project.id, facility.id}
        assert seen("neighbour") == {project.id, mine.id}
        assert seen("elsewhere") == {facility.id}
    await notices.delete(project.id, subject="t")
    await follower.catch_up()
    assert follower.notice(project.id) is None
    reloaded = Catalog(store, clock=clock)
    await reloaded.load()
    assert {reloaded.notice(mine.id), reloaded.notice(facility.id)} == {mine, facility}


async def test_the_clock_opens_a_window_and_wakes_whom_it_reaches(store: Store):
    """No write: once the clock passes ``time``, expire_notices resets the entry and its watch wakes."""
    clock = FakeClock((T0 - timedelta(minutes=1)).timestamp())
    catalog = Catalog(store, clock=clock)
    await catalog.load()
    ids = await _instances(store, Records(store, catalog, Metrics()))
    await NoticeRecords(store, catalog, clock=clock).create(
        NoticeDraft(PROJECT_SCOPE, "acme", "maintenance", T0, window_end=T0 + timedelta(hours=1)), subject="t")
    entry = catalog.get(ids["guest"])
    assert entry is not None
    before = entry.etag
    assert gce_items(entry.context())["maintenance-event"] == "NONE"
    waiter = __import__("asyncio").get_running_loop().create_future()
    entry.watch(waiter)
    assert catalog.expire_notices() >= 0
    assert not waiter.done()  # nothing is due yet
    clock.advance(61)
    catalog.expire_notices()
    assert waiter.done()
    assert entry.etag != before
    assert gce_items(entry.context())["maintenance-event"] == "TERMINATE_ON_HOST_MAINTENANCE"
