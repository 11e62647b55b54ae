"""A circuit breaker for upstream calls.

Closed: calls go through. After ``failures`` consecutive failures it opens: calls fail
fast, without touching the upstream, for a jittered interval that doubles each time it
reopens (capped). Then one trial call is let through (half-open): success closes it,
failure reopens it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"
STATE_VALUES = {CLOSED: 0, OPEN: 1, HALF_OPEN: 2}


class Breaker:
    """Counts consecutive failures and decides whether the next call may go out."""

    def __init__(
        self,
        *,
        failures: int = 5,
        reset: float = 10.0,
        max_reset: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = lambda: random.uniform(0.8, 1.2),  # noqa: S311 - jitter, not crypto
    ) -> None:
        self._threshold = failures
        self._reset = reset
        self._max_reset = max_reset
        self._clock = clock
        self._jitter = jitter
        self.state = CLOSED
        self._consecutive = 0
        self._opened = 0
        self._until = 0.0
        self._trial_out = False

    def allow(self) -> bool:
        """Whether a call may go out now (claims the single half-open trial)."""
        if self.state == OPEN and self._clock() >= self._until:
            self.state, self._trial_out = HALF_OPEN, False
        if self.state == HALF_OPEN:
            if self._trial_out:
                return False
            self._trial_out = True
            return True
        return self.state == CLOSED

    def success(self) -> None:
        """A call succeeded: close."""
        self.state, self._consecutive, self._opened, self._trial_out = CLOSED, 0, 0, False

    def failure(self) -> None:
        """A call failed: open after the threshold, or at once from half-open."""
        self._consecutive += 1
        if self.state == OPEN:
            return  # a call that went out before it opened: the interval (and its doubling) stands
        if self.state == HALF_OPEN or self._consecutive >= self._threshold:
            interval = min(self._reset * 2**self._opened, self._max_reset) * self._jitter()
            self.state, self._until, self._trial_out = OPEN, self._clock() + interval, False
            self._opened += 1

    def abandon(self) -> None:
        """A call that was let through ended without an outcome (cancelled): free the half-open trial."""
        if self.state == HALF_OPEN:
            self._trial_out = False

    def seconds_left(self) -> float:
        """How long the breaker stays open (0 when it is not open)."""
        return max(self._until - self._clock(), 0.0) if self.state == OPEN else 0.0
