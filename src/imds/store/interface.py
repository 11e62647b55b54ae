"""The storage protocol that ``imds.services`` owns and the stores implement.

A store holds primitives only; the rules (full IP lists, last write wins, the staleness
guard, delete semantics) live in ``imds.services.records.upsert`` and run inside ``write()``.

Every ``write()`` block is all-or-nothing: it is serialised against every other writer
(across processes too), durable when the block exits, and leaves nothing behind if the
block raises. A store may commit blocks that wait at the same moment together (group
commit: one transaction, one fsync); a block that raises still leaves the others intact,
and no block exits before its commit. Each block that changes an instance appends to the
change feed, whose sequence numbers become visible in increasing order; ``tx.journal``
says what the block did (see ``imds.store.journal``).

All methods raise ``imds.errors.StoreUnavailable`` when the database fails.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import NamedTuple, Protocol, runtime_checkable

from imds.errors import InvalidInput
from imds.models import (
    RECORD_KINDS,
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
from imds.store.journal import Journal


class StoredInstance(NamedTuple):
    """An instance as the store holds it, for the catalog's start-up load (``snapshot_chunks``).

    ``addresses`` are the stored texts (``str(network)``, sorted), ``document`` the metadata
    document's stored JSON text, unparsed: it was validated when written, and the catalog
    keeps it compressed until an instance is first read.
    """

    id: str
    addresses: list[str]
    document: str | None
    metadata_updated_at: datetime | None = None
    userdata: bytes | None = None
    userdata_updated_at: datetime | None = None
    password: bytes | None = None
    os: OsRecord | None = None


def stored_form(instance: Instance) -> StoredInstance:
    """``instance`` as ``snapshot_chunks`` yields it."""
    document = None if instance.metadata is None else json.dumps(instance.metadata)
    return StoredInstance(
        instance.id, sorted(str(network) for network in instance.addresses), document,
        instance.metadata_updated_at, instance.userdata, instance.userdata_updated_at, instance.password, instance.os,
    )


@runtime_checkable
class WriteTx(Protocol):
    """The operations available inside one write transaction: exactly those the services call.

    Records and addresses are written in batch form (one statement per step for many
    instances; a batch of one is a single write): the results are those of applying the
    items one after another, in order.
    """

    journal: Journal  # what this block did, complete once the block has exited

    async def has_record(self, kind: str, instance_id: str) -> bool:
        """Whether a ``metadata`` or ``userdata`` record exists for the instance (another kind: InvalidInput)."""
        ...

    async def holds_instances(self) -> bool:
        """Whether any instance is stored, as this block sees it (an import into an empty store compares nothing)."""
        ...

    async def metadata_of_many(self, instance_ids: Sequence[str]) -> dict[str, JsonObject]:
        """The stored metadata documents of those instances that have one."""
        ...

    async def put_records(
        self, metadata: Sequence[tuple[str, JsonObject]], userdata: Sequence[tuple[str, bytes]]
    ) -> None:
        """Create or replace each (instance, record) pair's record, creating the instance if needed.

        The last pair for an id wins.
        """
        ...

    async def replace_addresses_many(
        self, lists: Sequence[tuple[str, Sequence[Network]]]
    ) -> list[tuple[dict[Network, str], tuple[Network, ...]]]:
        """Make each (instance, addresses) the instance's whole address list, in order; each one's (moved, dropped).

        Addresses held by other instances move to this one (creating it if needed): ``moved``
        maps each taken address to its previous holder, ``dropped`` lists the instance's
        former addresses that are no longer listed.
        """
        ...

    async def remove_record(self, kind: str, instance_id: str) -> bool:
        """Delete one record type (``metadata`` or ``userdata``; another kind: InvalidInput); False when absent."""
        ...

    async def forget_instance(self, instance_id: str) -> None:
        """Remove the instance and its addresses (called when no record type remains)."""
        ...

    async def mark_changed(self, instance_ids: Iterable[ChangeKey]) -> None:
        """Append one change-feed entry per key: an instance id, or a ``ProjectKey``."""
        ...

    async def put_password(self, instance_id: str, password: bytes) -> bool:
        """Store the instance's password unless one is set; False (nothing changes) when one is.

        The instance must exist (the caller checks ``has_record`` first).
        """
        ...

    async def remove_password(self, instance_id: str) -> bool:
        """Delete the instance's password; False when it had none."""
        ...

    async def os_of(self, instance_id: str) -> OsRecord | None:
        """The stored Ganeti OS record, or None."""
        ...

    async def put_os(self, instance_id: str, record: OsRecord) -> None:
        """Create or replace the OS record. The instance must exist (the caller checks)."""
        ...

    async def remove_os(self, instance_id: str) -> bool:
        """Delete the OS record; False when there was none."""
        ...

    async def put_project(self, project_id: str, attributes: dict[str, str]) -> ProjectAttributes:
        """Create or replace the project's attributes (its revision one higher); journals the record stored."""
        ...

    async def remove_project(self, project_id: str) -> bool:
        """Delete the project's attributes; False when it had none."""
        ...

    async def notice_of(self, notice_id: str) -> Notice | None:
        """The stored notice, or None."""
        ...

    async def put_notice(self, notice: Notice) -> None:
        """Create or replace the notice as given (the caller sets its revision and times); journals it."""
        ...

    async def remove_notice(self, notice_id: str) -> bool:
        """Delete the notice and its acknowledgements; False when there was none."""
        ...

    async def acknowledge(self, notice_id: str, instance_id: str, at: datetime) -> Acknowledgement:
        """Record the instance's acknowledgement of a stored notice unless it has one; the one stored (the first)."""
        ...

    async def append_audit(self, event: AuditEvent) -> None:
        """Record an admin change in the audit log, in this transaction."""
        ...

    async def append_audit_many(self, events: Sequence[AuditEvent]) -> None:
        """``append_audit`` for each event, in order (one statement)."""
        ...


def record_kind(kind: str) -> str:
    """``kind`` when it names a record type a store keeps (``metadata``, ``userdata``); InvalidInput otherwise.

    A store never guesses: an unknown kind is a caller's mistake, not a table to fall back to.
    """
    if kind not in RECORD_KINDS:
        raise InvalidInput.one("kind", f"unknown record kind {kind!r}: expected one of {', '.join(RECORD_KINDS)}")
    return kind


@runtime_checkable
class Store(Protocol):
    """Where canonical records live. ``memory.MemoryStore`` and ``sql.SqlStore`` implement it."""

    def write(self) -> AbstractAsyncContextManager[WriteTx]:
        """Open one serialised, durable write transaction."""
        ...

    async def get(self, instance_id: str) -> Instance | None:
        """One instance with both record types and its addresses, or None."""
        ...

    async def get_many(self, instance_ids: Iterable[str]) -> dict[str, Instance]:
        """The instances that exist among ``instance_ids``, by id."""
        ...

    async def snapshot(self) -> tuple[list[Instance], int]:
        """Every instance, and the change-feed position the snapshot is consistent with."""
        ...

    def snapshot_chunks(self, size: int) -> AsyncIterator[tuple[list[StoredInstance], int, int]]:
        """``snapshot`` streamed in stored form: (up to ``size`` instances, the position, the total) at a time.

        One read transaction for the whole stream (a snapshot: REPEATABLE READ on
        PostgreSQL), so the chunks together are one consistent snapshot; a million
        instances never sit in one list, and no document is parsed.
        """
        ...

    async def changes_since(self, seq: int, limit: int = 1000) -> list[Change]:
        """Change-feed entries after ``seq``, oldest first."""
        ...

    async def projects(self, project_ids: Iterable[str] | None = None) -> dict[str, ProjectAttributes]:
        """The attributes of these projects (every project's with None) that exist, by project id."""
        ...

    async def notices(self, notice_ids: Iterable[str] | None = None) -> dict[str, Notice]:
        """These notices (every notice with None) that exist, by id."""
        ...

    async def acknowledgements(self, notice_ids: Iterable[str]) -> list[Acknowledgement]:
        """The acknowledgements of these notices, oldest first."""
        ...

    async def changed(self, within: float) -> None:
        """Return when the change feed may have advanced, or after ``within`` seconds.

        PostgreSQL wakes on ``NOTIFY`` from any replica's commit; other stores simply wait
        (followers then poll). Never raises.
        """
        ...

    async def ping(self) -> None:
        """Return when the store answers; raise StoreUnavailable otherwise."""
        ...

    # --- the instance<->host channel (events up, messages down); see imds.services.channel ---

    async def append_event(
        self, instance_id: str, state: str, code: int | None, message: str | None, *, retain: int
    ) -> Event:
        """Store one event; keep only the instance's newest ``retain``.

        Cursors of one instance increase in commit order, also with concurrent writers.
        """
        ...

    async def events_after(self, instance_id: str, after: int, limit: int) -> list[Event]:
        """The instance's events with a cursor above ``after``, oldest first."""
        ...

    async def latest_event_cursor(self) -> int:
        """The highest cursor of any event (0 when there is none); what a follower watches."""
        ...

    async def queue_message(self, instance_id: str, body: bytes, *, max_queued: int) -> int | None:
        """Queue a message for the instance; its id, or None when ``max_queued`` are waiting."""
        ...

    async def take_message(self, instance_id: str) -> bytes | None:
        """Remove and return the instance's oldest message in one transaction (exactly once), or None."""
        ...

    async def audit(self, instance_id: str | None, after: int, limit: int) -> list[AuditEntry]:
        """Audit entries with ``seq > after`` (of one instance, or all), oldest first, at most ``limit``."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...
