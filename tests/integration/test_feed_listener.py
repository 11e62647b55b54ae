"""``FeedListener`` supervision: its task never dies silently, and a server it cannot reach is logged once.

No PostgreSQL here: the servers are a closed port and the PostgreSQL server's own tests (and the
failover suite, tests/faults/test_patroni_failover.py) cover listening itself.
"""

from __future__ import annotations

import asyncio
import socket

import pytest
from structlog.testing import capture_logs

from helpers import wait_for_async
from imds.store.sql import listen
from imds.store.sql.engine import connector_for
from imds.store.sql.listen import FeedListener

pytestmark = pytest.mark.anyio


def _closed_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"postgresql://imds@127.0.0.1:{sock.getsockname()[1]}/imds"


async def test_a_listener_task_that_dies_is_logged_and_restarted(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unexpected end of the listening task is logged with its cause, and the task starts again."""
    runs = 0

    async def run(_self: FeedListener) -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise RuntimeError("boom")
        await asyncio.sleep(3600)

    monkeypatch.setattr(FeedListener, "_run", run)
    listener = FeedListener(connector_for(_closed_url(), quiet=True))
    try:
        with capture_logs() as logs:
            await listener.wait(0.01)
            await wait_for_async(lambda: runs == 2, what="the listener to be restarted")
        died = [entry for entry in logs if entry["event"] == "feed.listener_died"]
        assert len(died) == 1, logs
        assert died[0]["problem"] == "boom"
    finally:
        await listener.close()
    assert runs == 2  # closing stops it for good


async def test_an_unreachable_server_is_logged_once_and_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    """Repeated failures to listen give one feed.listener_lost line (rate-limited), and attempts go on."""
    monkeypatch.setattr(listen, "RETRY", 0.05)
    connector = connector_for(_closed_url(), connect_timeout=0.3, statement_timeout=0.3, quiet=True)
    attempts = 0
    connect = connector.connect

    async def counting() -> object:
        nonlocal attempts
        attempts += 1
        return await connect()

    monkeypatch.setattr(connector, "connect", counting)
    listener = FeedListener(connector)
    try:
        with capture_logs() as logs:
            await listener.wait(0.01)
            await wait_for_async(lambda: attempts >= 3, what="three attempts to listen", timeout=30)
        lost = [entry for entry in logs if entry["event"] == "feed.listener_lost"]
        assert len(lost) == 1, logs
        assert "connection refused" in str(lost[0]["problem"])
    finally:
        await listener.close()
