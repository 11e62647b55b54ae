"""``WriteProbe``: when each node of a ``PatroniCluster`` first takes a real committed write.

A promoted standby is writable only once a COMMIT returns on it (with synchronous replication,
only once Patroni has pointed ``synchronous_standby_names`` somewhere that answers), so the
probe writes rather than asking ``pg_is_in_recovery()`` or Patroni's REST API.
"""

from __future__ import annotations

import asyncio
import threading
import time

import asyncpg

from patroni_cluster import STOP_TIMEOUT, Node, PatroniCluster


class WriteProbe:
    """A thread committing one small write to each node every ``every`` seconds; when each first succeeded."""

    def __init__(self, cluster: PatroniCluster, every: float = 0.1) -> None:
        self._cluster = cluster
        self._every = every
        self._since = time.monotonic()
        self.first: dict[str, float] = {}  # node name -> first committed write after ``reset``
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="write-probe", daemon=True)
        self._thread.start()

    def reset(self) -> float:
        """Forget earlier successes; from now on ``first`` records writes after this moment (returned)."""
        self._since = time.monotonic()
        self.first = {}
        return self._since

    async def _run(self) -> None:
        while not self._stop.is_set():
            await asyncio.gather(*(self._write(node) for node in self._cluster.nodes))
            await asyncio.sleep(self._every)

    async def _write(self, node: Node) -> None:
        started = time.monotonic()
        try:
            async with asyncio.timeout(1.0):
                conn = await asyncpg.connect(self._cluster.url(node, "postgres"), timeout=1.0)
                try:
                    await conn.execute("INSERT INTO harness_probe VALUES ($1, now())", node.name)
                finally:
                    conn.terminate()
        except Exception:  # noqa: BLE001 - any failure is "not writable yet" (asyncpg cut off mid-query too)
            return
        if started >= self._since:
            self.first.setdefault(node.name, time.monotonic())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=STOP_TIMEOUT)
