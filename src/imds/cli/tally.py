"""Open connections per source, counted where they are accepted and shared by forked workers: the warden's gate.

The warden (``imds.cli.warden``) learns each source's connections from a netlink dump of
the TCP table, and the kernel walks every socket of the network namespace to answer it:
under a boot storm (a new connection per request) that is a table of TIME_WAIT sockets,
walked ten times a second for nothing. The front (``imds.cli.front``) accepts every
connection itself, so it counts them per source as they open and close here, and its
warden dumps only when a count has said that some source may be over budget.

- One row of counters per worker, each written by its own worker only (no lock between
  processes); a source's count is the sum of its column over the rows. The memory is an
  anonymous shared mapping made before the workers are forked (``prepare``), each child
  taking its row (``adopt_row``); one process alone has one row.
- A source's column is ``hash`` of its address modulo ``COLUMNS`` (forked workers share
  the interpreter's hash seed). Two sources in one column only make the sum larger: a
  false alarm costs one dump, never a missed excess.
- The alarm is the monotonic time (ns, the clock every process shares) at which a count
  last went over the budget, kept in the mapping: a warden dumps when the alarm is newer
  than its own last dump, and raises it again when its dump finds an excess, so every
  worker's warden keeps dumping while a source is over and stops after the first dump
  that finds none.
"""

from __future__ import annotations

import mmap
import time
from collections.abc import Callable

COLUMNS = 1 << 16  # 256 KiB of counters per worker (mapped lazily, pages touched as sources arrive)
_COUNTER, _ALARM = 4, 8  # bytes of one counter ("i") and of the alarm ("q")
_NEVER = -(1 << 62)
_prepared: list[Tally] = []  # the tally made before forking (``prepare``), which every worker inherits


class Tally:
    """Per-source open connections of ``rows`` workers, and the alarm (see the module docstring)."""

    __slots__ = ("_alarm", "_base", "_counts", "_map", "budget", "exempt", "rows")

    def __init__(self, rows: int = 1) -> None:
        self._map = mmap.mmap(-1, _ALARM + rows * COLUMNS * _COUNTER)  # MAP_SHARED | MAP_ANONYMOUS: kept over fork
        view = memoryview(self._map)
        self._alarm = view[:_ALARM].cast("q")
        self._counts = view[_ALARM:].cast("i")
        self._alarm[0] = _NEVER
        self.rows = rows
        self._base = 0  # this worker's row, times COLUMNS
        self.budget = 0  # set by the warden; a count above it raises the alarm
        self.exempt: Callable[[str], bool] = lambda _source: False

    def adopt_row(self, row: int) -> None:
        """This process is worker ``row`` (0-based) of the ones sharing the tally."""
        self._base = row * COLUMNS

    def opened(self, source: str) -> None:
        """A connection from ``source`` was accepted; the alarm goes up if the source is now over budget."""
        column = hash(source) % COLUMNS
        counts = self._counts
        index = self._base + column
        count = counts[index] + 1
        counts[index] = count
        if self.rows > 1:
            count = sum(counts[column::COLUMNS])
        if count > self.budget > 0 and not self.exempt(source):
            self.alarm()

    def closed(self, source: str) -> None:
        """A connection from ``source`` counted by ``opened`` has closed."""
        index = self._base + hash(source) % COLUMNS
        self._counts[index] -= 1

    def count(self, source: str) -> int:
        """How many connections from ``source`` (or from sources sharing its column) are open, all workers."""
        return sum(self._counts[hash(source) % COLUMNS::COLUMNS])

    def alarm(self) -> None:
        """Some source is (or may be) over budget: every warden dumps at its next period."""
        self._alarm[0] = time.monotonic_ns()

    def alarmed_since(self, when: int) -> bool:
        """Whether the alarm went up at or after monotonic time ``when`` (ns)."""
        return self._alarm[0] >= when


def prepare(workers: int) -> None:
    """Before forking ``workers`` processes: one tally they all share (each then calls ``adopt_row``)."""
    _prepared[:] = [Tally(workers)]


def shared() -> Tally:
    """The tally this process counts into: the one ``prepare`` made before forking, or a fresh one-row one."""
    return _prepared[0] if _prepared else Tally()
