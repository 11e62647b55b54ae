"""``SqlTx``: the ``WriteTx`` protocol inside a (possibly shared) SQL write transaction.

Fewer statements than one per primitive: instance rows are created with an upsert and
remembered, records are upserted a batch at a time, an address list is read in one
query, and change-feed and audit rows are written by the group's commit (one insert
each for the whole group; see ``group``).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from imds.models import (
    METADATA,
    USERDATA,
    Acknowledgement,
    AuditEvent,
    ChangeKey,
    JsonObject,
    Network,
    Notice,
    OsRecord,
    ProjectAttributes,
    network_key,
    stored_network,
)
from imds.store.interface import record_kind
from imds.store.journal import ADDRESSES, FORGET, OS, PASSWORD, PUT, REMOVE, Journal, Op, notice_op, project_op
from imds.store.sql import notices, projects, statements, tables
from imds.store.sql.os_rows import os_document, os_record
from imds.store.sql.rows import chunks
from imds.store.sql.writeconn import WriteConnection

_RECORD_TABLES = {METADATA: tables.instance_metadata, USERDATA: tables.instance_userdata}


@dataclass(frozen=True)
class _AddressRows:
    """What a batch of address lists does to the address rows: deletes, holder moves and inserts (by address)."""

    gone: list[str]
    moved: list[dict[str, str]]
    new: list[dict[str, str]]


def _replay_address_lists(
    before: Sequence[tuple[str, str]], lists: Sequence[tuple[str, Sequence[Network]]]
) -> tuple[_AddressRows, list[tuple[dict[Network, str], tuple[Network, ...]]]]:
    """The address lists applied in order in memory, one holder per network (``models.network_key``).

    ``before``: the (address, holder) rows the batch touches. Returns the row changes and each
    list's (moved, dropped). Another spelling of a network moves it like the same spelling.
    """
    owners: dict[str, tuple[str, str]] = {}  # network → (address as stored, holder)
    holding: dict[str, set[str]] = {}  # holder → its networks
    for address, holder in before:  # rows sharing a network (left by older revisions): the last row found
        key = network_key(stored_network(address))
        owners[key] = (address, holder)
        holding.setdefault(holder, set()).add(key)
    results: list[tuple[dict[Network, str], tuple[Network, ...]]] = []
    for instance_id, addresses in lists:
        wanted = {network_key(a): a for a in addresses}
        mine = holding.setdefault(instance_id, set())
        dropped = sorted((owners.pop(key)[0] for key in mine - wanted.keys()), key=str)
        mine.intersection_update(wanted.keys())
        moved: dict[Network, str] = {}
        for key, network in wanted.items():
            previous = owners.get(key)
            if previous is not None and previous[1] != instance_id:
                moved[network] = previous[1]
                holding[previous[1]].discard(key)
            owners[key] = (str(network), instance_id)
            mine.add(key)
        results.append((moved, tuple(stored_network(a) for a in dropped)))
    final = dict(owners.values())
    held = dict(before)
    rows = _AddressRows(
        gone=[address for address in held if address not in final],
        moved=[{"key": a, "holder": final[a]} for a, holder in held.items() if a in final and final[a] != holder],
        new=[{"address": a, "network": network_key(stored_network(a)), "instance_id": holder}
             for a, holder in final.items() if a not in held],
    )
    return rows, results


SPILL_ROWS = 20_000  # feed and audit rows a block holds before it sends them (a long block: an import)


class SqlTx:
    """One write block inside a (possibly shared) transaction; ``seq`` is the feed head so far.

    ``journaled=False``: a store whose writes no catalog in this process replays (the offline
    commands) keeps no journal of them, so a long block (a whole import) holds no copy of
    what it wrote. Feed and audit rows wait for the group's commit, or are sent within the
    transaction once a block holds ``SPILL_ROWS`` of them: a block's memory stays bounded.
    """

    def __init__(self, conn: WriteConnection, seq: int, *, journaled: bool = True) -> None:
        self.conn = conn
        self.seq = seq
        self.journal = Journal(start=seq, end=seq, keeps=journaled)
        self.feed_rows: list[dict[str, Any]] = []
        self.audit_rows: list[dict[str, Any]] = []
        self._known: set[str] = set()  # instance rows known to exist in this transaction
        self._dialect = conn.dialect.name
        self._insert = pg_insert if self._dialect == "postgresql" else sqlite_insert

    async def has_record(self, kind: str, instance_id: str) -> bool:
        table = _RECORD_TABLES[record_kind(kind)]
        row = await self.conn.execute(sa.select(table.c.instance_id).where(table.c.instance_id == instance_id))
        found = row.first() is not None
        if found:
            self._known.add(instance_id)
        return found

    async def metadata_of_many(self, instance_ids: Sequence[str]) -> dict[str, JsonObject]:
        documents: dict[str, JsonObject] = {}
        for chunk in chunks(list(dict.fromkeys(instance_ids))):
            rows = await self.conn.execute(statements.documents_of(self._dialect), {"ids": list(chunk)})
            documents.update({row.instance_id: row.document for row in rows})
        self._known.update(documents)  # a metadata row means the instance row exists
        return documents

    async def put_records(
        self, metadata: Sequence[tuple[str, JsonObject]], userdata: Sequence[tuple[str, bytes]]
    ) -> None:
        if self._dialect != "postgresql":  # PostgreSQL's upserts insert the instance rows themselves
            await self._ensure_instances([i for i, _ in metadata] + [i for i, _ in userdata])
        at = await self._put_many(tables.instance_metadata, "document", dict(metadata))
        if self.journal.keeps:
            self.journal.ops += [Op(PUT, i, METADATA, copy.deepcopy(document), at) for i, document in metadata]
        at = await self._put_many(tables.instance_userdata, "userdata", dict(userdata))
        if self.journal.keeps:
            self.journal.ops += [Op(PUT, i, USERDATA, bytes(data), at) for i, data in userdata]

    async def replace_addresses_many(
        self, lists: Sequence[tuple[str, Sequence[Network]]]
    ) -> list[tuple[dict[Network, str], tuple[Network, ...]]]:
        ids = list(dict.fromkeys(instance_id for instance_id, _ in lists))
        await self._ensure_instances(ids)
        before: dict[str, str] = {}  # address → holder, for every row this batch touches
        every = [a for _, addresses in lists for a in addresses]
        networks = list(dict.fromkeys(network_key(a) for a in every))
        spellings = list(dict.fromkeys(str(a) for a in every))  # rows of older replicas have no network
        # One query per chunk finds the batch's instances' rows and the wanted networks' holders.
        parts = itertools.zip_longest(chunks(ids), chunks(networks), chunks(spellings), fillvalue=())
        for number, (id_chunk, network_chunk, address_chunk) in enumerate(parts):
            if number:
                await asyncio.sleep(0)  # SQLite runs these on the event loop: let reads in between chunks
            rows = await self.conn.execute(statements.addresses_touched(self._dialect), {
                "ids": list(id_chunk), "networks": list(network_chunk), "addresses": list(address_chunk)})
            before.update({row.address: row.instance_id for row in rows})
        changes, results = _replay_address_lists(list(before.items()), lists)
        for chunk in chunks(changes.gone):
            await self.conn.execute(statements.drop_addresses(self._dialect), {"addresses": list(chunk)})
        if changes.moved:
            await self.conn.execute(statements.MOVE_ADDRESS, changes.moved)
        if changes.new:
            await self.conn.execute(statements.ADD_ADDRESSES, changes.new)
        for (instance_id, addresses), (moved_from, _) in zip(lists, results, strict=True):
            wanted = tuple({str(a): a for a in addresses}.values())
            self._note(Op(ADDRESSES, instance_id, value=wanted, moved=moved_from))
        return results

    async def remove_record(self, kind: str, instance_id: str) -> bool:
        return await self._remove(_RECORD_TABLES[record_kind(kind)], instance_id, kind)

    async def forget_instance(self, instance_id: str) -> None:
        await self.conn.execute(
            tables.instance_ip_addresses.delete().where(tables.instance_ip_addresses.c.instance_id == instance_id)
        )
        await self.remove_password(instance_id)  # the foreign key cascades too; this does not rely on it
        await self.remove_os(instance_id)
        await self.conn.execute(tables.instances.delete().where(tables.instances.c.id == instance_id))
        self._known.discard(instance_id)
        self._note(Op(FORGET, instance_id))

    async def mark_changed(self, instance_ids: Iterable[ChangeKey]) -> None:
        # The rows are inserted when the group commits (one insert), so a block that
        # raises later leaves none behind (nor does one that spilled: its savepoint goes).
        for instance_id in dict.fromkeys(map(str, instance_ids)):
            self.seq += 1
            self.feed_rows.append({"seq": self.seq, "instance_id": instance_id})
        self.journal.end = self.seq
        await self._spill_when_full()

    async def put_password(self, instance_id: str, password: bytes) -> bool:
        t = tables.instance_passwords
        held = await self.conn.execute(sa.select(t.c.instance_id).where(t.c.instance_id == instance_id))
        if held.first() is not None:
            return False
        await self.conn.execute(
            t.insert().values(instance_id=instance_id, password=password, updated_at=datetime.now(UTC))
        )
        self._note(Op(PUT, instance_id, PASSWORD, bytes(password)))
        return True

    async def remove_password(self, instance_id: str) -> bool:
        return await self._remove(tables.instance_passwords, instance_id, PASSWORD)

    async def os_of(self, instance_id: str) -> OsRecord | None:
        t = tables.instance_os
        row = await self.conn.execute(sa.select(t.c.document).where(t.c.instance_id == instance_id))
        document: JsonObject | None = row.scalar_one_or_none()
        return None if document is None else os_record(document)

    async def put_os(self, instance_id: str, record: OsRecord) -> None:
        t, document = tables.instance_os, os_document(record)
        await self._ensure_instance(instance_id)
        values = {"document": document, "updated_at": datetime.now(UTC)}
        statement = self._insert(t).values(instance_id=instance_id, **values)
        await self.conn.execute(statement.on_conflict_do_update(index_elements=[t.c.instance_id], set_=values))
        if self.journal.keeps:
            self._note(Op(PUT, instance_id, OS, os_record(copy.deepcopy(document))))

    async def remove_os(self, instance_id: str) -> bool:
        return await self._remove(tables.instance_os, instance_id, OS)

    async def put_project(self, project_id: str, attributes: dict[str, str]) -> ProjectAttributes:
        record = await projects.put(self.conn, project_id, attributes)
        self._note(project_op(project_id, record))
        return record

    async def remove_project(self, project_id: str) -> bool:
        removed = await projects.remove(self.conn, project_id)
        if removed:
            self._note(project_op(project_id, None))
        return removed

    async def notice_of(self, notice_id: str) -> Notice | None:
        return await notices.one(self.conn, notice_id)

    async def put_notice(self, notice: Notice) -> None:
        await notices.put(self.conn, notice)
        self._note(notice_op(notice.id, notice))

    async def remove_notice(self, notice_id: str) -> bool:
        removed = await notices.remove(self.conn, notice_id)
        if removed:
            self._note(notice_op(notice_id, None))
        return removed

    async def acknowledge(self, notice_id: str, instance_id: str, at: datetime) -> Acknowledgement:
        return await notices.acknowledge(self.conn, notice_id, instance_id, at)

    async def append_audit(self, event: AuditEvent) -> None:
        await self.append_audit_many([event])

    async def append_audit_many(self, events: Sequence[AuditEvent]) -> None:
        # Inserted by the group's commit, in this transaction, with the other blocks' rows.
        now = datetime.now(UTC)
        self.audit_rows += [
            {"at": now, "subject": e.subject, "instance_id": e.instance_id, "action": e.action, "kind": e.kind,
             "applied": e.applied, "detail": e.detail}
            for e in events
        ]
        await self._spill_when_full()

    # --- helpers -----------------------------------------------------------------------

    def _note(self, op: Op) -> None:
        """Journal one operation (unless this store keeps no journal)."""
        if self.journal.keeps:
            self.journal.ops.append(op)

    async def _spill_when_full(self) -> None:
        """Send the feed and audit rows held so far, in this transaction, once there are ``SPILL_ROWS``."""
        if len(self.feed_rows) + len(self.audit_rows) < SPILL_ROWS:
            return
        if self.feed_rows:
            await self.conn.execute(statements.FEED_ROWS, self.feed_rows)
        if self.audit_rows:
            await self.conn.execute(statements.AUDIT_ROWS, self.audit_rows)
        self.feed_rows, self.audit_rows = [], []

    async def _remove(self, table: sa.Table, instance_id: str, name: str) -> bool:
        """Delete the instance's row of ``table`` and journal clearing ``name``; False when there was none."""
        result = await self.conn.execute(table.delete().where(table.c.instance_id == instance_id))
        if result.rowcount:
            self._note(Op(REMOVE, instance_id, name))
        return bool(result.rowcount)

    async def _ensure_instance(self, instance_id: str) -> None:
        if instance_id in self._known:
            return
        await self.conn.execute(self._insert(tables.instances).values(id=instance_id).on_conflict_do_nothing())
        self._known.add(instance_id)

    async def _ensure_instances(self, instance_ids: Iterable[str]) -> None:
        ids = [i for i in dict.fromkeys(instance_ids) if i not in self._known]
        if ids:  # one statement: the rows that exist already are left alone
            await self.conn.execute(statements.ensure_instances(self._dialect), [{"id": i} for i in ids])
        self._known.update(ids)

    async def _put_many(self, table: sa.Table, column: str, values: dict[str, Any]) -> datetime:
        now = datetime.now(UTC)
        if values and self._dialect == "postgresql":  # one statement: the instance rows and the records
            new = [i for i in values if i not in self._known]
            await self.conn.execute(statements.PG_UPSERT_RECORDS[table.name],
                                    statements.pg_upsert_records(new, values, now))
            self._known.update(new)
        elif values:  # one upsert for the whole batch
            await self.conn.execute(statements.upsert_record(self._dialect, table.name),
                                    [{"instance_id": i, column: v, "updated_at": now} for i, v in values.items()])
        return now
