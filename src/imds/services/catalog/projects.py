"""Project attributes as the catalog holds them.

A project's attributes (``PUT /projects/{id}/attributes``) reach every instance of the
project. The catalog holds one record per project (loaded with the instances, then kept
coherent like them: a local write's journal, the change feed's ``project:<id>`` entries).
An entry takes its project's record when it computes its ETag or a rendering that depends
on the project, joining the project's scope (``imds.services.catalog.members``); a change
of the record resets exactly those members.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

from imds.models import PROJECT_SCOPE, ProjectAttributes
from imds.services.catalog.members import Members, scope_key


def project_tag(record: ProjectAttributes) -> bytes:
    """What an instance's ETag adds for its project's record: the attributes and their revision."""
    canonical = json.dumps([record.revision, record.attributes], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).digest()


class Projects:
    """Project records by project id; their members live in the shared ``Members``."""

    def __init__(self, members: Members | None = None) -> None:
        self._records: dict[str, ProjectAttributes] = {}
        self._members = members if members is not None else Members()

    def __len__(self) -> int:
        return len(self._records)

    def get(self, project_id: str) -> ProjectAttributes | None:
        """The project's record, if it has one."""
        return self._records.get(project_id)

    def replace(self, records: Iterable[ProjectAttributes]) -> None:
        """Hold exactly ``records`` (a full load); whoever joined a scope before is reset."""
        self._records = {record.project_id: record for record in records}
        self._members.reset_all()

    def apply(self, project_id: str, record: ProjectAttributes | None) -> None:
        """The project's record is now ``record`` (None: deleted); its members are reset."""
        old = self._records.get(project_id)
        if old == record:
            return
        if record is None:
            self._records.pop(project_id, None)
        else:
            self._records[project_id] = record
        self._members.reset(scope_key(PROJECT_SCOPE, project_id))
