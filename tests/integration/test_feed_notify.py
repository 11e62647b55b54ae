"""Two ``imds serve`` processes on one PostgreSQL: NOTIFY carries a write to the other replica.

The feed poll interval is 30 s, so a prompt answer on the other replica can only come
from ``LISTEN/NOTIFY`` (or the listener's catch-up after it reconnects).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from factories import new_id
from postgres_server import in_thread
from serve_process import Server, client_at, serving

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]
GUEST = "127.0.94.9"


def served_write(server: Server) -> Any:
    with client_at(GUEST) as client:
        answer = client.get(f"{server.url}/metadata")
    return answer.json().get("write") if answer.status_code == 200 else None


def wait_for(predicate: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


def terminate_sessions(url: str, pid: int) -> int:
    """pg_terminate_backend every session of the imds process ``pid``; how many were cut."""

    async def run() -> int:
        conn = await asyncpg.connect(url)
        try:
            rows = await conn.fetch(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", f"imds-{pid}"
            )
            return len(rows)
        finally:
            await conn.close()

    return in_thread(lambda: asyncio.run(run()))


def test_notify_carries_writes_and_a_cut_replica_catches_up(tmp_path: Path, postgres_url: str) -> None:
    """B serves A's write within seconds (poll 30 s); after B's sessions are cut it catches up on a missed write."""
    args = ("--db", postgres_url, "--feed-poll-interval", "30")
    with serving(tmp_path, *args) as a, serving(tmp_path, *args) as b:
        wait_for(lambda: "feed.listening" in b.output(), "B to listen")
        instance_id = new_id()
        body = {"id": instance_id, "ipAddresses": [GUEST], "metadata": {"id": instance_id, "write": 1}}
        a.post("/device-metadata", body)
        wait_for(lambda: served_write(b) == 1, "B to serve write 1")
        assert served_write(a) == 1
        assert terminate_sessions(postgres_url, b.process.pid) >= 1
        body["metadata"]["write"] = 2
        a.post("/device-metadata", body)  # B's listener is down (it waits before reconnecting)
        wait_for(lambda: served_write(b) == 2, "B to catch up with write 2", timeout=20.0)
        log = b.output()
        assert "feed.listener_lost" in log
        assert log.count("feed.listening") >= 2
