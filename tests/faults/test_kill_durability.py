"""``kill -9`` durability: every write ``imds serve`` acknowledged survives a SIGKILL mid-load.

Each round starts a real server on the same database (SQLite file, PostgreSQL database),
runs concurrent writers until enough writes are acknowledged, SIGKILLs the process by PID
while writes are in flight, and the next round (or the final check) reads every write
acknowledged so far back through the admin API of a restarted server. Nothing may be lost.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid

import httpx
import pytest

from helpers import wait_for
from serve_process import ADMIN_TOKEN, Server, serving

pytestmark = pytest.mark.slow

ROUNDS, WRITERS, ACKS_PER_ROUND = 4, 4, 60
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
_addresses = itertools.count(1)


def _address() -> str:
    n = next(_addresses)
    return f"10.200.{n >> 8 & 255}.{n & 255}"


class Writers:
    """Threads posting fresh instances until stopped; ``acked`` maps each acknowledged id to its hostname."""

    def __init__(self, server: Server) -> None:
        self.acked: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._write, args=(server,), daemon=True) for _ in range(WRITERS)]
        for thread in self._threads:
            thread.start()

    def _write(self, server: Server) -> None:
        with httpx.Client(timeout=30.0, trust_env=False) as client:
            while not self._stop.is_set():
                instance_id, hostname = str(uuid.uuid4()), f"k-{uuid.uuid4().hex[:10]}"
                body = {"id": instance_id, "ipAddresses": [_address()],
                        "metadata": {"id": instance_id, "hostname": hostname}}
                try:
                    answer = client.post(f"{server.url}/device-metadata", json=body, headers=AUTH)
                except httpx.TransportError:
                    continue  # the server was killed: this write was never acknowledged
                if answer.status_code == 200 and answer.json().get("applied") is True:
                    with self._lock:
                        self.acked[instance_id] = hostname

    def count(self) -> int:
        with self._lock:
            return len(self.acked)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)


def _lost(server: Server, acked: dict[str, str]) -> list[str]:
    """The acknowledged ids the restarted server does not return exactly as written."""
    lost = []
    with httpx.Client(timeout=30.0, trust_env=False) as client:
        for instance_id, hostname in acked.items():
            answer = client.get(f"{server.url}/device-metadata/{instance_id}", headers=AUTH)
            if answer.status_code != 200 or answer.json().get("hostname") != hostname:
                lost.append(instance_id)
    return lost


def _rounds(tmp_path, url: str) -> dict[str, int]:
    acked: dict[str, str] = {}
    args = ("--db", url, "--data-dir", str(tmp_path / "data"))
    for number in range(ROUNDS):
        with serving(tmp_path, *args) as server:
            assert _lost(server, acked) == [], f"round {number}: acknowledged writes lost after kill -9"
            writers = Writers(server)
            try:
                before = len(acked)
                wait_for(lambda w=writers: w.count() >= ACKS_PER_ROUND,
                         what=f"round {number}: acknowledged writes", timeout=120)
                server.process.kill()  # SIGKILL by PID, writes in flight
                server.process.wait(timeout=30)
            finally:
                writers.stop()
            acked.update(writers.acked)
            assert len(acked) > before
    with serving(tmp_path, *args) as server:
        started = time.monotonic()
        lost = _lost(server, acked)
        checked = time.monotonic() - started
    assert lost == [], f"{len(lost)} of {len(acked)} acknowledged writes lost"
    return {"rounds": ROUNDS, "acknowledged": len(acked), "lost": len(lost), "check_seconds": int(checked)}


def test_sqlite_keeps_every_acknowledged_write_across_kill_9(tmp_path):
    """SQLite (WAL, synchronous=FULL): four SIGKILL rounds under four concurrent writers, zero lost."""
    figures = _rounds(tmp_path, f"sqlite:///{tmp_path / 'kill.db'}")
    print(f"\nFIGURES kill-9 sqlite: {figures}")  # noqa: T201 - the suite's figures for the report


@pytest.mark.postgres
def test_postgres_keeps_every_acknowledged_write_across_kill_9(tmp_path, postgres_empty_url):
    """PostgreSQL: four SIGKILL rounds under four concurrent writers, zero lost."""
    figures = _rounds(tmp_path, postgres_empty_url)
    print(f"\nFIGURES kill-9 postgres: {figures}")  # noqa: T201 - the suite's figures for the report
