"""Readiness: whether this replica can answer (catalog loaded, store reachable), and what is missing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from imds.errors import StoreUnavailable
from imds.services.catalog.catalog import Catalog
from imds.services.ganeti.crypto import PrivateCipher
from imds.store import Store


@dataclass(frozen=True)
class Readiness:
    """The answer ``/readyz`` serialises: ready or not, the instance count, the problems, the load progress."""

    instances: int
    loading: dict[str, object]
    problems: list[str] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        """No problem found."""
        return not self.problems

    def document(self) -> dict[str, Any]:
        """The JSON body."""
        return {"status": "ready" if self.ready else "not ready", "instances": self.instances,
                "problems": list(self.problems), "loading": self.loading}


class ReadinessProbe:
    """What ``/readyz`` asks of this replica: its catalog, its store and the private-value cipher."""

    def __init__(self, catalog: Catalog, store: Store, cipher: PrivateCipher | None = None) -> None:
        self._catalog = catalog
        self._store = store
        self._cipher = cipher

    async def check(self) -> Readiness:
        """Check the catalog is loaded, the store answers a ping and every stored private value can be decrypted."""
        catalog = self._catalog
        problems = [] if catalog.loaded else ["instance index not loaded"]
        unreadable = self._cipher.problem() if self._cipher is not None else None
        if unreadable is not None:
            problems.append(unreadable)
        try:
            await self._store.ping()
        except StoreUnavailable as exc:
            problems.append(exc.message)
        return Readiness(len(catalog), catalog.progress(), problems)
