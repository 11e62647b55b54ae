"""Catalog loading reports its progress (for /readyz and the log) and yields to the event loop while indexing."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest
from structlog.testing import capture_logs

from imds.services.catalog.catalog import LOAD_CHUNK, Catalog
from imds.store.memory import MemoryStore

pytestmark = pytest.mark.anyio


async def test_loading_logs_progress_and_lets_other_tasks_run():
    """12,000 instances: phases waiting → loaded, progress logged per chunk, another task runs between chunks."""
    store = MemoryStore()
    total = 2 * LOAD_CHUNK + 2000
    async with store.write() as tx:
        for n in range(total):
            instance_id = f"00000000-0000-4000-8000-{n:012d}"
            await tx.put_records([(instance_id, {"id": instance_id})], [])
            address = ipaddress.ip_network(f"10.{n >> 16}.{n >> 8 & 255}.{n & 255}")
            await tx.replace_addresses_many([(instance_id, [address])])
    catalog = Catalog(store)
    assert catalog.progress() == {"phase": "waiting", "indexed": 0, "total": 0}
    seen: list[dict[str, object]] = []

    async def watch() -> None:
        while not catalog.loaded:
            seen.append(catalog.progress())
            await asyncio.sleep(0)

    with capture_logs() as logs:
        watcher = asyncio.create_task(watch())
        await catalog.load()
        await watcher
    progress = [(e["indexed"], e["total"]) for e in logs if e["event"] == "catalog.loading" and "indexed" in e]
    assert progress == [(LOAD_CHUNK, total), (2 * LOAD_CHUNK, total)]
    assert {"phase": "indexing", "indexed": LOAD_CHUNK, "total": total} in seen  # answered mid-load
    assert catalog.progress() == {"phase": "loaded", "indexed": total, "total": total}
    assert len(catalog) == total
