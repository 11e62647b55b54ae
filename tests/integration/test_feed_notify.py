"""Two ``imds serve`` processes on one PostgreSQL: NOTIFY carries a write to the other replica.

The feed poll interval is 600 s, longer than any wait here, so an answer on the other
replica can only come from ``LISTEN/NOTIFY`` (or the listener's catch-up after it
reconnects), never from the fallback poll.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from factories import new_id
from helpers import wait_for
from postgres_server import in_thread
from serve_process import Server, client_at, in_background, metric, serving

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(240)]
GUEST = "127.0.94.9"
BOUND = 30.0  # seconds to wait for what should happen about at once (a loaded machine is slow)


def served_write(server: Server) -> Any:
    with client_at(GUEST) as client:
        answer = client.get(f"{server.url}/metadata")
    return answer.json().get("write") if answer.status_code == 200 else None


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


@contextmanager
def two_replicas(tmp_path: Path, postgres_url: str) -> Iterator[tuple[Server, Server, dict[str, Any]]]:
    """Replicas A and B (no fallback poll), B listening and serving A's first write; yields (A, B, the write)."""
    args = ("--db", postgres_url, "--feed-poll-interval", "600")
    with serving(tmp_path, *args) as a, serving(tmp_path, *args) as b:
        wait_for(lambda: "feed.listening" in b.output(), what="B to listen", timeout=BOUND)
        instance_id = new_id()
        body = {"id": instance_id, "ipAddresses": [GUEST], "metadata": {"id": instance_id, "write": 1}}
        a.post("/device-metadata", body)
        wait_for(lambda: served_write(b) == 1, what="B to serve write 1", timeout=BOUND)
        yield a, b, body


def test_notify_carries_writes_and_a_cut_replica_catches_up(tmp_path: Path, postgres_url: str) -> None:
    """B serves A's write (no poll); after B's sessions are cut it catches up on a write made while it was cut off."""
    with two_replicas(tmp_path, postgres_url) as (a, b, body):
        assert served_write(a) == 1
        assert terminate_sessions(postgres_url, b.process.pid) >= 1
        body["metadata"]["write"] = 2
        a.post("/device-metadata", body)  # B's listener is down (it waits before reconnecting)
        wait_for(lambda: served_write(b) == 2, what="B to catch up with write 2", timeout=BOUND)
        log = b.output()
        assert "feed.listener_lost" in log
        assert log.count("feed.listening") >= 2


def test_a_change_watch_held_on_one_replica_is_woken_by_a_write_through_the_other(
    tmp_path: Path, postgres_url: str
) -> None:
    """B holds a wait_for_change read (timeout 120 s, no poll); A's write answers it with the new value."""
    with two_replicas(tmp_path, postgres_url) as (a, b, body):
        with client_at(GUEST) as guest:
            etag = guest.get(f"{b.url}/metadata").headers["etag"]

        def held() -> httpx.Response:
            with client_at(GUEST) as waiter:
                params = {"wait_for_change": "true", "last_etag": etag, "timeout_sec": "120"}
                return waiter.get(f"{b.url}/metadata", params=params, timeout=180.0)

        answers = in_background(held)
        wait_for(lambda: metric(b, "imds_watch_waiting") == 1, what="the read to be held on B", timeout=BOUND)
        body["metadata"]["write"] = 2
        a.post("/device-metadata", body)
        answer = answers.get(timeout=BOUND)  # well before the watch's own 120 s timeout
        assert not isinstance(answer, Exception), answer
        assert answer.status_code == 200
        assert answer.json()["write"] == 2
        assert answer.headers["etag"] != etag
        assert served_write(b) == 2
