"""``StoreHealth``: one logged ``store.unavailable`` / ``store.recovered`` pair per outage, naming the server."""

from __future__ import annotations

from structlog.testing import capture_logs

from helpers import FakeClock as Clock
from imds.store.sql.health import StoreHealth


def events(logs: list[dict[str, object]]) -> list[str]:
    return [str(entry["event"]) for entry in logs]


def test_an_outage_is_one_pair_of_lines_naming_the_server():
    """The first failure logs unavailable (server, problem); repeats are counted; the first success logs recovered."""
    clock = Clock()
    health = StoreHealth("postgresql servers h1:5432, h2:5432", every=30.0, clock=clock)
    with capture_logs() as logs:
        health.succeeded("h1:5432")  # nothing to say while it answers
        health.failed("h1:5432 no answer within 2 s", "h1:5432")
        for _ in range(50):
            clock.now += 0.2
            health.failed("no read-write server: h1:5432 no answer within 2 s; h2:5432 read-only (a standby)")
        assert health.problem is not None
        clock.now += 1.0
        health.succeeded("h2:5432")
    assert events(logs) == ["store.unavailable", "store.recovered"]
    assert logs[0]["server"] == "h1:5432"
    assert logs[0]["problem"] == "h1:5432 no answer within 2 s"
    assert logs[1] == logs[1] | {"server": "h2:5432", "failures": 51, "seconds": 11.0, "log_level": "warning"}
    assert health.problem is None


def test_a_long_outage_is_reminded_every_interval():
    """While the outage lasts, one still_unavailable line per interval, with the failures counted so far."""
    clock = Clock()
    health = StoreHealth("postgresql server db:5432", every=30.0, clock=clock)
    with capture_logs() as logs:
        for _ in range(100):
            health.failed("db:5432 connection refused")
            clock.now += 1.0
    assert events(logs) == ["store.unavailable", "store.still_unavailable", "store.still_unavailable",
                            "store.still_unavailable"]
    assert logs[0]["server"] == "postgresql server db:5432"  # no server named: the URL's
    assert logs[1]["failures"] == 31


def test_a_flapping_database_is_folded_into_the_next_line():
    """Outages starting within the interval of the last logged one are counted, not logged, then told."""
    clock = Clock()
    health = StoreHealth("postgresql server db:5432", every=30.0, clock=clock)
    with capture_logs() as logs:
        for _ in range(5):  # down and up every 2 s
            health.failed("db:5432 connection refused")
            clock.now += 1.0
            health.succeeded("db:5432")
            clock.now += 1.0
        clock.now += 30.0
        health.failed("db:5432 connection refused")
        health.succeeded("db:5432")
    assert events(logs) == ["store.unavailable", "store.recovered", "store.unavailable", "store.recovered"]
    assert logs[2]["folded_outages"] == 4


def test_quiet_health_logs_nothing():
    """One-shot commands (migrations) keep the state but log nothing: their error line says it all."""
    health = StoreHealth("postgresql server db:5432", quiet=True)
    with capture_logs() as logs:
        health.failed("db:5432 connection refused")
        health.succeeded("db:5432")
    assert logs == []
