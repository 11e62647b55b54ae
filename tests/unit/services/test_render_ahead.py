"""RenderAhead: placed instances' first renderings built newest first, in slices, only while quiet and with room."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest
from structlog.testing import capture_logs

from helpers import wait_for_async
from imds.services.catalog import ahead as ahead_module
from imds.services.catalog.ahead import SHARE
from imds.services.catalog.catalog import Catalog, Entry
from imds.store.memory import MemoryStore

pytestmark = pytest.mark.anyio


class Recorder:
    """A builder that renders a small value into each entry and records the order; ``room`` caps its readiness."""

    def __init__(self, room: int = 1_000_000, size: int = 100) -> None:
        self.built: list[str] = []
        self.room = room
        self.size = size

    def ready(self) -> bool:
        return len(self.built) < self.room

    def build(self, entry: Entry) -> bool:
        entry.render("test", lambda _instance: "x" * self.size)
        self.built.append(entry.id)
        return True


class Waiting:
    """A builder that says "again later" for the ids in ``waits`` until they are taken out; records each call."""

    def __init__(self, waits: set[str]) -> None:
        self.waits = waits
        self.calls: list[str] = []

    def ready(self) -> bool:
        return True

    def build(self, entry: Entry) -> bool:
        self.calls.append(entry.id)
        return entry.id not in self.waits


class Ticks:
    """A clock that moves one unit per reading."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def ident(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


async def loaded(count: int, cache_bytes: int = 256 << 20) -> Catalog:
    store = MemoryStore()
    async with store.write() as tx:
        for n in range(count):
            await tx.put_records([(ident(n), {"id": ident(n), "hostname": f"h{n}"})], [])
            await tx.replace_addresses_many([(ident(n), [ipaddress.ip_network(f"10.0.0.{n}")])])
    catalog = Catalog(store, render_cache_bytes=cache_bytes)
    await catalog.load()
    return catalog


async def test_loaded_instances_are_built_newest_first_with_their_etag_and_a_deleted_one_skipped():
    """Every loaded instance is pending; a step builds them last placed first, ETag included; a gone one is skipped."""
    catalog = await loaded(5)
    ahead, recorder = catalog.ahead, Recorder()
    ahead.builders.append(recorder)
    assert ahead.pending == 5
    catalog._apply(ident(1), None)  # deleted after it was noted
    assert ahead.step(catalog.get, deadline=float("inf")) == 4
    assert recorder.built == [ident(4), ident(3), ident(2), ident(0)]
    assert ahead.pending == 0
    assert ahead.built == 4
    for n in (0, 2, 3, 4):
        entry = catalog.get(ident(n))
        assert entry is not None
        assert entry.rendered["test"] == "x" * 100
        assert entry._etag is not None


async def test_an_entry_a_builder_waits_on_is_built_again_after_the_newer_ones():
    """``build`` False: pending until every builder is done with it, retried once per step after the new ones."""
    catalog = await loaded(3)
    ahead, recorder, waiting = catalog.ahead, Recorder(), Waiting({ident(2)})
    ahead.builders.extend([recorder, waiting])
    assert ahead.step(catalog.get, deadline=float("inf")) == 2  # ident(2) waits: not counted built
    assert waiting.calls == [ident(2), ident(1), ident(0)]
    assert ahead.pending == 1
    assert ahead.step(catalog.get, deadline=float("inf")) == 0  # still waiting: tried once, not spun on
    assert waiting.calls[3:] == [ident(2)]
    assert ahead.pending == 1
    waiting.waits.clear()  # what it waited on is done
    assert ahead.step(catalog.get, deadline=float("inf")) == 1
    assert (ahead.pending, ahead.built) == (0, 3)
    assert recorder.built == [ident(2), ident(1), ident(0), ident(2), ident(2)]  # every builder runs again
    ahead.clear()
    assert ahead.pending == 0


async def test_a_new_placement_goes_before_an_entry_built_again():
    """An instance placed while another waits is built first; one placed again while waiting is not queued twice."""
    catalog = await loaded(3)
    ahead, waiting = catalog.ahead, Waiting({ident(2), ident(1)})
    ahead.builders.append(waiting)
    ahead.step(catalog.get, deadline=float("inf"))
    assert ahead.pending == 2
    waiting.waits.clear()
    ahead.placed(ident(0))  # rewritten: new work comes first
    ahead.placed(ident(1))  # placed again while it waits: built once, from the start
    assert ahead.step(catalog.get, deadline=float("inf")) == 2
    assert waiting.calls[3:] == [ident(1), ident(0)]  # the new placements only: no retry while new ones wait
    assert ahead.step(catalog.get, deadline=float("inf")) == 1
    assert waiting.calls[5:] == [ident(2)]
    assert ahead.pending == 0


async def test_a_rewritten_instance_moves_to_the_front():
    """An instance placed again (a new version) is built before the ones waiting since the load."""
    catalog = await loaded(3)
    ahead, recorder = catalog.ahead, Recorder()
    ahead.builders.append(recorder)
    entry = catalog.get(ident(0))
    assert entry is not None
    catalog._apply(ident(0), entry.instance)
    ahead.step(catalog.get, deadline=float("inf"))
    assert recorder.built == [ident(0), ident(2), ident(1)]


async def test_a_step_ends_at_its_deadline_and_when_a_builder_is_not_ready():
    """The injected clock's deadline bounds a slice; a builder that is not ready stops it with work left."""
    catalog = await loaded(6)
    ahead, recorder = catalog.ahead, Recorder(room=4)
    ahead.builders.append(recorder)
    ticks = Ticks()
    ahead._clock = ticks
    assert ahead.step(catalog.get, deadline=ticks.now + 2.5) == 2  # two looks before the deadline
    assert ahead.step(catalog.get, deadline=float("inf")) == 2  # then the builder is full (room 4)
    assert ahead.pending == 2


async def test_building_ahead_stops_at_its_share_of_the_cache_and_drops_the_rest():
    """Past SHARE of --render-cache-bytes nothing more is built ahead (no read is evicted for it): pending dropped."""
    size = 10_000
    catalog = await loaded(20, cache_bytes=100_000)
    ahead, recorder = catalog.ahead, Recorder(size=size)
    ahead.builders.append(recorder)
    with capture_logs() as logs:
        ahead.step(catalog.get, deadline=float("inf"))
    held = catalog._cache.bytes
    assert 0 < len(recorder.built) < 20
    assert held >= 100_000 * SHARE
    assert held - size * 2 < 100_000 * SHARE  # it stopped at the first build past the share
    assert ahead.pending == 0
    assert [e["dropped"] for e in logs if e["event"] == "catalog.ahead_full"] == [20 - len(recorder.built)]
    every = [catalog.get(ident(n)) for n in range(20)]
    assert all(e is not None and "test" in e.rendered for e in every if e is not None and e.id in recorder.built)


async def test_the_task_builds_only_while_nothing_is_answered():
    """``run``: while the activity count moves, nothing is built; once it stays put, everything pending is."""
    catalog = await loaded(30)
    ahead, recorder = catalog.ahead, Recorder()
    ahead.builders.append(recorder)
    answered = 0
    busy = True

    def activity() -> int:
        nonlocal answered
        if busy:
            answered += 1  # a request answered between any two looks
        return answered

    ahead.activity = activity
    task = asyncio.create_task(catalog.run_ahead())
    try:
        looks = answered
        await wait_for_async(lambda: answered > looks + 20, what="the task to look at the activity", timeout=30)
        assert recorder.built == []
        busy = False
        await wait_for_async(lambda: ahead.pending == 0, what="everything built once quiet", timeout=30)
        assert len(recorder.built) == 30
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_failing_builder_is_logged_and_the_others_are_built():
    """A rendering that raises is logged with its instance; building goes on with the next one."""
    catalog = await loaded(3)
    recorder = Recorder()

    class Failing:
        def ready(self) -> bool:
            return True

        def build(self, entry: Entry) -> bool:
            if entry.id == ident(1):
                raise ValueError(entry.id)
            return True

    catalog.ahead.builders += [Failing(), recorder]
    with capture_logs() as logs:
        assert catalog.ahead.step(catalog.get, deadline=float("inf")) == 2
    assert recorder.built == [ident(2), ident(0)]
    assert [e["instance"] for e in logs if e["event"] == "catalog.ahead_failed"] == [ident(1)]


async def test_nothing_is_noted_when_disabled():
    """--no-render-ahead: placements are not noted (no queue of a million ids kept for nothing)."""
    store = MemoryStore()
    async with store.write() as tx:
        await tx.put_records([(ident(0), {"id": ident(0)})], [])
    catalog = Catalog(store)
    catalog.ahead.enabled = False
    await catalog.load()
    assert len(catalog) == 1
    assert catalog.ahead.pending == 0


async def test_past_max_pending_the_older_notes_are_forgotten(monkeypatch: pytest.MonkeyPatch):
    """Past MAX_PENDING placed the notes start over: the newest are kept and the count stays bounded."""
    monkeypatch.setattr(ahead_module, "MAX_PENDING", 4)
    catalog = await loaded(10)
    recorder = Recorder()
    catalog.ahead.builders.append(recorder)
    assert catalog.ahead.pending == 2  # 4 noted, then over: the notes start again with 8 and 9
    entry = catalog.get(ident(9))
    assert entry is not None
    catalog._apply(ident(9), entry.instance)  # noted again: moved, not counted twice
    assert catalog.ahead.pending == 2
    catalog.ahead.step(catalog.get, deadline=float("inf"))
    assert recorder.built == [ident(9), ident(8)]
