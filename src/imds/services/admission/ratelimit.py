"""Per-caller rate limits: one token bucket per key.

The key is the caller's address on the instance front and the instance id for the
channel's events.
A bucket holds up to ``burst`` tokens and refills at ``rate`` tokens per second; each
request takes one. An empty bucket answers "retry after N seconds". The clock is
injected so tests never sleep. Buckets live in a plain dict: the front runs on one event
loop, so no lock is needed; the dict is bounded by dropping buckets that are full again
(their callers have been quiet long enough that forgetting them changes nothing).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from imds.errors import RateLimited

MAX_BUCKETS = 65536


class RateLimiter:
    """Token buckets keyed by caller address."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = float(burst)
        self._clock = clock
        self._buckets: dict[str, list[float]] = {}  # address -> [tokens, last refill time]

    def retry_after(self, key: str) -> int:
        """Take a token for ``key``: 0 if allowed, else whole seconds until one is available."""
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= MAX_BUCKETS:
                self._forget_full(now)
            self._buckets[key] = [self.burst - 1.0, now]
            return 0
        tokens = min(self.burst, bucket[0] + (now - bucket[1]) * self.rate)
        bucket[1] = now
        if tokens >= 1.0:
            bucket[0] = tokens - 1.0
            return 0
        bucket[0] = tokens
        return max(1, math.ceil((1.0 - tokens) / self.rate))

    def take(self, key: str) -> None:
        """Spend one token of ``key``'s bucket, or raise RateLimited saying when one is back."""
        wait = self.retry_after(key)
        if wait:
            raise RateLimited(wait)

    def _forget_full(self, now: float) -> None:
        """Drop the buckets that have refilled completely (or, if none has, the oldest half)."""
        full = [key for key, (tokens, last) in self._buckets.items() if tokens + (now - last) * self.rate >= self.burst]
        if not full:
            full = list(self._buckets)[: len(self._buckets) // 2]
        for key in full:
            del self._buckets[key]

    def __len__(self) -> int:
        """How many callers have a bucket."""
        return len(self._buckets)


class InFlight:
    """How many requests each caller address has in flight, capped at ``limit`` (0: no cap).

    ``enter`` takes a slot (False when the address already holds ``limit``), ``leave`` gives
    it back; a key is dropped when its count returns to zero, so the dict only ever holds
    the addresses with a request open right now. One event loop: no lock.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[str, int] = {}

    def enter(self, key: str) -> bool:
        """Take a slot for ``key``; False (nothing taken) when it already has ``limit`` in flight."""
        held = self._held.get(key, 0)
        if self.limit and held >= self.limit:
            return False
        self._held[key] = held + 1
        return True

    def leave(self, key: str) -> None:
        """Give back one of ``key``'s slots."""
        held = self._held[key] - 1
        if held:
            self._held[key] = held
        else:
            del self._held[key]

    def held(self, key: str) -> int:
        """Requests ``key`` has in flight."""
        return self._held.get(key, 0)

    def __len__(self) -> int:
        """How many addresses have a request in flight."""
        return len(self._held)
