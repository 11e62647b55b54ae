"""An instance's first renderings built ahead of its first read, while the server has nothing else to do.

A boot storm is a fleet reading for the first time: every instance's first read renders its
tree, computes its ETag and queues its identity signatures, and a few hundred instances
starting together put all of that in front of every request in flight (a 10k-crawl storm:
request p99 ~200 ms cold, ~70 ms with everything already built). But an instance's record
is written before it boots, seconds to minutes before its first read. So the catalog notes
each instance it places (loaded at startup, written here, or followed from the change
feed) and each whose renderings a project's or a notice's change dropped
(``RenderCache.reprojected``), and ``RenderAhead`` builds what its first read would (the ``Builder`` s the flavors
register) in short slices while no request is being answered:

- **Reads first.** A slice starts only after ``QUIET`` seconds in which the server answered
  nothing (``activity``: a count of answers); while requests come in it waits ``RESTING``
  between looks. A slice lasts at most ``SLICE`` seconds, then the loop runs again.
- **Never at a reader's expense.** It builds only while the render cache holds less than
  ``SHARE`` of ``--render-cache-bytes``: it never evicts what guests are reading to make
  room for a guess. Past that, what is left is built by its first read, as without it.
- **Newest first.** A write or a reload moves the instance to the front; a deleted or
  replaced entry is skipped (the catalog's current entry is the one built). At most
  ``MAX_PENDING`` are noted (far more than the cache holds built): past that the older
  ones are forgotten, so a million-instance load keeps a few megabytes of notes, not forty.
- **At the builders' pace.** A builder whose own queue is full (the EC2 flavor's signing
  thread, ``imds.services.identity.ahead``) is not ``ready``: the slice waits for it. A
  builder that still waits on work of its own for an entry (the answers made ahead,
  ``imds.web.answers``, wait for its signatures) says so (``build`` returns False): the
  entry is built again once nothing newer is pending, every builder running again (each
  skips what it already holds).

What is built is exactly what a read would build (the same ``Entry.render`` keys), so a
read finds it or builds it; nothing a guest sees changes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from imds import log

if TYPE_CHECKING:
    from imds.services.catalog.entry import Entry, RenderCache

_log = log.get("catalog")
QUIET = 0.01  # seconds without an answer before a slice starts
RESTING = 0.05  # seconds between looks while requests are being answered (or a builder is not ready)
SLICE = 0.002  # seconds of building at most before the loop runs again
SHARE = 0.5  # of the render cache's bound: built ahead only while the cache holds less (the other half is the reads')
MAX_PENDING = 1 << 16  # instances noted at most (~5 MB); a million loaded keep only the last of them noted


class Builder(Protocol):
    """What a flavor builds ahead for an entry (``build``), when it can take more (``ready``)."""

    def ready(self) -> bool:
        """Whether ``build`` may run now (its own queue has room)."""
        ...

    def build(self, entry: Entry) -> bool:
        """Build, into ``entry``'s render cache, what the flavor's first read of it would; False: again later."""
        ...


class RenderAhead:
    """The instances placed and not yet built, and the task that builds them (see the module docstring)."""

    def __init__(self, cache: RenderCache, clock: Callable[[], float] = time.perf_counter) -> None:
        self._cache = cache
        self._clock = clock
        self._pending: dict[str, None] = {}  # instance ids, oldest first (built newest first)
        self._again: dict[str, None] = {}  # ids a builder has more for (``Builder.build``: False), oldest first
        self._woken = asyncio.Event()
        self.builders: list[Builder] = []
        self.activity: Callable[[], int] = _never  # a count of answers so far (the web layer sets it)
        self.enabled = True
        self.built = 0  # entries built ahead so far

    @property
    def pending(self) -> int:
        """Instances waiting to be built ahead (or built again: a builder waited on work of its own)."""
        return len(self._pending) + len(self._again)

    def placed(self, instance_id: str) -> None:
        """The catalog placed a version of ``instance_id`` (or a new context dropped its renderings): build it ahead.

        Before the older ones still waiting.
        """
        if self.enabled:
            pending = self._pending
            self._again.pop(instance_id, None)  # built from the start again
            if pending.pop(instance_id, True) and len(pending) >= MAX_PENDING:
                pending.clear()  # more than the cache could hold built: start over from the newest
            pending[instance_id] = None
            self._woken.set()

    def clear(self) -> None:
        """Forget every instance waiting (a reload places them all again)."""
        self._pending.clear()
        self._again.clear()

    def room(self) -> bool:
        """Whether the render cache holds less than its ``SHARE`` (building ahead never evicts a read)."""
        return self._cache.bytes < self._cache.max_bytes * SHARE

    def step(self, entry_of: Callable[[str], Entry | None], deadline: float) -> int:
        """Build pending entries until ``deadline`` (the clock's) or a builder is not ready; how many were built.

        Entries to build again go once the newly placed are done, each at most once per call.
        With no room left in the cache, everything pending is dropped: its first reads build it.
        """
        built = 0
        pending, again = self._pending, self._again
        retries = len(again) if not pending else 0
        while (pending or retries) and self._clock() < deadline \
                and all(builder.ready() for builder in self.builders):
            if not self.room():
                _log.info("catalog.ahead_full", dropped=self.pending, built=self.built,
                          cache_bytes=self._cache.bytes)
                self.clear()
                break
            if pending:
                instance_id, _ = pending.popitem()
            else:
                instance_id = next(iter(again))
                del again[instance_id]
                retries -= 1
            entry = entry_of(instance_id)
            if entry is None:
                continue
            try:
                _ = entry.etag  # every flavor's read sends it
                done = [builder.build(entry) for builder in self.builders]
            except Exception:  # noqa: BLE001 - a rendering bug shows at the read too; building ahead goes on
                _log.exception("catalog.ahead_failed", instance=instance_id)
                continue
            if all(done):
                built += 1
            else:
                again[instance_id] = None
        self.built += built
        return built

    async def run(self, entry_of: Callable[[str], Entry | None]) -> None:
        """Build pending entries in slices while the server is quiet, until cancelled."""
        while True:
            if not self.pending or not self.builders:
                self._woken.clear()
                await self._woken.wait()
                continue
            seen = self.activity()
            await asyncio.sleep(QUIET)
            if self.activity() != seen or not all(builder.ready() for builder in self.builders):
                await asyncio.sleep(RESTING)
                continue
            while self.pending and self.activity() == seen:
                if not self.step(entry_of, self._clock() + SLICE):
                    break  # a builder is not ready, or nothing left to build: look again later
                await asyncio.sleep(0)


def _never() -> int:
    return 0
