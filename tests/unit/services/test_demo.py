"""``imds serve --demo``'s instance (``imds.services.demo``): written once, not again on every start."""

from __future__ import annotations

import ipaddress

import pytest

from helpers import make_settings, running_app
from imds.models import METADATA, USERDATA, MetadataWrite
from imds.services.demo import DEMO_ADDRESSES, load_demo
from imds.services.records.audit import AuditLog
from imds.store import Store

pytestmark = [pytest.mark.anyio, pytest.mark.stores("memory", "sqlite")]


async def _demo_writes(store: Store, instance_id: str) -> list[tuple[str, str]]:
    return [(entry.event.subject, entry.event.kind) for entry in await AuditLog(store).page(instance_id, 0, 100)]


async def test_a_second_load_writes_nothing_and_a_changed_record_is_restored(db_url: str) -> None:
    """The first start writes both records; an unchanged demo is left alone; only what differs is rewritten."""
    async with running_app(make_settings(db=db_url)) as app:
        records, store = app.services.records, app.services.store
        instance_id, written = await load_demo(records)
        assert written == [METADATA, USERDATA]
        assert await load_demo(records) == (instance_id, [])
        assert await _demo_writes(store, instance_id) == [("demo", METADATA), ("demo", USERDATA)]

        stored = await records.get(METADATA, instance_id)
        assert stored.metadata is not None
        edited = {**stored.metadata, "hostname": "edited"}
        await records.put_metadata(MetadataWrite(instance_id, DEMO_ADDRESSES, edited), subject="someone")
        assert await load_demo(records) == (instance_id, [METADATA])
        assert (await records.get(METADATA, instance_id)).metadata == stored.metadata

        moved = (ipaddress.ip_network("127.0.0.9/32"),)
        await records.put_metadata(MetadataWrite(instance_id, moved, stored.metadata), subject="someone")
        assert await load_demo(records) == (instance_id, [METADATA, USERDATA])
        assert set((await records.get(USERDATA, instance_id)).addresses) == set(DEMO_ADDRESSES)
        assert await load_demo(records) == (instance_id, [])
