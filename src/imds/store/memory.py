"""A complete in-memory ``Store``; nothing survives a restart.

It runs the whole service, and is the reference for the contract tests that also run
against SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

from imds.models import (
    METADATA,
    RECORD_KINDS,
    USERDATA,
    Acknowledgement,
    AuditEntry,
    AuditEvent,
    Change,
    ChangeKey,
    Event,
    Instance,
    JsonObject,
    Network,
    Notice,
    OsRecord,
    ProjectAttributes,
)
from imds.store.interface import StoredInstance, record_kind, stored_form
from imds.store.journal import ADDRESSES, FORGET, OS, PASSWORD, PUT, REMOVE, Group, Journal, Op, notice_op, project_op


@dataclass
class _Row:
    metadata: JsonObject | None = None
    metadata_updated_at: datetime | None = None
    userdata: bytes | None = None
    userdata_updated_at: datetime | None = None
    password: bytes | None = None
    os: OsRecord | None = None  # frozen: shared between copies safely


@dataclass
class _State:
    rows: dict[str, _Row] = field(default_factory=dict)
    holders: dict[Network, str] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)
    audit: list[AuditEntry] = field(default_factory=list)
    projects: dict[str, ProjectAttributes] = field(default_factory=dict)  # frozen values: shared safely
    notices: dict[str, Notice] = field(default_factory=dict)  # frozen values: shared safely
    acks: dict[str, dict[str, Acknowledgement]] = field(default_factory=dict)  # notice id → instance id → ack

    def staged(self) -> _State:
        """A copy a write block works on (values are frozen or copied; the feed's entries are immutable)."""
        return _State(rows=copy.deepcopy(self.rows), holders=dict(self.holders), changes=list(self.changes),
                      audit=list(self.audit), projects=dict(self.projects), notices=dict(self.notices),
                      acks={notice_id: dict(acks) for notice_id, acks in self.acks.items()})


@dataclass
class _Channel:
    """Events and messages; kept apart from ``_State`` so writes do not copy them."""

    events: dict[str, list[Event]] = field(default_factory=dict)
    messages: dict[str, list[tuple[int, bytes]]] = field(default_factory=dict)
    cursor: int = 0


class _MemoryTx:
    def __init__(self, state: _State) -> None:
        self._s = state
        self.journal = Journal(start=_head(state), end=_head(state))

    async def has_record(self, kind: str, instance_id: str) -> bool:
        row = self._s.rows.get(instance_id)
        return row is not None and getattr(row, record_kind(kind)) is not None

    async def metadata_of_many(self, instance_ids: Sequence[str]) -> dict[str, JsonObject]:
        rows = ((instance_id, self._s.rows.get(instance_id)) for instance_id in instance_ids)
        return {i: copy.deepcopy(row.metadata) for i, row in rows if row is not None and row.metadata is not None}

    async def put_records(
        self, metadata: Sequence[tuple[str, JsonObject]], userdata: Sequence[tuple[str, bytes]]
    ) -> None:
        now = datetime.now(UTC)
        for instance_id, document in metadata:
            row = self._s.rows.setdefault(instance_id, _Row())
            row.metadata, row.metadata_updated_at = copy.deepcopy(document), now
            self.journal.ops.append(Op(PUT, instance_id, METADATA, copy.deepcopy(document), now))
        for instance_id, data in userdata:
            row = self._s.rows.setdefault(instance_id, _Row())
            row.userdata, row.userdata_updated_at = bytes(data), now
            self.journal.ops.append(Op(PUT, instance_id, USERDATA, row.userdata, now))

    async def replace_addresses_many(
        self, lists: Sequence[tuple[str, Sequence[Network]]]
    ) -> list[tuple[dict[Network, str], tuple[Network, ...]]]:
        return [self._replace_addresses(instance_id, addresses) for instance_id, addresses in lists]

    def _replace_addresses(
        self, instance_id: str, addresses: Sequence[Network]
    ) -> tuple[dict[Network, str], tuple[Network, ...]]:
        wanted = set(addresses)
        holders = self._s.holders
        dropped = tuple(sorted((a for a, h in holders.items() if h == instance_id and a not in wanted), key=str))
        for address in dropped:
            del holders[address]
        moved = {a: holders[a] for a in addresses if holders.get(a, instance_id) != instance_id}
        for address in wanted:
            holders.pop(address, None)  # the key as written now: an address with a prefix is kept as sent
            holders[address] = instance_id
        self._s.rows.setdefault(instance_id, _Row())
        self.journal.ops.append(Op(ADDRESSES, instance_id, value=tuple(addresses), moved=moved))
        return moved, dropped

    async def remove_record(self, kind: str, instance_id: str) -> bool:
        return self._clear(instance_id, record_kind(kind))

    async def forget_instance(self, instance_id: str) -> None:
        self._s.rows.pop(instance_id, None)
        for address in [a for a, h in self._s.holders.items() if h == instance_id]:
            del self._s.holders[address]
        self.journal.ops.append(Op(FORGET, instance_id))

    async def mark_changed(self, instance_ids: Iterable[ChangeKey]) -> None:
        for instance_id in dict.fromkeys(map(str, instance_ids)):
            seq = _head(self._s) + 1
            self._s.changes.append(Change(seq, instance_id))
            self.journal.end = seq

    async def put_password(self, instance_id: str, password: bytes) -> bool:
        row = self._s.rows[instance_id]
        if row.password is not None:
            return False
        row.password = bytes(password)
        self.journal.ops.append(Op(PUT, instance_id, PASSWORD, row.password))
        return True

    async def remove_password(self, instance_id: str) -> bool:
        return self._clear(instance_id, PASSWORD)

    async def os_of(self, instance_id: str) -> OsRecord | None:
        row = self._s.rows.get(instance_id)
        return None if row is None else row.os

    async def put_os(self, instance_id: str, record: OsRecord) -> None:
        self._s.rows[instance_id].os = record
        self.journal.ops.append(Op(PUT, instance_id, OS, record))

    async def remove_os(self, instance_id: str) -> bool:
        return self._clear(instance_id, OS)

    def _clear(self, instance_id: str, name: str) -> bool:
        """Clear one field of the instance's row (and a record's time); False when it was not set."""
        row = self._s.rows.get(instance_id)
        if row is None or getattr(row, name) is None:
            return False
        setattr(row, name, None)
        if name in RECORD_KINDS:
            setattr(row, f"{name}_updated_at", None)
        self.journal.ops.append(Op(REMOVE, instance_id, name))
        return True

    async def put_project(self, project_id: str, attributes: dict[str, str]) -> ProjectAttributes:
        before = self._s.projects.get(project_id)
        record = ProjectAttributes(project_id, dict(attributes), 1 if before is None else before.revision + 1,
                                   datetime.now(UTC))
        self._s.projects[project_id] = record
        self.journal.ops.append(project_op(project_id, record))
        return record

    async def remove_project(self, project_id: str) -> bool:
        if self._s.projects.pop(project_id, None) is None:
            return False
        self.journal.ops.append(project_op(project_id, None))
        return True

    async def notice_of(self, notice_id: str) -> Notice | None:
        return self._s.notices.get(notice_id)

    async def put_notice(self, notice: Notice) -> None:
        self._s.notices[notice.id] = notice
        self.journal.ops.append(notice_op(notice.id, notice))

    async def remove_notice(self, notice_id: str) -> bool:
        self._s.acks.pop(notice_id, None)
        if self._s.notices.pop(notice_id, None) is None:
            return False
        self.journal.ops.append(notice_op(notice_id, None))
        return True

    async def acknowledge(self, notice_id: str, instance_id: str, at: datetime) -> Acknowledgement:
        acks = self._s.acks.setdefault(notice_id, {})
        return acks.setdefault(instance_id, Acknowledgement(notice_id, instance_id, at))

    async def append_audit(self, event: AuditEvent) -> None:
        await self.append_audit_many([event])

    async def append_audit_many(self, events: Sequence[AuditEvent]) -> None:
        for event in events:
            seq = self._s.audit[-1].seq + 1 if self._s.audit else 1
            self._s.audit.append(AuditEntry(seq, datetime.now(UTC), event))


def _head(state: _State) -> int:
    return state.changes[-1].seq if state.changes else 0


class MemoryStore:
    """Dict-backed store; each write works on a copy that replaces the state on success."""

    def __init__(self) -> None:
        self._state = _State()
        self._lock = asyncio.Lock()
        self._channel = _Channel()

    @asynccontextmanager
    async def write(self) -> AsyncIterator[_MemoryTx]:
        async with self._lock:
            staged = self._state.staged()
            tx = _MemoryTx(staged)
            yield tx
            self._state = staged
            Group(tx.journal.start).add(tx.journal)  # a group of one: memory commits each block alone

    async def changed(self, within: float) -> None:
        """Wait ``within`` seconds: this process's own writes are its only writes."""
        await asyncio.sleep(within)

    def _instance(self, instance_id: str) -> Instance | None:
        row = self._state.rows.get(instance_id)
        if row is None:
            return None
        addresses = tuple(sorted((a for a, h in self._state.holders.items() if h == instance_id), key=str))
        return Instance(
            id=instance_id,
            addresses=addresses,
            metadata=copy.deepcopy(row.metadata),
            metadata_updated_at=row.metadata_updated_at,
            userdata=row.userdata,
            userdata_updated_at=row.userdata_updated_at,
            password=row.password,
            os=row.os,
        )

    async def get(self, instance_id: str) -> Instance | None:
        return self._instance(instance_id)

    async def get_many(self, instance_ids: Iterable[str]) -> dict[str, Instance]:
        found = {i: self._instance(i) for i in instance_ids}
        return {i: inst for i, inst in found.items() if inst is not None}

    async def snapshot(self) -> tuple[list[Instance], int]:
        seq = _head(self._state)
        return list((await self.get_many(list(self._state.rows))).values()), seq

    async def snapshot_chunks(self, size: int) -> AsyncIterator[tuple[list[StoredInstance], int, int]]:
        instances, seq = await self.snapshot()
        for start in range(0, len(instances), size):
            yield [stored_form(instance) for instance in instances[start : start + size]], seq, len(instances)

    async def changes_since(self, seq: int, limit: int = 1000) -> list[Change]:
        return [c for c in self._state.changes if c.seq > seq][:limit]

    async def projects(self, project_ids: Iterable[str] | None = None) -> dict[str, ProjectAttributes]:
        held = self._state.projects
        wanted = held if project_ids is None else project_ids
        return {p: held[p] for p in wanted if p in held}

    async def notices(self, notice_ids: Iterable[str] | None = None) -> dict[str, Notice]:
        held = self._state.notices
        wanted = held if notice_ids is None else notice_ids
        return {n: held[n] for n in wanted if n in held}

    async def acknowledgements(self, notice_ids: Iterable[str]) -> list[Acknowledgement]:
        acks = self._state.acks
        return sorted((a for n in dict.fromkeys(notice_ids) for a in acks.get(n, {}).values()),
                      key=lambda a: (a.at, a.notice_id, a.instance_id))

    async def ping(self) -> None:
        return None

    async def append_event(
        self, instance_id: str, state: str, code: int | None, message: str | None, *, retain: int
    ) -> Event:
        channel = self._channel
        channel.cursor += 1
        event = Event(channel.cursor, instance_id, state, code, message, datetime.now(UTC))
        kept = channel.events.setdefault(instance_id, [])
        kept.append(event)
        del kept[: max(0, len(kept) - retain)]
        return event

    async def events_after(self, instance_id: str, after: int, limit: int) -> list[Event]:
        return [e for e in self._channel.events.get(instance_id, ()) if e.cursor > after][:limit]

    async def latest_event_cursor(self) -> int:
        return self._channel.cursor

    async def queue_message(self, instance_id: str, body: bytes, *, max_queued: int) -> int | None:
        channel = self._channel
        queue = channel.messages.setdefault(instance_id, [])
        if len(queue) >= max_queued:
            return None
        channel.cursor += 1
        queue.append((channel.cursor, bytes(body)))
        return channel.cursor

    async def take_message(self, instance_id: str) -> bytes | None:
        queue = self._channel.messages.get(instance_id)
        return queue.pop(0)[1] if queue else None

    async def audit(self, instance_id: str | None, after: int, limit: int) -> list[AuditEntry]:
        chosen = (e for e in self._state.audit if e.seq > after and instance_id in {None, e.event.instance_id})
        return list(itertools.islice(chosen, limit))

    async def close(self) -> None:
        return None
