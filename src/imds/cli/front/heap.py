"""What survived a full garbage collection is frozen, so the next full one scans only what is newer.

CPython's cyclic GC scans every tracked object in a full (generation 2) collection, which
runs each time the objects that lived long enough grew by a quarter. The catalog freezes
what it loads (``services/catalog``), but a boot storm renders every instance's documents
in the first minutes, and each full collection over those renderings stopped the event
loop for 50-200 ms at 2,000 instances (more at 10,000): every request in flight waited.

So when a full collection has run, the front's next tick (``imds.cli.front``, between two
callbacks of the loop: no request is half-answered) collects the young generations (the
cyclic garbage there goes) and freezes the rest (``gc.freeze``): refcounting still frees
frozen objects, but the cyclic GC no longer looks at them. A frozen object that later
becomes part of unreachable cycle is not collected while frozen, so once an ``UNFREEZE``
interval everything is unfrozen again and the next full collection scans (and collects)
all of it: one long collection an hour instead of one every few seconds of a storm.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

UNFREEZE = 3600.0  # seconds between two unfreezes (the bound on how long frozen cyclic garbage stays)
FULL = 2  # the oldest generation


class Heap:
    """Watches for full collections (a ``gc`` callback) and freezes after them when ``tick`` is called."""

    def __init__(self, clock: Callable[[], float], unfreeze: float = UNFREEZE) -> None:
        self._clock = clock
        self._unfreeze = unfreeze
        self._thawed = clock()
        self.full = False  # a full collection ran since the last tick
        self.frozen = 0  # freezes so far

    def watch(self, phase: str, info: dict[str, Any]) -> None:
        """The ``gc.callbacks`` entry: note a full collection that has ended."""
        if phase == "stop" and info.get("generation") == FULL:
            self.full = True

    def start(self) -> None:
        gc.callbacks.append(self.watch)

    def stop(self) -> None:
        if self.watch in gc.callbacks:
            gc.callbacks.remove(self.watch)

    def tick(self) -> None:
        """Freeze after a full collection; unfreeze once an interval."""
        now = self._clock()
        if now - self._thawed >= self._unfreeze:
            self._thawed = now
            self.full = False
            gc.unfreeze()
            return
        if self.full:
            self.full = False
            gc.collect(1)
            gc.freeze()
            self.frozen += 1
