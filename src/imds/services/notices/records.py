"""Lifecycle notices: the rules of a write, the guests' acknowledgements, and reading them back.

Each write (create, change, delete) is one store block with its change-feed entry
(``notice:<id>``) and its audit entry (the notice's kind, scope, target, state and revision:
facts, never free text); the catalog applies it before the caller hears back, and other
replicas follow the feed. A notice of a single instance needs that instance stored.

- A change names only what changes (``imds.services.notices.wire``); the notice keeps its
  rules (a maintenance window, a lifecycle target state) or nothing is written. A canceled or
  completed notice is history: it changes no more (Conflict), though it may be deleted.
- A guest acknowledges a notice that reaches it and is still current by posting the channel
  event ``{"state": "notice-ack", "message": "<notice id>"}`` (``imds.services.channel``); the
  first acknowledgement of each instance is kept and the admin API shows it, as Azure's
  ``StartRequests`` does for scheduled events. The event is stored in the instance's stream too.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from imds import log
from imds.errors import Conflict, InvalidInput, NotFound
from imds.models import (
    FACILITY_SCOPE,
    INSTANCE_SCOPE,
    NOTICE_KIND,
    PROJECT_SCOPE,
    Acknowledgement,
    AuditEvent,
    Notice,
    NoticeDraft,
    NoticeKey,
)
from imds.services.catalog.catalog import Catalog
from imds.services.notices.wire import FINAL, parse_notice_id, rules
from imds.services.records.audit import DELETE, WRITE
from imds.services.render.gce import facility_of, project_of
from imds.services.render.timeline import HISTORY, status
from imds.store.interface import Store

_log = log.get("notices")


def new_notice_id() -> str:
    """17 random hex digits (EC2 shows ``instance-event-`` and these)."""
    return secrets.token_hex(9)[:17]


def _event(subject: str, notice: Notice, action: str) -> AuditEvent:
    detail = {"kind": notice.kind, "scope": notice.scope, "target": notice.target, "state": notice.state,
              "revision": notice.revision}
    return AuditEvent(subject, str(NoticeKey(notice.id)), action, NOTICE_KIND, applied=True, detail=detail)


def reaches(notice: Notice, instance_id: str, document: dict[str, Any]) -> bool:
    """Whether ``notice`` is for this instance (itself, its project or its facility)."""
    if notice.scope == INSTANCE_SCOPE:
        return notice.target == instance_id
    if notice.scope == PROJECT_SCOPE:
        return notice.target == project_of(document).id
    return notice.scope == FACILITY_SCOPE and notice.target == facility_of(document)


class NoticeRecords:
    """Create, change, delete, read and acknowledge notices."""

    def __init__(self, store: Store, catalog: Catalog, *, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._catalog = catalog
        self._clock = clock

    def now(self) -> datetime:
        """The clock's moment (to the second, as notices keep times)."""
        return datetime.fromtimestamp(self._clock(), UTC).replace(microsecond=0)

    async def create(self, draft: NoticeDraft, *, subject: str) -> Notice:
        """Store a new notice; NotFound when it is for an instance that is not stored."""
        if draft.scope == INSTANCE_SCOPE and await self._store.get(draft.target) is None:
            raise NotFound(f"no instance {draft.target} is stored")
        now = self.now()
        notice = Notice.of(draft, id=new_notice_id(), created_at=now, updated_at=now)
        await self._write(notice, subject=subject)
        return notice

    async def change(self, notice_id: str, changes: dict[str, Any], *, subject: str) -> Notice:
        """Apply ``changes`` to a stored notice (its revision one higher); NotFound, Conflict or InvalidInput."""
        async with self._store.write() as tx:
            old = await tx.notice_of(notice_id)
            if old is None:
                raise NotFound(f"no notice {notice_id}")
            if old.state in FINAL:
                raise Conflict(f"notice {notice_id} is {old.state}: history changes no more")
            new = dataclasses.replace(old, **changes, revision=old.revision + 1, updated_at=self.now())
            problems = rules(new.kind, new.time, new.window_end, new.target_state)
            if problems:
                raise InvalidInput(problems)
            await self._put(tx, new, subject=subject)
        await self._catalog.written(tx.journal)
        _log.info("notice.changed", notice_id=notice_id, state=new.state, revision=new.revision, subject=subject)
        return new

    async def delete(self, notice_id: str, *, subject: str) -> None:
        """Delete a notice and its acknowledgements; NotFound when there is none."""
        async with self._store.write() as tx:
            old = await tx.notice_of(notice_id)
            if old is None or not await tx.remove_notice(notice_id):
                raise NotFound(f"no notice {notice_id}")
            await tx.mark_changed([NoticeKey(notice_id)])
            await tx.append_audit(_event(subject, old, DELETE))
        await self._catalog.written(tx.journal)
        _log.info("notice.deleted", notice_id=notice_id, subject=subject)

    async def get(self, notice_id: str) -> tuple[Notice, list[Acknowledgement]]:
        """A stored notice and its acknowledgements; NotFound when there is none."""
        notice = (await self._store.notices([notice_id])).get(notice_id)
        if notice is None:
            raise NotFound(f"no notice {notice_id}")
        return notice, await self._store.acknowledgements([notice_id])

    async def find(
        self, *, instance_id: str | None = None, project_id: str | None = None, facility: str | None = None,
        kind: str | None = None, history: bool | None = None,
    ) -> list[tuple[Notice, list[Acknowledgement]]]:
        """The stored notices matching every filter given, oldest ``time`` first, with their acknowledgements.

        ``instance_id``: the notices that reach that instance (its own, its project's, its facility's).
        """
        document: dict[str, Any] = {}
        if instance_id is not None:
            instance = await self._store.get(instance_id)
            if instance is None:
                raise NotFound(f"no instance {instance_id} is stored")
            document = instance.metadata or {}
        now = self.now()
        chosen = [n for n in (await self._store.notices()).values()
                  if (instance_id is None or reaches(n, instance_id, document))
                  and (project_id is None or (n.scope, n.target) == (PROJECT_SCOPE, project_id))
                  and (facility is None or (n.scope, n.target) == (FACILITY_SCOPE, facility))
                  and (kind is None or n.kind == kind)
                  and (history is None or (status(n, now) in HISTORY) == history)]
        chosen.sort(key=lambda n: (n.time, n.id))
        acks: dict[str, list[Acknowledgement]] = {}
        for ack in await self._store.acknowledgements(n.id for n in chosen):
            acks.setdefault(ack.notice_id, []).append(ack)
        return [(n, acks.get(n.id, [])) for n in chosen]

    async def acknowledge(self, instance_id: str, message: str | None) -> Acknowledgement:
        """The instance acknowledges the notice its event names (``message``); the acknowledgement kept.

        The notice must reach the instance (else NotFound, as for one that does not exist) and be
        current (else Conflict). Seen as this replica's catalog holds it: what the guest read.
        """
        notice_id = parse_notice_id(message, "message")
        entry = self._catalog.get(instance_id)
        notice = self._catalog.notice(notice_id)
        if entry is None or notice is None or not reaches(notice, instance_id, entry.instance.metadata or {}):
            raise NotFound(f"no notice {notice_id} for instance {instance_id}")
        shown = status(notice, self.now())
        if shown in HISTORY:
            raise Conflict(f"notice {notice_id} is {shown}: there is nothing to acknowledge")
        async with self._store.write() as tx:
            ack = await tx.acknowledge(notice_id, instance_id, self.now())
        _log.info("notice.acknowledged", notice_id=notice_id, instance_id=instance_id)
        return ack

    async def restore(
        self, notice: Notice, acks: Iterable[Acknowledgement], *, subject: str, dry_run: bool = False,
    ) -> str:
        """Put an exported notice back as it was (``imds import``): created, updated or unchanged.

        Its id, state and times are kept; a notice stored under that id is replaced (its revision
        then one above the stored one, so replicas see a change). Acknowledgements are added.
        """
        acks = list(acks)
        stored = (await self._store.notices([notice.id])).get(notice.id)
        if stored is not None and _same(stored, notice) and not _new_acks(
                acks, await self._store.acknowledgements([notice.id])):
            return "unchanged"
        if dry_run:
            return "created" if stored is None else "updated"
        if stored is not None and not _same(stored, notice):
            notice = dataclasses.replace(notice, revision=max(notice.revision, stored.revision + 1))
        async with self._store.write() as tx:
            if stored is None or not _same(stored, notice):
                await self._put(tx, notice, subject=subject)
            for ack in acks:
                await tx.acknowledge(ack.notice_id, ack.instance_id, ack.at)
        await self._catalog.written(tx.journal)
        return "created" if stored is None else "updated"

    async def _write(self, notice: Notice, *, subject: str) -> None:
        async with self._store.write() as tx:
            await self._put(tx, notice, subject=subject)
        await self._catalog.written(tx.journal)
        _log.info("notice.written", notice_id=notice.id, kind=notice.kind, scope=notice.scope, state=notice.state,
                  subject=subject)

    @staticmethod
    async def _put(tx: Any, notice: Notice, *, subject: str) -> None:
        await tx.put_notice(notice)
        await tx.mark_changed([NoticeKey(notice.id)])
        await tx.append_audit(_event(subject, notice, WRITE))


def _same(a: Notice, b: Notice) -> bool:
    """The same notice for guests and the host (revision and write times aside)."""
    return dataclasses.replace(a, revision=0, created_at=None, updated_at=None) == dataclasses.replace(
        b, revision=0, created_at=None, updated_at=None)


def _new_acks(acks: list[Acknowledgement], stored: list[Acknowledgement]) -> bool:
    have = {a.instance_id for a in stored}
    return any(a.instance_id not in have for a in acks)
