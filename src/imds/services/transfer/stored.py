"""Whole records in one store, read out and written back: what ``imds export`` reads and ``imds import`` writes.

``StoredRecords`` binds a store to the rules of a write (``Records``, ``OsRecords``,
``NoticeRecords``). The admin API (``GET|POST /device-records``) is handed the one
``imds.app.build_services`` builds; the commands that run without a server get theirs
through ``imds.services.offline`` (the same reads, the same writes)::

    instance = await stored.get("7d0ab2bc-3a53-4d5e-8f44-2b2b9c1f6a10")
    results = await stored.upsert(items, subject="imds-cli")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from imds.models import Instance
from imds.services.ganeti.records import OsRecords
from imds.services.notices.records import NoticeRecords
from imds.services.notices.wire import notice_wire
from imds.services.records.upsert import Records
from imds.services.transfer.bulk import Block, Item, Result, apply_batch
from imds.services.transfer.readout import InstanceNotStored
from imds.store import Store


class StoredRecords:
    """Every stored instance and notice, read whole, and batches of upserts compared with them and written."""

    def __init__(self, store: Store, records: Records, os: OsRecords, notices: NoticeRecords) -> None:
        self.store = store
        self.records = records
        self.os = os
        self.notices = notices

    async def get(self, instance_id: str) -> Instance:
        """The stored instance (both record types, addresses), or InstanceNotStored."""
        instance = await self.store.get(instance_id)
        if instance is None:
            raise InstanceNotStored(instance_id)
        return instance

    async def all(self) -> list[Instance]:
        """Every stored instance, by id (one consistent snapshot)."""
        instances, _position = await self.store.snapshot()
        return sorted(instances, key=lambda instance: instance.id)

    async def all_notices(self) -> list[dict[str, Any]]:
        """Every stored notice as ``imds export`` writes it (``{"notice": {...}}``), oldest first."""
        return [{"notice": notice_wire(notice, acks)} for notice, acks in await self.notices.find()]

    async def upsert(
        self, items: Sequence[Item], *, subject: str, dry_run: bool = False, block: Block | None = None,
    ) -> list[Result]:
        """Compare and write one batch (see ``imds.services.transfer.bulk``), in ``block`` when given."""
        return await apply_batch(self.records, self.store, items, subject=subject, dry_run=dry_run,
                                 os_records=self.os, notices=self.notices, block=block)
