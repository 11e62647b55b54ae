"""Who is calling: the catalog entry behind an instance request, in one awaited call.

A verified proxy claim (``imds.services.identity.proxied``) names the instance by id; otherwise the
caller's address is looked up in the catalog, then in the lookup's by-IP cache, then (pull
mode) upstream, and the catalog answers again once the record is stored. A caller that
lacks the record a path needs is looked up by id (``record``). Hollow's cache counters are
counted here: a miss once per request when the caller (or its record) was not held, a
hit when the flavor has answered (``served``).
"""

from __future__ import annotations

from imds.errors import ImdsError, InstanceNotFound, RecordNotFound
from imds.metrics import Metrics
from imds.models import METADATA, Address, Instance
from imds.services.catalog.catalog import Catalog, Entry
from imds.services.identity.proxied import Claim
from imds.services.lookup.pull import Lookup


def holds(instance: Instance, kind: str) -> bool:
    """Whether the instance has its ``kind`` record (metadata or userdata)."""
    return (instance.metadata if kind == METADATA else instance.userdata) is not None


class Resolver:
    """Catalog → lookup cache → upstream lookup, with hollow's hit/miss counters."""

    def __init__(self, catalog: Catalog, metrics: Metrics, lookup: Lookup | None = None) -> None:
        self._catalog = catalog
        self._count = metrics.tally.count_read  # plain ints (imds.tally): no lock on the read path
        self._lookup = lookup

    def held(
        self, kind: str, *, address: Address | None, claim: Claim | None = None, needs_record: bool = False
    ) -> Entry | None:
        """The caller's entry when imds holds it (with its ``kind`` record if ``needs_record``), else None.

        Synchronous and counts nothing: the read path of known instances ends here.
        """
        if claim is not None:
            entry = self._catalog.get(claim.instance_id)
            if entry is not None:
                claim.check_host(entry.instance)  # another host's instance: ForeignHost
                if not claim.admits(entry.instance):
                    return None
        else:
            entry = self._by_address(kind, address)
        if entry is None or (needs_record and not holds(entry.instance, kind)):
            return None
        return entry

    async def caller(
        self, kind: str, *, address: Address | None, claim: Claim | None = None, count: bool = True,
        needs_record: bool = False,
    ) -> Entry:
        """The calling instance, or InstanceNotFound (or the upstream lookup's error).

        ``count``: whether a miss counts in hollow's ``*_cache_miss`` for ``kind``;
        ``needs_record``: the caller must hold its ``kind`` record (RecordNotFound otherwise).
        At most one upstream lookup per call.
        """
        entry = self.held(kind, address=address, claim=claim)
        if entry is not None:  # held: with its record, or looked up by id for it (a 404 in push mode)
            return entry if not needs_record or holds(entry.instance, kind) else await self.record(entry, kind)
        if claim is not None:
            entry, looked_up, error = await self._claimed(kind, claim, count=count)
        else:
            entry, looked_up, error = await self._addressed(kind, address, count=count)
        if needs_record and not holds(entry.instance, kind):
            if not looked_up:
                return await self.record(entry, kind)
            raise error or RecordNotFound(kind, entry.instance.id)
        return entry

    async def _addressed(
        self, kind: str, address: Address | None, *, count: bool
    ) -> tuple[Entry, bool, ImdsError | None]:
        """The instance holding ``address`` (looked up by address in pull mode); whether looked up, and its error."""
        entry = self._by_address(kind, address)
        looked_up, error = False, None
        if entry is None and address is not None and self._lookup is not None:
            self._missed(kind, count=count)
            count, looked_up = False, True
            error = await self._lookup.resolve(kind, address=address)
            entry = self._by_address(kind, address)
            if entry is None and error is not None:
                raise error
        if entry is None:
            self._missed(kind, count=count)
            raise InstanceNotFound(str(address) if address is not None else None)
        return entry, looked_up, error

    async def record(self, entry: Entry, kind: str) -> Entry:
        """``entry`` holding its ``kind`` record: looked up by id in pull mode, else RecordNotFound."""
        instance_id = entry.instance.id
        if holds(entry.instance, kind):
            return entry
        if self._lookup is None:
            raise RecordNotFound(kind, instance_id)
        self._missed(kind, count=True)
        error = await self._lookup.resolve(kind, instance_id=instance_id)
        found = self._catalog.get(instance_id)
        if found is not None and holds(found.instance, kind):
            return found
        raise error or RecordNotFound(kind, instance_id)

    def served(self, kind: str) -> None:
        """The flavor answered a ``kind`` read from what imds holds: hollow's ``*_cache_hit``."""
        self._count(kind, hit=True)

    def _by_address(self, kind: str, address: Address | None) -> Entry | None:
        if address is None:
            return None
        entry = self._catalog.lookup(address)
        if entry is None and self._lookup is not None:
            cached = self._lookup.cached(kind, address)
            entry = self._catalog.get(cached) if cached is not None else None
        return entry

    async def _claimed(self, kind: str, claim: Claim, *, count: bool) -> tuple[Entry, bool, ImdsError | None]:
        """The instance a verified claim names, whatever its addresses (looked up by id in pull mode)."""
        entry = self._catalog.get(claim.instance_id)
        looked_up, error = False, None
        if entry is None and self._lookup is not None:
            self._missed(kind, count=count)
            count, looked_up = False, True
            error = await self._lookup.resolve(kind, instance_id=claim.instance_id)
            entry = self._catalog.get(claim.instance_id)
        if entry is None and error is not None:
            raise error
        if entry is not None:
            claim.check_host(entry.instance)
        if entry is None or not claim.admits(entry.instance):
            # A tenant mismatch answers exactly like an unknown id.
            self._missed(kind, count=count)
            raise InstanceNotFound(f"instance {claim.instance_id}")
        return entry, looked_up, error

    def _missed(self, kind: str, *, count: bool) -> None:
        if count:
            self._count(kind, hit=False)
