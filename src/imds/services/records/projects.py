"""GCE project attributes: one record per project, written once for every instance of the project.

``PUT /projects/{project_id}/attributes`` replaces the project's whole record (a JSON object
of string values), ``GET`` reads it, ``DELETE`` removes it. Each write is one store block
with its change-feed entry (``project:<id>``) and its audit entry; the catalog applies it
before the caller hears back, so the next read on this replica sees it, and other replicas
follow the feed as they do for instances (``imds.services.catalog.projects``).

| what | rule |
|---|---|
| project id | 1-28 characters: lowercase letters, digits, ``-`` and ``_``, starting with a letter or digit |
| a key | 1-128 characters: letters, digits, ``-`` and ``_`` (GCE's metadata keys) |
| a value | a string (valid Unicode text) |
| the body | at most ``--max-body-bytes``; at most ``--max-document-keys`` keys |

An audit entry holds the project id, the number of keys and the revision: never a value.
"""

from __future__ import annotations

import re
from typing import Any

from imds import log
from imds.errors import InvalidInput, NotFound, Problem
from imds.models import PROJECT_KIND, AuditEvent, ProjectAttributes, ProjectKey
from imds.services.catalog.catalog import Catalog
from imds.services.records.audit import DELETE, WRITE
from imds.services.records.limits import MAX_PROBLEMS, Limits, check_document, flag_of
from imds.store.interface import Store

_log = log.get("projects")
# fullmatch: "$" would also match before a trailing newline.
PROJECT_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,27}")
KEY = re.compile(r"[A-Za-z0-9_-]{1,128}")


def parse_project_id(text: str) -> str:
    """``text`` when it is a valid project id; else InvalidInput naming ``project_id``."""
    if PROJECT_ID.fullmatch(text) is None:
        raise InvalidInput.one("project_id", "must be 1-28 characters of lowercase letters, digits, '-' and '_', "
                                             "starting with a letter or digit")
    return text


def parse_attributes(value: Any, limits: Limits) -> dict[str, str]:
    """A request body's attributes: a JSON object of string values; InvalidInput naming each bad key."""
    if not isinstance(value, dict):
        raise InvalidInput.one("body", "must be a JSON object of attribute names to string values")
    problems: list[Problem] = []
    for key, item in value.items():
        if KEY.fullmatch(key) is None:
            problems.append(Problem(key, "an attribute name is 1-128 letters, digits, '-' and '_'"))
        elif not isinstance(item, str):
            problems.append(Problem(key, f"must be a string, not {type(item).__name__}"))
    if len(value) > limits.max_document_keys:
        problems.append(Problem("body", f"has {len(value)} keys; at most {limits.max_document_keys} are accepted "
                                        f"({flag_of('max_document_keys')})"))
    problems += check_document(value, "body", limits) if not problems else []
    if problems:
        raise InvalidInput(problems[:MAX_PROBLEMS])
    return dict(value)


class ProjectRecords:
    """Create, replace, read and delete project attributes."""

    def __init__(self, store: Store, catalog: Catalog) -> None:
        self._store = store
        self._catalog = catalog

    async def put(self, project_id: str, attributes: dict[str, str], *, subject: str) -> ProjectAttributes:
        """Replace the project's attributes; every instance of the project serves them."""
        async with self._store.write() as tx:
            record = await tx.put_project(project_id, attributes)
            await tx.mark_changed([ProjectKey(project_id)])
            await tx.append_audit(AuditEvent(subject, str(ProjectKey(project_id)), WRITE, PROJECT_KIND, applied=True,
                                             detail={"project_id": project_id, "keys": len(attributes),
                                                     "revision": record.revision}))
        await self._catalog.written(tx.journal)
        _log.info("project.written", project_id=project_id, keys=len(attributes), revision=record.revision,
                  subject=subject)
        return record

    async def get(self, project_id: str) -> ProjectAttributes:
        """The stored attributes of the project; NotFound when it has none."""
        record = (await self._store.projects([project_id])).get(project_id)
        if record is None:
            raise NotFound(f"no attributes stored for project {project_id}")
        return record

    async def delete(self, project_id: str, *, subject: str) -> None:
        """Delete the project's attributes; NotFound when it has none."""
        async with self._store.write() as tx:
            if not await tx.remove_project(project_id):
                raise NotFound(f"no attributes stored for project {project_id}")
            await tx.mark_changed([ProjectKey(project_id)])
            await tx.append_audit(AuditEvent(subject, str(ProjectKey(project_id)), DELETE, PROJECT_KIND, applied=True,
                                             detail={"project_id": project_id}))
        await self._catalog.written(tx.journal)
        _log.info("project.deleted", project_id=project_id, subject=subject)
