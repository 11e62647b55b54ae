"""Project attributes as the catalog holds them, and which entries were rendered with them.

A project's attributes (``PUT /projects/{id}/attributes``) reach every instance of the
project. The catalog holds one record per project (loaded with the instances, then kept
coherent like them: a local write's journal, the change feed's ``project:<id>`` entries).
An entry looks its project up once per version, when it computes its ETag or a rendering
that depends on the project (``join``), and is then a member of that project: when the
project's record changes, the catalog resets exactly those members (their ETag and
renderings are recomputed at the next read, their watches wake). An entry never read
joins nothing, so a project write costs in proportion to the instances being read, and a
read costs nothing more than before.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable, Iterable
from typing import Protocol

from imds.models import ProjectAttributes


class Member(Hashable, Protocol):
    """An entry rendered with a project's record: reset when that record changes."""

    def reproject(self) -> None:
        """Forget what was computed with the project's record, and wake the watches on it."""
        ...


def project_tag(record: ProjectAttributes) -> bytes:
    """What an instance's ETag adds for its project's record: the attributes and their revision."""
    canonical = json.dumps([record.revision, record.attributes], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).digest()


class Projects:
    """Project records by project id, and the entries that joined each project."""

    def __init__(self) -> None:
        self._records: dict[str, ProjectAttributes] = {}
        self._members: dict[str, set[Member]] = {}

    def __len__(self) -> int:
        return len(self._records)

    def get(self, project_id: str) -> ProjectAttributes | None:
        """The project's record, if it has one."""
        return self._records.get(project_id)

    def join(self, member: Member, project_id: str) -> ProjectAttributes | None:
        """``member`` is computed with ``project_id``'s record (None: it has none); reset when that changes."""
        self._members.setdefault(project_id, set()).add(member)
        return self._records.get(project_id)

    def leave(self, member: Member, project_id: str | None) -> None:
        """``member`` is gone (replaced or deleted)."""
        if project_id is None:
            return
        members = self._members.get(project_id)
        if members is not None:
            members.discard(member)
            if not members:
                del self._members[project_id]

    def replace(self, records: Iterable[ProjectAttributes]) -> None:
        """Hold exactly ``records`` (a full load); whoever joined before is reset."""
        self._records = {record.project_id: record for record in records}
        members, self._members = self._members, {}
        for joined in members.values():
            for member in joined:
                member.reproject()

    def apply(self, project_id: str, record: ProjectAttributes | None) -> None:
        """The project's record is now ``record`` (None: deleted); its members are reset."""
        old = self._records.get(project_id)
        if old == record:
            return
        if record is None:
            self._records.pop(project_id, None)
        else:
            self._records[project_id] = record
        for member in self._members.pop(project_id, ()):
            member.reproject()
