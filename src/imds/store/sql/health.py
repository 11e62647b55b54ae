"""``StoreHealth``: one ``store.unavailable`` / ``store.recovered`` pair per outage in the log, naming the server.

Every connection attempt and every lost connection reports here. The first failure of an
outage logs ``store.unavailable`` (which server, why); further failures are counted and
logged at most once per ``every`` seconds (``store.still_unavailable``); the first success
after it logs ``store.recovered`` with the server reached, how long the outage lasted and
how many failures it saw. An outage that begins within ``every`` seconds of the last logged
one (a flapping database) is folded into the next line instead of logging a new pair.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from imds import log

_log = log.get("store")
EVERY = 30.0  # seconds between log lines about one outage


class StoreHealth:
    """Whether the database answered last time, and the rate-limited log lines about it."""

    def __init__(self, where: str, *, every: float = EVERY, clock: Callable[[], float] = time.monotonic,
                 quiet: bool = False) -> None:
        self._where = where
        self._log = None if quiet else _log  # quiet: one-shot commands, whose error line says it all
        self._every = every
        self._clock = clock
        self.problem: str | None = None  # why the last attempt failed; None while the database answers
        self._since = 0.0  # when the current outage began
        self._failures = 0  # failures in the current outage
        self._logged = -float("inf")  # when the last unavailable / still_unavailable line was written
        self._announced = False  # whether this outage's store.unavailable line was written
        self._folded = 0  # outages not logged on their own (flapping), told with the next line

    def failed(self, problem: str, server: object = None) -> None:
        """An attempt failed (``server``: the one that failed, when one did)."""
        now = self._clock()
        shown = str(server) if server is not None else self._where
        if self.problem is None:
            self._since, self._failures = now, 0
            self._announced = now - self._logged >= self._every
            if self._announced:
                self._logged = now
                self._warn("store.unavailable", server=shown, problem=problem, folded_outages=self._folded)
                self._folded = 0
            else:
                self._folded += 1
        elif now - self._logged >= self._every:
            self._logged, self._announced = now, True
            self._warn("store.still_unavailable", server=shown, problem=problem, failures=self._failures + 1,
                         seconds=round(now - self._since, 1))
        self.problem = problem
        self._failures += 1

    def succeeded(self, server: object) -> None:
        """An attempt reached ``server`` (a read-write session)."""
        if self.problem is None:
            return
        if self._announced:
            self._warn("store.recovered", server=str(server), seconds=round(self._clock() - self._since, 1),
                         failures=self._failures)
        self.problem = None

    def _warn(self, event: str, **fields: object) -> None:
        if self._log is not None:
            self._log.warning(event, **fields)
