"""PostgreSQL: the write path looks rows up by key even in a new database, before any ANALYZE.

Until autovacuum first analyses a table the planner has no statistics, and it planned the
write path's address lookup (``instance_id = ANY(…) OR address = ANY(…)``) as a
sequential scan, kept as the table grew: 8 million rows read for 8,000 upserts into a new
database. Write transactions therefore turn sequential scans off (``SET LOCAL``, sent
with the feed-head lock). The server's own counters show which scans ran.
"""

from __future__ import annotations

import ipaddress

import asyncpg
import pytest

from factories import new_id
from helpers import wait_for_async
from imds.store import open_store

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]
BOUND = 60.0  # seconds for the server to publish the finished sessions' counters


async def table_counters(url: str, table: str) -> dict[str, int]:
    conn = await asyncpg.connect(url)
    try:
        row = await conn.fetchrow(
            "SELECT seq_scan, seq_tup_read, n_tup_ins FROM pg_stat_user_tables WHERE relname = $1", table)
        return dict(row)
    finally:
        await conn.close()


async def test_writes_into_a_new_database_read_no_table_from_end_to_end(postgres_url: str) -> None:
    store = open_store(postgres_url)
    rows = 0
    try:
        for batch in range(40):  # 40 groups of 5 instances with 2 addresses each: the table grows to 400 rows
            async with store.write() as tx:
                ids = [new_id() for _ in range(5)]
                await tx.put_records([(i, {"id": i}) for i in ids], [])
                lists = [(i, (ipaddress.ip_network(f"10.77.{batch}.{2 * n}/32"),
                              ipaddress.ip_network(f"10.77.{batch}.{2 * n + 1}/32"))) for n, i in enumerate(ids)]
                await tx.replace_addresses_many(lists)
                await tx.mark_changed(ids)
            rows += 10
    finally:
        await store.close()  # its sessions end, and with them their counters are published

    async def published() -> dict[str, int] | None:
        found = await table_counters(postgres_url, "instance_ip_addresses")
        return found if found["n_tup_ins"] >= rows else None

    counters = await wait_for_async(published, what=f"{rows} inserted rows in the statistics", timeout=BOUND)
    assert counters["n_tup_ins"] == rows, counters  # every write session's counters are in
    assert counters["seq_tup_read"] == 0, counters  # and no statement read the table from end to end
    metadata = await table_counters(postgres_url, "instance_metadata")
    assert metadata["seq_tup_read"] == 0, metadata
