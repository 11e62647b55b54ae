"""The audit log: who changed which instance, how, and which addresses moved from whom.

Events are built here and appended by the write itself, inside its transaction
(``services/records/upsert.py``, ``services/ganeti/records.py``), so an acknowledged change always has
its entry and a failed one never does. An event holds facts, never values: no document,
userdata, password or OS parameter value (private or secret) ever reaches the log.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from imds.errors import InvalidInput, RecordNotFound
from imds.models import AuditEntry, AuditEvent, Network
from imds.services.catalog.addresses import display
from imds.store.interface import Store, WriteTx
from imds.store.journal import Journal

WRITE, DELETE = "write", "delete"
MAX_LIMIT = 1000


def write_event(  # noqa: PLR0913 - the facts of one write, all keyword-only
    *, subject: str, instance_id: str, kind: str, addresses: Sequence[Network] = (),
    moved: Mapping[Network, str] | None = None, dropped: Sequence[Network] = (), reason: str | None = None,
    facts: Mapping[str, Any] | None = None,
) -> AuditEvent:
    """An applied (``reason`` None) or refused-as-stale write of ``kind``."""
    detail: dict[str, Any] = {
        "addresses": len(addresses),
        "moved": {display(a): held_by for a, held_by in (moved or {}).items()},
        "dropped": [display(a) for a in dropped],
        **(facts or {}),
    }
    if reason is not None:
        detail["reason"] = reason
    return AuditEvent(subject, instance_id, WRITE, kind, reason is None, detail)


def delete_event(*, subject: str, instance_id: str, kind: str, **facts: Any) -> AuditEvent:
    """A deletion of one record kind."""
    return AuditEvent(subject, instance_id, DELETE, kind, applied=True, detail=dict(facts))


async def remove_record(
    store: Store, instance_id: str, kind: str, remove: Callable[[WriteTx], Awaitable[bool]], *, subject: str,
) -> Journal:
    """Remove the instance's ``kind`` record with ``remove`` in one write, with its feed and audit entries.

    RecordNotFound (nothing written) when ``remove`` finds none; else the write's journal, for the catalog.
    """
    async with store.write() as tx:
        if not await remove(tx):
            raise RecordNotFound(kind, instance_id)
        await tx.mark_changed([instance_id])
        await tx.append_audit(delete_event(subject=subject, instance_id=instance_id, kind=kind))
    return tx.journal


class AuditLog:
    """Reads the audit log page by page (cursor: the last ``seq`` seen)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def page(self, instance_id: str | None, after: int, limit: int) -> list[AuditEntry]:
        """Entries after ``after``, oldest first; InvalidInput for a negative cursor or a limit out of range."""
        if after < 0:
            raise InvalidInput.one("after", "must be 0 or a cursor returned as next")
        if not 1 <= limit <= MAX_LIMIT:
            raise InvalidInput.one("limit", f"must be from 1 to {MAX_LIMIT}")
        return await self._store.audit(instance_id, after, limit)
