"""The per-caller token bucket of the instance front, on an injected clock."""

from __future__ import annotations

import pytest

from helpers import FakeClock
from imds.errors import RateLimited
from imds.services.admission import ratelimit
from imds.services.admission.ratelimit import RateLimiter


def test_a_burst_is_allowed_then_the_caller_waits_for_the_rate():
    """Burst requests pass at once; the next one is told how long to wait (whole seconds, at least 1)."""
    clock = FakeClock()
    limiter = RateLimiter(rate=2.0, burst=3, clock=clock)
    assert [limiter.retry_after("10.0.0.1") for _ in range(3)] == [0, 0, 0]
    assert limiter.retry_after("10.0.0.1") == 1
    clock.now += 0.5  # one token back at 2/s
    assert limiter.retry_after("10.0.0.1") == 0
    assert limiter.retry_after("10.0.0.1") == 1


def test_a_slow_rate_announces_a_longer_retry_after():
    """At 0.1 request/s an empty bucket needs 10 s for the next token."""
    limiter = RateLimiter(rate=0.1, burst=1, clock=FakeClock())
    assert limiter.retry_after("a") == 0
    assert limiter.retry_after("a") == 10


def test_each_address_has_its_own_bucket():
    """One caller exhausting its burst does not slow another."""
    limiter = RateLimiter(rate=1.0, burst=1, clock=FakeClock())
    assert limiter.retry_after("10.0.0.1") == 0
    assert limiter.retry_after("10.0.0.1") == 1
    assert limiter.retry_after("10.0.0.2") == 0


def test_refill_never_exceeds_the_burst():
    """A caller quiet for an hour gets burst requests, not an hour's worth."""
    clock = FakeClock()
    limiter = RateLimiter(rate=10.0, burst=2, clock=clock)
    limiter.retry_after("a")
    clock.now += 3600
    assert [limiter.retry_after("a") for _ in range(3)] == [0, 0, 1]


def test_the_bucket_table_is_bounded(monkeypatch):
    """Past MAX_BUCKETS callers, buckets that have refilled are forgotten (memory stays bounded)."""
    monkeypatch.setattr(ratelimit, "MAX_BUCKETS", 4)
    clock = FakeClock()
    limiter = RateLimiter(rate=1.0, burst=1, clock=clock)
    for n in range(4):
        limiter.retry_after(f"10.0.0.{n}")
    clock.now += 5  # all four have refilled
    limiter.retry_after("10.0.0.99")
    assert len(limiter) == 1
    for n in range(10):  # nobody has refilled: the oldest half goes
        limiter.retry_after(f"10.1.0.{n}")
        assert len(limiter) <= 4


def test_take_raises_rate_limited_with_the_wait():
    """``take`` (the channel's form) raises RateLimited carrying the Retry-After seconds."""
    limiter = RateLimiter(rate=0.5, burst=1, clock=FakeClock())
    limiter.take("instance-1")
    with pytest.raises(RateLimited) as caught:
        limiter.take("instance-1")
    assert caught.value.retry_after == 2
