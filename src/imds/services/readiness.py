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


async def readiness(catalog: Catalog, store: Store, cipher: PrivateCipher | None = None) -> Readiness:
    """Check the catalog is loaded, the store answers a ping and every stored private value can be decrypted."""
    problems = [] if catalog.loaded else ["instance index not loaded"]
    unreadable = cipher.problem() if cipher is not None else None
    if unreadable is not None:
        problems.append(unreadable)
    try:
        await store.ping()
    except StoreUnavailable as exc:
        problems.append(exc.message)
    return Readiness(len(catalog), catalog.progress(), problems)
