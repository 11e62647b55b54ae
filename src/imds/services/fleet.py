"""What the admin page asks for: instances matching a search, and the recent change feed.

Both read the catalog (this replica's in-memory view) and the store's change feed; no
private or secret value is in either answer.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from imds.models import Instance
from imds.services.catalog.catalog import Catalog
from imds.services.explain import summary
from imds.store import Store

SEARCH_LIMIT = 100


class Fleet:
    """This replica's view of every instance, as the admin page searches it and follows its changes."""

    def __init__(self, catalog: Catalog, store: Store) -> None:
        self._catalog = catalog
        self._store = store

    def search(self, query: str, *, limit: int = SEARCH_LIMIT) -> list[dict[str, Any]]:
        """Instances whose id starts with, or hostname contains, ``query``; for an IP, those whose entries hold it.

        An empty query lists the first ``limit`` instances by id. Longest-prefix holder first for an IP.
        """
        catalog = self._catalog
        text = query.strip().lower()
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            address = None
        if address is not None:
            ids = list(dict.fromkeys(holder for _network, holder in catalog.containing(address)))
        else:
            ids = sorted(
                instance_id for instance_id, _ in catalog.holdings()
                if not text or instance_id.startswith(text) or text in (_hostname(catalog, instance_id) or "").lower()
            )
        found = [entry.instance for instance_id in ids[:limit] if (entry := catalog.get(instance_id)) is not None]
        return [summary(instance) for instance in found]

    async def recent_changes(self, *, limit: int = 50) -> list[dict[str, Any]]:
        """The last ``limit`` change-feed entries this replica has seen, newest first, with the hostname now."""
        catalog = self._catalog
        changes = await self._store.changes_since(max(catalog.position - limit, 0), limit)
        rows = []
        for change in reversed(changes[-limit:]):
            project, notice = change.project, change.notice
            if project is not None or notice is not None:  # a project's attributes or a notice: present while stored
                present = (catalog.project(project.id) if project is not None
                           else catalog.notice(notice.id if notice is not None else "")) is not None
                rows.append({"seq": change.seq, "instance_id": change.instance_id, "hostname": None,
                             "present": present})
                continue
            entry = catalog.get(change.instance_id)
            rows.append({"seq": change.seq, "instance_id": change.instance_id,
                         "hostname": _name(entry.instance) if entry is not None else None,
                         "present": entry is not None})
        return rows


def _hostname(catalog: Catalog, instance_id: str) -> str | None:
    entry = catalog.get(instance_id)
    return _name(entry.instance) if entry is not None else None


def _name(instance: Instance) -> str | None:
    hostname = instance.metadata.get("hostname") if instance.metadata is not None else None
    return hostname if isinstance(hostname, str) else None
