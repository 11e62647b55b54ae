"""A complete in-memory ``Store``; nothing survives a restart.

It runs the whole service, and is the reference for the contract tests that also run
against SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

from imds.models import METADATA, USERDATA, Change, Instance, JsonObject, Network, OsRecord
from imds.store.journal import ADDRESSES, FORGET, PUT, REMOVE, Journal, Op


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


class _MemoryTx:
    def __init__(self, state: _State) -> None:
        self._s = state
        self.journal = Journal(start=_head(state), end=_head(state))
        self.journal.group.append(self.journal)

    async def metadata_of(self, instance_id: str) -> JsonObject | None:
        row = self._s.rows.get(instance_id)
        return copy.deepcopy(row.metadata) if row else None

    async def has_record(self, kind: str, instance_id: str) -> bool:
        row = self._s.rows.get(instance_id)
        if row is None:
            return False
        return (row.metadata if kind == METADATA else row.userdata) is not None

    async def put_metadata(self, instance_id: str, document: JsonObject) -> None:
        row = self._s.rows.setdefault(instance_id, _Row())
        row.metadata = copy.deepcopy(document)
        row.metadata_updated_at = datetime.now(UTC)
        self.journal.ops.append(Op(PUT, instance_id, METADATA, copy.deepcopy(document), row.metadata_updated_at))

    async def put_userdata(self, instance_id: str, userdata: bytes) -> None:
        row = self._s.rows.setdefault(instance_id, _Row())
        row.userdata = bytes(userdata)
        row.userdata_updated_at = datetime.now(UTC)
        self.journal.ops.append(Op(PUT, instance_id, USERDATA, row.userdata, row.userdata_updated_at))

    async def remove_record(self, kind: str, instance_id: str) -> bool:
        if not await self.has_record(kind, instance_id):
            return False
        row = self._s.rows[instance_id]
        if kind == METADATA:
            row.metadata, row.metadata_updated_at = None, None
        else:
            row.userdata, row.userdata_updated_at = None, None
        self.journal.ops.append(Op(REMOVE, instance_id, kind))
        return True

    async def replace_addresses(
        self, instance_id: str, addresses: Sequence[Network]
    ) -> tuple[dict[Network, str], tuple[Network, ...]]:
        wanted = set(addresses)
        holders = self._s.holders
        dropped = tuple(sorted((a for a, h in holders.items() if h == instance_id and a not in wanted), key=str))
        for address in dropped:
            del holders[address]
        moved = {a: holders[a] for a in addresses if holders.get(a, instance_id) != instance_id}
        for address in wanted:
            holders[address] = instance_id
        self._s.rows.setdefault(instance_id, _Row())
        self.journal.ops.append(Op(ADDRESSES, instance_id, value=tuple(addresses), moved=moved))
        return moved, dropped

    async def forget_instance(self, instance_id: str) -> None:
        self._s.rows.pop(instance_id, None)
        for address in [a for a, h in self._s.holders.items() if h == instance_id]:
            del self._s.holders[address]
        self.journal.ops.append(Op(FORGET, instance_id))

    async def mark_changed(self, instance_ids: Iterable[str]) -> None:
        for instance_id in dict.fromkeys(instance_ids):
            seq = _head(self._s) + 1
            self._s.changes.append(Change(seq, instance_id))
            self.journal.end = seq

    async def put_password(self, instance_id: str, password: bytes) -> bool:
        row = self._s.rows[instance_id]
        if row.password is not None:
            return False
        row.password = bytes(password)
        self.journal.ops.append(Op(PUT, instance_id, "password", row.password))
        return True

    async def remove_password(self, instance_id: str) -> bool:
        row = self._s.rows.get(instance_id)
        if row is None or row.password is None:
            return False
        row.password = None
        self.journal.ops.append(Op(REMOVE, instance_id, "password"))
        return True

    async def os_of(self, instance_id: str) -> OsRecord | None:
        row = self._s.rows.get(instance_id)
        return None if row is None else row.os

    async def put_os(self, instance_id: str, record: OsRecord) -> None:
        self._s.rows[instance_id].os = record
        self.journal.ops.append(Op(PUT, instance_id, "os", record))

    async def remove_os(self, instance_id: str) -> bool:
        row = self._s.rows.get(instance_id)
        if row is None or row.os is None:
            return False
        row.os = None
        self.journal.ops.append(Op(REMOVE, instance_id, "os"))
        return True


def _head(state: _State) -> int:
    return state.changes[-1].seq if state.changes else 0


class MemoryStore:
    """Dict-backed store; each write works on a copy that replaces the state on success."""

    def __init__(self) -> None:
        self._state = _State()
        self._lock = asyncio.Lock()

    @asynccontextmanager
    async def write(self) -> AsyncIterator[_MemoryTx]:
        async with self._lock:
            s = self._state  # the feed's entries are immutable: copying the list is enough
            staged = _State(copy.deepcopy(s.rows), dict(s.holders), list(s.changes))
            tx = _MemoryTx(staged)
            yield tx
            self._state = staged

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

    async def changes_since(self, seq: int, limit: int = 1000) -> list[Change]:
        return [c for c in self._state.changes if c.seq > seq][:limit]

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None
