"""Server plumbing of ``imds serve``: log-flood throttling and the listener-limit settings."""

from __future__ import annotations

import logging

import pytest

from helpers import FakeClock
from imds.cli.servers import OncePerInterval
from imds.config import load
from imds.errors import ConfigError

ENV = {"XDG_DATA_HOME": "/nonexistent-imds-test"}


def _record(name: str, msg: str) -> logging.LogRecord:
    return logging.LogRecord(name, logging.ERROR, __file__, 1, msg, None, None)


def test_a_flood_of_one_server_error_is_logged_once_per_interval():
    """340,000 "Too many open files" in 30 s become one line per interval, the next one counting the rest."""
    clock = FakeClock(0.0)
    throttle = OncePerInterval(10.0, clock)
    emitted = [throttle.filter(r) for r in [_record("asyncio", "accept failed: Too many open files")] * 1000]
    assert emitted.count(True) == 1
    clock.now = 10.0
    record = _record("asyncio", "accept failed: Too many open files")
    assert throttle.filter(record)
    assert "999 more like it" in record.getMessage()


def test_different_messages_and_imds_own_logs_are_not_throttled():
    """Only repeated server-logger records are merged; imds's own events always pass."""
    throttle = OncePerInterval(10.0, FakeClock(0.0))
    assert throttle.filter(_record("_granian.serve", "a"))
    assert throttle.filter(_record("_granian.serve", "b"))
    assert all(throttle.filter(_record("imds", "same")) for _ in range(5))


def test_server_limit_defaults_are_bounded():
    """Out of the box: imds's own front, 1 worker, finite heads, timeouts, connections and rate."""
    settings = load({}, environ=ENV)
    assert settings.http.server == "front"
    assert settings.http.workers == 1
    assert settings.http.max_header_bytes == 16384
    assert settings.http.max_headers == 100
    assert 0 < settings.http.header_timeout <= 30
    assert 0 < settings.http.body_timeout <= 30
    assert settings.http.max_connections == 4096  # room for 128 sources at their full budget (docs/server.md)
    assert settings.http.max_connections_per_source == 32
    assert (settings.callers.rate_limit, settings.callers.rate_burst) == (50.0, 200)


@pytest.mark.parametrize(("flags", "needle"), [
    ({"server": "hypercorn"}, "--server / IMDS_SERVER"),
    ({"workers": 2, "db": "memory://"}, "--workers / IMDS_WORKERS"),
    ({"max_header_bytes": 1024}, "--max-header-bytes"),
    ({"header_timeout": 0.0}, "--header-timeout"),
    ({"max_connections": 0}, "--max-connections"),
    ({"max_connections_per_source": -1}, "--max-connections-per-source"),
    ({"rate_limit": -1.0}, "--rate-limit"),
    ({"rate_burst": 0}, "--rate-burst"),
])
def test_bad_server_settings_name_their_flag(flags, needle):
    """Each invalid limit is refused at startup with its flag and env var."""
    with pytest.raises(ConfigError, match=needle):
        load(flags, environ=ENV)


def test_the_environment_sets_the_server():
    """IMDS_SERVER=uvicorn picks uvicorn (the documented fallback)."""
    assert load({}, environ={**ENV, "IMDS_SERVER": "uvicorn", "IMDS_WORKERS": "2"}).http.server == "uvicorn"
