"""Which catalog entries were rendered with the records of a project or a facility.

An entry's ETag and some of its renderings take records beside its own: its project's
attributes, the notices of its project and of its facility. When it computes them it joins
those scopes (``project:<id>``, ``facility:<name>``); when one of their records changes, the
catalog resets exactly the members (their ETag and renderings are recomputed at the next
read, their watches wake). An entry never read joins nothing, so such a write costs in
proportion to the instances being read, and a read costs nothing more than before.
An instance's own notices reset that one entry directly (no set per instance).
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Iterable
from typing import Protocol

from imds.models import FACILITY_SCOPE, PROJECT_SCOPE


class Member(Hashable, Protocol):
    """An entry rendered with a scope's records: reset when they change."""

    def reproject(self) -> None:
        """Forget what was computed with the scope's records, and wake the watches on it."""
        ...


def scope_key(scope: str, target: str) -> str:
    """The key of a scope (``project:acme``), one string per scope however many entries join it."""
    return sys.intern(f"{scope}:{target}")


def scope_keys(project_id: str, facility: str) -> tuple[str, str]:
    """The scopes an instance in ``project_id`` and ``facility`` joins."""
    return scope_key(PROJECT_SCOPE, project_id), scope_key(FACILITY_SCOPE, facility)


class Members:
    """Scope key → the entries that joined it."""

    def __init__(self) -> None:
        self._joined: dict[str, set[Member]] = {}

    def join(self, member: Member, keys: Iterable[str]) -> None:
        """``member`` was computed with the records of each scope in ``keys``."""
        for key in keys:
            self._joined.setdefault(key, set()).add(member)

    def leave(self, member: Member, keys: Iterable[str] | None) -> None:
        """``member`` is gone (replaced or deleted)."""
        for key in keys or ():
            members = self._joined.get(key)
            if members is not None:
                members.discard(member)
                if not members:
                    del self._joined[key]

    def reset(self, key: str) -> None:
        """A record of scope ``key`` changed: reset its members (they join again when next computed)."""
        for member in self._joined.pop(key, ()):
            member.reproject()

    def reset_all(self) -> None:
        """Every scope's records were replaced (a full load): reset everyone who joined."""
        joined, self._joined = self._joined, {}
        for members in joined.values():
            for member in members:
                member.reproject()
