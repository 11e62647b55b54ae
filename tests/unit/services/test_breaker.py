"""The upstream circuit breaker, with an injected clock and jitter (no sleeping)."""

from __future__ import annotations

import pytest

from helpers import FakeClock
from imds.services.lookup.breaker import CLOSED, HALF_OPEN, OPEN, STATE_VALUES, Breaker


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def breaker(clock: FakeClock, *, failures: int = 3, reset: float = 10.0, jitter: float = 1.0, **kwargs) -> Breaker:
    return Breaker(failures=failures, reset=reset, clock=clock, jitter=lambda: jitter, **kwargs)


def fail(b: Breaker, times: int) -> None:
    for _ in range(times):
        assert b.allow()
        b.failure()


def test_a_new_breaker_is_closed_and_lets_every_call_through(clock):
    """Closed: allow() is true every time and nothing is left to wait."""
    b = breaker(clock)
    assert all(b.allow() for _ in range(100))
    assert b.state == CLOSED
    assert b.seconds_left() == 0.0


def test_it_opens_after_the_threshold_of_consecutive_failures(clock):
    """failures-1 failures keep it closed; the next one opens it and calls fail fast."""
    b = breaker(clock, failures=3)
    fail(b, 2)
    assert b.state == CLOSED
    fail(b, 1)
    assert b.state == OPEN
    assert [b.allow() for _ in range(5)] == [False] * 5
    assert b.seconds_left() == pytest.approx(10.0)


def test_a_success_resets_the_consecutive_count(clock):
    """Failures separated by a success never add up to the threshold."""
    b = breaker(clock, failures=3)
    for _ in range(5):
        fail(b, 2)
        assert b.allow()
        b.success()
    assert b.state == CLOSED


def test_after_the_reset_interval_exactly_one_trial_goes_out(clock):
    """Open → half-open when the interval has passed; only the first caller gets the trial."""
    b = breaker(clock, failures=1, reset=10.0)
    fail(b, 1)
    clock.now += 9.999
    assert not b.allow()
    assert b.state == OPEN
    clock.now += 0.001
    assert b.allow()
    assert b.state == HALF_OPEN
    assert [b.allow() for _ in range(3)] == [False] * 3
    assert b.seconds_left() == 0.0


def test_a_successful_trial_closes_it(clock):
    """Half-open + success → closed, every call allowed again."""
    b = breaker(clock, failures=1)
    fail(b, 1)
    clock.now += 10
    assert b.allow()
    b.success()
    assert b.state == CLOSED
    assert all(b.allow() for _ in range(10))


def test_a_failed_trial_reopens_it_for_twice_as_long(clock):
    """Each reopening doubles the interval: 10, 20, 40 s."""
    b = breaker(clock, failures=2, reset=10.0)
    fail(b, 2)
    for expected in (20.0, 40.0):
        clock.now += b.seconds_left()
        assert b.allow()
        b.failure()  # one failure is enough from half-open
        assert b.state == OPEN
        assert b.seconds_left() == pytest.approx(expected)


def test_the_interval_is_capped(clock):
    """Doubling stops at max_reset."""
    b = breaker(clock, failures=1, reset=10.0, max_reset=30.0)
    seen = []
    fail(b, 1)
    for _ in range(5):
        seen.append(b.seconds_left())
        clock.now += b.seconds_left()
        assert b.allow()
        b.failure()
    assert seen == pytest.approx([10.0, 20.0, 30.0, 30.0, 30.0])


def test_closing_resets_the_doubling(clock):
    """After a success the next opening waits the base interval again."""
    b = breaker(clock, failures=1, reset=10.0)
    fail(b, 1)
    clock.now += 10
    fail(b, 1)  # reopened for 20
    clock.now += 20
    assert b.allow()
    b.success()
    fail(b, 1)
    assert b.seconds_left() == pytest.approx(10.0)


@pytest.mark.parametrize("jitter", [0.8, 1.2])
def test_the_interval_is_jittered(clock, jitter):
    """The injected jitter factor multiplies the interval (the cap applies before it)."""
    b = breaker(clock, failures=1, reset=10.0, jitter=jitter)
    fail(b, 1)
    assert b.seconds_left() == pytest.approx(10.0 * jitter)
    clock.now += 10.0 * jitter - 0.001
    assert not b.allow()
    clock.now += 0.001
    assert b.allow()


def test_the_default_jitter_stays_within_twenty_percent(clock):
    """Without an injected jitter the interval is 0.8-1.2 times the base."""
    for _ in range(50):
        b = Breaker(failures=1, reset=10.0, clock=clock)
        b.failure()
        assert 8.0 <= b.seconds_left() <= 12.0


def test_late_failures_while_open_neither_extend_nor_double_the_interval(clock):
    """Calls that went out before it opened and fail afterwards leave the interval and the next doubling alone."""
    b = breaker(clock, failures=2, reset=10.0)
    fail(b, 2)
    clock.now += 3
    for _ in range(10):  # a burst of in-flight calls failing after the threshold was reached
        b.failure()
    assert b.state == OPEN
    assert b.seconds_left() == pytest.approx(7.0)
    clock.now += 7
    assert b.allow()
    b.failure()
    assert b.seconds_left() == pytest.approx(20.0)


def test_an_abandoned_trial_frees_the_half_open_slot(clock):
    """A trial that ends without an outcome (cancelled) lets the next caller try, instead of sticking half-open."""
    b = breaker(clock, failures=1)
    fail(b, 1)
    clock.now += 10
    assert b.allow()
    assert not b.allow()
    b.abandon()
    assert b.state == HALF_OPEN
    assert b.allow()
    assert not b.allow()
    b.success()
    assert b.state == CLOSED


def test_abandon_outside_half_open_changes_nothing(clock):
    """abandon() while closed or open is a no-op."""
    b = breaker(clock, failures=1)
    b.abandon()
    assert b.state == CLOSED
    fail(b, 1)
    b.abandon()
    assert b.state == OPEN
    assert not b.allow()


def test_gauge_values_are_the_documented_ones():
    """imds_lookup_breaker_state: 0 closed, 1 open, 2 half-open."""
    assert STATE_VALUES == {CLOSED: 0, OPEN: 1, HALF_OPEN: 2}
