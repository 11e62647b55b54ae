"""The in-memory view of every instance that the instance-facing path reads.

Loaded from a store snapshot at startup and kept coherent two ways: a write on this
replica applies what it wrote (the store's journal) before it answers, and a follower
watches the store's change feed for writes made by other replicas (woken by PostgreSQL
``NOTIFY``, or polling). A read never touches the store.

``position`` is the feed sequence up to which every change is applied. A write's journal
is replayed only when it starts exactly at ``position`` (then the catalog equals the store
at its end without a read); otherwise the catalog catches up from the feed instead.
Updates run one at a time and read the store inside that critical section, so a later
update never applies older state than an earlier one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import gc
import time
from collections.abc import Callable, Iterable, Iterator
from typing import cast

from imds import log
from imds.errors import StoreUnavailable
from imds.models import (
    RECORD_KINDS,
    Address,
    Instance,
    Network,
    Notice,
    OsRecord,
    ProjectAttributes,
)
from imds.services.catalog.addresses import AddressIndex, unpack_network
from imds.services.catalog.ahead import RenderAhead
from imds.services.catalog.entry import Entry, RenderCache
from imds.store.interface import Store, StoredInstance, stored_form
from imds.store.journal import ADDRESSES, FORGET, NOTICE, PROJECT, PUT, Journal, Op

__all__ = ["Catalog", "Entry"]
_log = log.get("catalog")
LOAD_CHUNK = 5000
FEED_BATCH = 1000  # change-feed entries read per statement while catching up
CLOCK_TICK = 60.0  # seconds: the longest the notice clock sleeps before looking at the clock again (a clock step)
_SIDE_RECORDS = (PROJECT, NOTICE)  # journal fields that are records beside the instances


class Catalog:
    """Instances by id and by address (longest-prefix match)."""

    def __init__(
        self, store: Store, *, poll_interval: float = 1.0, render_cache_bytes: int = 256 << 20,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._cache = RenderCache(render_cache_bytes, clock)
        self._cache.notices.on_instance = self._reset_instance
        self.ahead = RenderAhead(self._cache)  # first renderings built before the first read (``run_ahead``)
        self._cache.reprojected = self.ahead.placed  # and built again when a project or a notice drops them
        self._poll_interval = poll_interval
        self._entries: dict[str, Entry] = {}
        self._index = AddressIndex()
        self._lock = asyncio.Lock()
        self.position = 0
        # Moves whenever an address may lead to another entry (an entry placed, replaced or dropped):
        # what a cache of lookups (imds.web.memo) checks to stay coherent.
        self.version = 0
        self.loaded = False
        # Loading progress for /readyz and the log: phase ("waiting", "reading", "indexing", "loaded").
        self.phase = "waiting"
        self.indexed = 0
        self.total = 0
        # Called with (instance id, generation) when an OS record leaves the catalog (its instance
        # or record was deleted, or a newer write replaced it), locally or through the change feed:
        # the secret vault forgets what it held for that generation (services/ganeti/memory.py).
        self.on_os_gone: Callable[[str, str], None] | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, address: Address) -> Entry | None:
        """The instance whose longest matching prefix contains ``address``."""
        instance_id = self._index.lookup(address)
        return None if instance_id is None else self._entries.get(instance_id)

    def containing(self, address: Address) -> list[tuple[Network, str]]:
        """Every held entry (network, instance id) containing ``address``, longest prefix first."""
        return self._index.containing(address)

    def holdings(self) -> Iterator[tuple[str, tuple[Network, ...]]]:
        """(instance id, its addresses) for every instance held."""
        for instance_id, entry in self._entries.items():
            yield instance_id, entry.addresses

    def os_records(self) -> Iterator[tuple[str, OsRecord]]:
        """(instance id, its Ganeti OS record) for every instance that has one (without materialising it)."""
        for instance_id, entry in self._entries.items():
            record = entry.os
            if record is not None:
                yield instance_id, record

    def get(self, instance_id: str) -> Entry | None:
        """The instance with this id, if the catalog holds it."""
        return self._entries.get(instance_id)

    def project(self, project_id: str) -> ProjectAttributes | None:
        """The attributes record of ``project_id`` this replica serves, if it has one."""
        return self._cache.projects.get(project_id)

    def notice(self, notice_id: str) -> Notice | None:
        """The notice this replica serves with this id, if it holds one."""
        return self._cache.notices.get(notice_id)

    def expire_notices(self) -> int:
        """Reset the entries whose notices changed on their own by now (the clock's); how many moments passed.

        ``follow_clock`` calls it at each such moment; a test with an injected clock may call it directly.
        """
        return self._cache.notices.expire(self._cache.now())

    async def follow_clock(self) -> None:
        """Wake what notices reach when they change on their own (a window opens or closes), until cancelled.

        Sleeps until the next such moment (at most ``CLOCK_TICK``), or until a notice is written.
        """
        board = self._cache.notices
        loop = asyncio.get_running_loop()
        while True:
            self.expire_notices()
            upcoming = board.next_moment()
            delay = CLOCK_TICK
            if upcoming is not None:
                delay = min(max(upcoming.timestamp() - self._cache.clock(), 0.0), CLOCK_TICK)
            wake: asyncio.Future[None] = loop.create_future()
            timer = loop.call_later(delay, _settle, wake)
            board.on_change = functools.partial(_settle, wake)
            try:
                await wake
            finally:
                timer.cancel()
                board.on_change = None

    async def run_ahead(self) -> None:
        """Build placed instances' first renderings while the server is quiet, until cancelled (``RenderAhead``)."""
        await self.ahead.run(self._entries.get)

    def _reset_instance(self, instance_id: str) -> None:
        entry = self._entries.get(instance_id)
        if entry is not None:
            entry.reproject()

    async def load(self) -> None:
        """Replace everything with a fresh snapshot of the store.

        Indexing yields to the event loop every ``LOAD_CHUNK`` instances (and logs its
        progress), so a listener that is already accepting keeps answering meanwhile.
        """
        async with self._lock:
            self.phase = "reading"
            _log.info("catalog.loading", phase=self.phase)
            previous = self._entries
            for old in previous.values():
                old.wake()
            self._cache.clear()
            self.ahead.clear()
            self.total, self.indexed = 0, 0  # still "reading" until the store's first chunk arrives
            self._entries = {}
            self._index = AddressIndex()
            self.version += 1
            position = 0
            async for chunk, seq, total in self._store.snapshot_chunks(LOAD_CHUNK):
                position, self.total, self.phase = seq, total, "indexing"
                for stored in chunk:
                    for key, holder in self._place(stored):  # a consistent store holds each network once
                        _log.warning("catalog.address_shared", address=str(unpack_network(key)), kept_by=stored.id,
                                     also_held_by=holder)
                # Loaded entries live until replaced: keep the cyclic GC from re-scanning them on every
                # collection the load triggers (a third of a million-instance load). Refcounting still frees them.
                gc.freeze()
                self.indexed += len(chunk)
                if self.indexed < self.total:
                    _log.info("catalog.loading", phase=self.phase, indexed=self.indexed, total=self.total)
                    await asyncio.sleep(0)
            for instance_id, old in previous.items():
                new = self._entries.get(instance_id)
                self._os_left(instance_id, old.os, None if new is None else new.os)
            # Read after the instances: a project written in between is newer than ``position``,
            # and its feed entry re-reads the same record (no older state is ever applied).
            self._cache.projects.replace((await self._store.projects()).values())
            self._cache.notices.replace((await self._store.notices()).values())
            self.position = position
            self.loaded = True
            self.phase = "loaded"
        _log.info("catalog.loaded", instances=self.indexed, position=position)

    def progress(self) -> dict[str, object]:
        """Where loading stands: phase, instances indexed and the total (known once read)."""
        return {"phase": self.phase, "indexed": self.indexed, "total": self.total}

    async def refresh(self, instance_ids: Iterable[str]) -> None:
        """Re-read these instances from the store and apply what it holds now."""
        ids = list(dict.fromkeys(instance_ids))
        async with self._lock:
            found = await self._store.get_many(ids)
            for instance_id in ids:
                self._apply(instance_id, found.get(instance_id))

    async def written(self, journal: Journal) -> None:
        """Apply a committed write of this process (before its caller answers).

        The groups committed before it whose callers have not resumed yet are replayed
        first (the journal chain, ``imds.store.journal.Group``), then its own, in commit
        order, as far as they follow on from ``position``; if this one does not (another
        process wrote in between), the catalog catches up from the feed.
        """
        async with self._lock:
            for group in journal.pending():
                for member in group.members:
                    if member.applied:
                        continue
                    if member.start == self.position:
                        self._replay(member.ops)
                        self.position = member.end
                        member.applied = True
                    elif member.end <= self.position:
                        member.applied = True  # the catalog caught up past it from the feed
        if not journal.applied:
            await self.catch_up()
            journal.applied = True

    async def catch_up(self) -> int:
        """Apply change-feed entries committed before this call; returns how many.

        It reads the feed in batches and stops at the first batch that is not full: what
        was committed after the call started is the next call's. Reading until the feed
        comes up empty instead kept a follower of a process writing without pause chasing
        that process's newest group (committed, not yet applied by ``written``) for as
        long as the writes went on, re-reading every write from the store and holding
        the lock ``written`` waits for (seen: 1.8 s of a second's 16-writer upserts).
        """
        applied = 0
        while True:
            async with self._lock:
                batch = await self._store.changes_since(self.position, FEED_BATCH)
                if batch:
                    projects = list(dict.fromkeys(p.id for change in batch if (p := change.project)))
                    notices = list(dict.fromkeys(n.id for change in batch if (n := change.notice)))
                    ids = list(dict.fromkeys(change.instance_id for change in batch
                                             if change.project is None and change.notice is None))
                    found = await self._store.get_many(ids)
                    for instance_id in ids:
                        self._apply(instance_id, found.get(instance_id))
                    if projects:
                        records = await self._store.projects(projects)
                        for project_id in projects:
                            self._cache.projects.apply(project_id, records.get(project_id))
                    if notices:
                        held = await self._store.notices(notices)
                        for notice_id in notices:
                            self._cache.notices.apply(notice_id, held.get(notice_id))
                    self.position = max(self.position, batch[-1].seq)
            applied += len(batch)
            if len(batch) < FEED_BATCH:
                return applied

    async def follow(self) -> None:
        """Follow the change feed until cancelled; a store outage only delays coherence.

        Wakes when the store says the feed may have moved (NOTIFY, a local commit) or
        after the poll interval, whichever comes first.
        """
        while True:
            await self._store.changed(self._poll_interval)
            # Cancelled (at shutdown) while catching up, the read still finishes first: a
            # database call cut off midway leaves its connection to be reclaimed after the
            # event loop may be gone. The wait is bounded by the statement timeout.
            catching_up = asyncio.ensure_future(self._catch_up_quietly())
            try:
                await asyncio.shield(catching_up)
            except asyncio.CancelledError:
                await asyncio.wait([catching_up])
                raise

    async def _catch_up_quietly(self) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self.catch_up()

    def _os_left(self, instance_id: str, old: OsRecord | None, new: OsRecord | None) -> None:
        gone = None if old is None else old.generation
        if gone is not None and self.on_os_gone is not None and (new is None or new.generation != gone):
            self.on_os_gone(instance_id, gone)

    def _instance_ops(self, ops: list[Op]) -> list[Op]:
        """Apply the journal's project and notice operations; the others, for ``_replay``."""
        for op in ops:
            if op.field == PROJECT:
                project = cast("ProjectAttributes", op.value) if op.kind == PUT else None
                self._cache.projects.apply(op.record_id, project)
            elif op.field == NOTICE:
                self._cache.notices.apply(op.record_id, cast("Notice", op.value) if op.kind == PUT else None)
        return [op for op in ops if op.field not in _SIDE_RECORDS]

    def _replay(self, ops: list[Op]) -> None:
        """Carry out a journal's operations on the held instances (no store read)."""
        work: dict[str, Instance | None] = {}

        def current(instance_id: str) -> Instance | None:
            if instance_id in work:
                return work[instance_id]
            entry = self._entries.get(instance_id)
            return None if entry is None else entry.instance

        for op in self._instance_ops(ops):
            if op.kind == FORGET:
                work[op.instance_id] = None
                continue
            instance = current(op.instance_id) or Instance(op.instance_id)
            if op.kind == ADDRESSES:
                for address, loser in (op.moved or {}).items():
                    held = current(loser)
                    if held is not None:
                        kept = tuple(a for a in held.addresses if a != address)
                        work[loser] = dataclasses.replace(held, addresses=kept)
                addresses = cast("tuple[Network, ...]", op.value)
                instance = dataclasses.replace(instance, addresses=tuple(sorted(set(addresses), key=str)))
            else:
                value = op.value if op.kind == PUT else None
                changes: dict[str, object] = {op.field: value}
                if op.field in RECORD_KINDS:
                    changes[f"{op.field}_updated_at"] = op.at if op.kind == PUT else None
                instance = dataclasses.replace(instance, **changes)  # type: ignore[arg-type]
            work[op.instance_id] = instance
        for instance_id, final in work.items():
            self._apply(instance_id, final)

    def _apply(self, instance_id: str, instance: Instance | None) -> None:
        old = self._entries.get(instance_id)
        if old is not None:
            self._os_left(instance_id, old.os, None if instance is None else instance.os)
            old.wake()
            self._cache.drop(old)
            self._cache.members.leave(old, old.joined)
        if instance is None:
            self._entries.pop(instance_id, None)
            self._index.forget(instance_id)
            self.version += 1
            return
        self._place(stored_form(instance))

    def _place(self, stored: StoredInstance) -> list[tuple[int, str]]:
        entry = self._entries[stored.id] = Entry(stored, self._cache)
        self.version += 1
        self.ahead.placed(stored.id)
        return self._index.assign_packed(stored.id, entry.packed)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
