"""Lifecycle notices as the catalog holds them: by scope, with the moments they change on their own.

Loaded with the instances and kept coherent like them (a local write's journal, the change
feed's ``notice:<id>`` entries). A change of a notice resets the entries it reaches: the one
instance of an instance notice (``on_instance``), the members of a project's or facility's
scope (``imds.services.catalog.members``). A notice also changes with the clock (a maintenance
window opens, then closes: ``imds.services.render.timeline``): every moment at which one of
them does is kept in a heap, and ``expire`` resets whom the notices due by then reach, so a
held watch wakes when a window opens as it does for a write.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from datetime import datetime

from imds.models import INSTANCE_SCOPE, Notice
from imds.services.catalog.members import Members, scope_key


class NoticeBoard:
    """Every notice by id and by scope; ``on_change`` is called whenever one is written (the clock re-plans)."""

    def __init__(self, members: Members, on_instance: Callable[[str], None] | None = None) -> None:
        self._members = members
        self.on_instance = on_instance  # resets the entry of one instance (the catalog sets it)
        self._by_id: dict[str, Notice] = {}
        self._by_scope: dict[str, dict[str, Notice]] = {}
        self._moments: list[tuple[datetime, str]] = []  # (a moment a notice changes at, its id)
        self.on_change: Callable[[], None] | None = None

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, notice_id: str) -> Notice | None:
        """The notice with this id, if held."""
        return self._by_id.get(notice_id)

    def affecting(self, instance_id: str, keys: Iterable[str]) -> list[Notice]:
        """The notices of the instance itself and of the scopes in ``keys`` (its project, its facility)."""
        found = list(self._by_scope.get(scope_key(INSTANCE_SCOPE, instance_id), {}).values())
        for key in keys:
            found += self._by_scope.get(key, {}).values()
        return found

    def replace(self, notices: Iterable[Notice]) -> None:
        """Hold exactly ``notices`` (a full load; the caller resets the members)."""
        self._by_id, self._by_scope, self._moments = {}, {}, []
        for notice in notices:
            self._place(notice)
        self._changed()

    def apply(self, notice_id: str, notice: Notice | None) -> None:
        """The notice is now ``notice`` (None: deleted); whom the old and the new one reach are reset."""
        old = self._by_id.get(notice_id)
        if old == notice:
            return
        if old is not None:
            self._by_id.pop(notice_id)
            scoped = self._by_scope.get(_key(old), {})
            scoped.pop(notice_id, None)
            if not scoped:
                self._by_scope.pop(_key(old), None)
            self._reset(old)
        if notice is not None:
            self._place(notice)
            self._reset(notice)
        self._changed()

    def next_moment(self) -> datetime | None:
        """The earliest moment still to come at which a held notice changes on its own."""
        return self._moments[0][0] if self._moments else None

    def expire(self, now: datetime) -> int:
        """Reset whom the notices reach that changed on their own by ``now``; how many moments passed."""
        passed = 0
        while self._moments and self._moments[0][0] <= now:
            _moment, notice_id = heapq.heappop(self._moments)
            passed += 1
            notice = self._by_id.get(notice_id)
            if notice is not None:
                self._reset(notice)
        return passed

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def _place(self, notice: Notice) -> None:
        self._by_id[notice.id] = notice
        self._by_scope.setdefault(_key(notice), {})[notice.id] = notice
        for moment in (notice.time, notice.window_end):
            if moment is not None:
                heapq.heappush(self._moments, (moment, notice.id))

    def _reset(self, notice: Notice) -> None:
        if notice.scope == INSTANCE_SCOPE:
            if self.on_instance is not None:
                self.on_instance(notice.target)
        else:
            self._members.reset(_key(notice))


def _key(notice: Notice) -> str:
    return scope_key(notice.scope, notice.target)
