"""Lookup with a stub upstream client and an injected clock: cache lifetimes, odd answers, failures mid-call."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import pytest

from factories import new_id
from helpers import FakeClock, make_settings, wait_for_async
from imds.errors import InstanceNotFound, RecordNotFound, StoreUnavailable, UpstreamError, UpstreamUnavailable
from imds.metrics import Metrics
from imds.services.catalog.catalog import Catalog
from imds.services.lookup.breaker import CLOSED, HALF_OPEN, Breaker
from imds.services.lookup.pull import Lookup, LookupPolicy
from imds.services.lookup.resolve import Resolver
from imds.services.records.limits import Limits
from imds.services.records.upsert import Records
from imds.store import MemoryStore

pytestmark = pytest.mark.anyio

X = ipaddress.ip_address("10.9.0.1")
Y = ipaddress.ip_address("10.9.0.2")


class StubClient:
    """Answers programmed per (kind, "id" | "ip", value): a body, None (404) or an exception to raise."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str, str], Any] = {}
        self.calls: list[tuple[str, str, str]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def by_id(self, kind: str, instance_id: str) -> Any:
        return await self._answer((kind, "id", instance_id))

    async def by_ip(self, kind: str, address: str) -> Any:
        return await self._answer((kind, "ip", address))

    async def _answer(self, key: tuple[str, str, str]) -> Any:
        self.calls.append(key)
        await self.gate.wait()
        answer = self.answers.get(key)
        if isinstance(answer, BaseException):
            raise answer
        return answer


class BreakableStore(MemoryStore):
    """A memory store whose writes fail while ``broken``."""

    broken = False

    @asynccontextmanager
    async def write(self) -> AsyncIterator[Any]:
        if self.broken:
            raise StoreUnavailable("database unreachable: connection refused")
        async with super().write() as tx:
            yield tx


@dataclass
class Rig:
    lookup: Lookup
    client: StubClient
    catalog: Catalog
    metrics: Metrics
    store: BreakableStore
    clock: FakeClock

    def sample(self, name: str) -> float:
        value = self.metrics.registry.get_sample_value(name)
        return 0.0 if value is None else value


POLICY = make_settings().lookup.fill(LookupPolicy, prefix="lookup_", limits=Limits())  # the options' defaults


@asynccontextmanager
async def rig(**policy: Any) -> AsyncIterator[Rig]:
    clock, client, store = FakeClock(100.0), StubClient(), BreakableStore()
    catalog = Catalog(store)
    await catalog.load()
    metrics = Metrics()
    breaker = Breaker(failures=1, reset=10.0, clock=clock, jitter=lambda: 1.0)
    lookup = Lookup(
        client, Records(store, catalog, metrics), catalog, metrics,  # type: ignore[arg-type]
        policy=replace(POLICY, **{"negative_ttl": 30.0, "cache_ttl": 60.0, **policy}), breaker=breaker, clock=clock,
    )
    yield Rig(lookup, client, catalog, metrics, store, clock)


def record(instance_id: str, ips: list[str], **document: Any) -> dict[str, Any]:
    return {"id": instance_id, "ipAddresses": ips, "metadata": {"id": instance_id, **document}}


async def test_a_404_is_remembered_for_exactly_the_negative_ttl():
    """Within negative_ttl no call goes out (counted as negative hits); at the TTL the next miss asks again."""
    async with rig(negative_ttl=30.0) as r:
        assert await r.lookup.resolve("metadata", address=X) is None
        r.clock.now += 29.99
        assert await r.lookup.resolve("metadata", address=X) is None
        assert await r.lookup.resolve("metadata", address=X) is None
        assert len(r.client.calls) == 1
        assert r.sample("imds_lookup_negative_cache_hits_total") == 2
        r.clock.now += 0.01
        assert await r.lookup.resolve("metadata", address=X) is None
        assert r.client.calls == [("metadata", "ip", "10.9.0.1")] * 2


async def test_a_by_ip_answer_not_listing_the_address_is_cached_for_exactly_cache_ttl():
    """cached() returns the instance for that address and kind until cache_ttl has passed."""
    instance_id = new_id()
    async with rig(cache_ttl=60.0) as r:
        r.client.answers[("metadata", "ip", str(X))] = record(instance_id, [str(Y)])
        assert await r.lookup.resolve("metadata", address=X) is None
        assert r.lookup.cached("metadata", X) == instance_id
        assert r.lookup.cached("userdata", X) is None
        assert r.catalog.lookup(X) is None
        assert r.catalog.lookup(Y).instance.id == instance_id  # type: ignore[union-attr]
        r.clock.now += 59.99
        assert r.lookup.cached("metadata", X) == instance_id
        r.clock.now += 0.01
        assert r.lookup.cached("metadata", X) is None


async def test_a_by_ip_answer_listing_the_address_is_not_cached_separately():
    """When the record lists the address the catalog answers; no by-IP cache entry is kept."""
    instance_id = new_id()
    async with rig() as r:
        r.client.answers[("metadata", "ip", str(X))] = record(instance_id, [str(X)])
        assert await r.lookup.resolve("metadata", address=X) is None
        assert r.lookup.cached("metadata", X) is None
        assert r.catalog.lookup(X).instance.id == instance_id  # type: ignore[union-attr]


async def test_a_by_id_answer_for_another_instance_is_refused_and_not_stored():
    """Asked for A, the upstream answers B's record: UpstreamError, nothing written."""
    asked, other = new_id(), new_id()
    async with rig() as r:
        r.client.answers[("metadata", "id", asked)] = record(other, [str(X)])
        error = await r.lookup.resolve("metadata", instance_id=asked)
        assert isinstance(error, UpstreamError)
        assert error.message == f"upstream answered the metadata of instance {other} when asked for {asked}"
        assert len(r.catalog) == 0
        with pytest.raises(UpstreamError):
            await r.lookup.refresh("metadata", asked, subject="admin")
        assert len(r.catalog) == 0


async def test_a_store_that_cannot_take_the_write_is_an_answer_not_a_crash():
    """resolve() returns StoreUnavailable (the front answers 503) instead of raising into the request."""
    async with rig() as r:
        r.client.answers[("metadata", "ip", str(X))] = record(new_id(), [str(X)])
        r.store.broken = True
        error = await r.lookup.resolve("metadata", address=X)
        assert isinstance(error, StoreUnavailable)
        assert len(r.catalog) == 0


async def test_a_background_refresh_survives_a_failing_store_and_counts_it_stale():
    """A refresh whose write fails is counted stale and retried later; the next one applies."""
    instance_id = new_id()
    async with rig(refresh_after=5.0) as r:
        r.client.answers[("metadata", "ip", str(X))] = record(instance_id, [str(X)], hostname="v1")
        assert await r.lookup.resolve("metadata", address=X) is None
        r.client.answers[("metadata", "id", instance_id)] = record(instance_id, [str(X)], hostname="v2")
        r.store.broken = True
        await r.lookup._refresh_quietly("metadata", instance_id)
        assert r.sample("imds_lookup_stale_total") == 1
        assert r.catalog.get(instance_id).instance.metadata["hostname"] == "v1"  # type: ignore[union-attr,index]
        r.store.broken = False
        await r.lookup._refresh_quietly("metadata", instance_id)
        assert r.catalog.get(instance_id).instance.metadata["hostname"] == "v2"  # type: ignore[union-attr,index]
        assert r.sample("imds_lookup_stale_total") == 1


async def test_an_upstream_404_on_refresh_keeps_the_record():
    """A record that vanished upstream is not deleted by a background refresh (flapping upstream ≠ data loss)."""
    instance_id = new_id()
    async with rig() as r:
        r.client.answers[("metadata", "ip", str(X))] = record(instance_id, [str(X)])
        await r.lookup.resolve("metadata", address=X)
        await r.lookup._refresh_quietly("metadata", instance_id)  # by id: no answer programmed → 404
        assert r.catalog.get(instance_id) is not None
        with pytest.raises(RecordNotFound):
            await r.lookup.refresh("metadata", instance_id, subject="admin")
        assert r.catalog.get(instance_id) is not None


async def test_a_cancelled_trial_does_not_leave_the_breaker_stuck_half_open():
    """The half-open trial is cancelled mid-call: the next miss may try again and closes the breaker."""
    instance_id = new_id()
    async with rig() as r:
        r.client.answers[("metadata", "ip", str(X))] = UpstreamUnavailable("upstream answered 500")
        assert isinstance(await r.lookup.resolve("metadata", address=X), UpstreamUnavailable)
        assert r.sample("imds_lookup_breaker_state") == 1
        r.clock.now += 10
        r.client.answers[("metadata", "ip", str(X))] = record(instance_id, [str(X)])
        r.client.gate.clear()
        trial = asyncio.create_task(r.lookup.resolve("metadata", address=X))
        for _ in range(100):
            if len(r.client.calls) == 2:
                break
            await asyncio.sleep(0)
        assert len(r.client.calls) == 2
        assert r.lookup.breaker.state == HALF_OPEN
        assert r.sample("imds_lookup_breaker_state") == 2  # visible while the trial is out
        trial.cancel()
        with pytest.raises(asyncio.CancelledError):
            await trial
        r.client.gate.set()
        assert await r.lookup.resolve("metadata", address=X) is None
        assert r.lookup.breaker.state == CLOSED
        assert r.sample("imds_lookup_breaker_state") == 0
        assert r.catalog.lookup(X).instance.id == instance_id  # type: ignore[union-attr]


async def test_joiners_of_a_failed_flight_get_the_same_error_from_one_call():
    """Ten concurrent misses while the one call fails: ten identical errors, one upstream call."""
    async with rig() as r:
        r.client.answers[("userdata", "ip", str(X))] = UpstreamUnavailable("upstream answered 503")
        r.client.gate.clear()
        tasks = [asyncio.create_task(r.lookup.resolve("userdata", address=X)) for _ in range(10)]
        for _ in range(100):
            if r.sample("imds_lookup_singleflight_joined_total") == 9:
                break
            await asyncio.sleep(0)
        r.client.gate.set()
        errors = await asyncio.gather(*tasks)
        assert {type(e) for e in errors} == {UpstreamUnavailable}
        assert {e.message for e in errors if e is not None} == {"upstream answered 503"}
        assert len(r.client.calls) == 1
        assert r.sample("metadata_userdata_lookup_error_total") == 1


async def test_background_refresh_does_not_resurrect_a_record_an_admin_deleted():
    """After DELETE, the refresh loop drops the record from its list instead of fetching it back."""
    instance_id = new_id()
    async with rig(refresh_after=0.01) as r:
        r.client.answers[("metadata", "ip", str(X))] = record(instance_id, [str(X)])
        r.client.answers[("metadata", "id", instance_id)] = record(instance_id, [str(X)])
        await r.lookup.resolve("metadata", address=X)
        await r.lookup._records.delete("metadata", instance_id, subject="admin")
        r.clock.now += 1.0
        loop = asyncio.create_task(r.lookup.refresh_loop())
        try:
            # the loop ticks in real time, so bound it generously
            await wait_for_async(lambda: not r.lookup._fetched, what="the refresh loop to drop the record", timeout=20)
        finally:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop
        assert r.lookup._fetched == {}
        assert ("metadata", "id", instance_id) not in r.client.calls
        assert r.catalog.get(instance_id) is None


async def test_expired_cache_entries_are_pruned_as_unknown_callers_accumulate():
    """3000 distinct unknown callers with a 1 s negative TTL leave at most the floor (1024) entries, not 3000."""
    async with rig(negative_ttl=1.0) as r:
        for n in range(3000):
            await r.lookup.resolve("metadata", address=ipaddress.ip_address(f"10.{n >> 8}.{n & 255}.9"))
            r.clock.now += 0.01
        assert len(r.client.calls) == 3000
        assert len(r.lookup._negative) <= 1024


# --- caller resolution (services.resolve): one awaited call, counted in one place ------------------------------


def counts(r: Rig, kind: str = "metadata") -> tuple[float, float]:
    prefix = "metadata" if kind == "metadata" else "metadata_userdata"
    return r.sample(f"{prefix}_cache_hit_total"), r.sample(f"{prefix}_cache_miss_total")


async def test_a_held_caller_resolves_without_awaiting_upstream_or_counting():
    """Known by address: ``held`` answers synchronously, ``caller`` the same entry, nothing counted or fetched."""
    async with rig() as r:
        instance_id = new_id()
        r.client.answers[("metadata", "ip", str(X))] = record(instance_id, [str(X)])
        await r.lookup.resolve("metadata", address=X)
        resolver, calls = Resolver(r.catalog, r.metrics, r.lookup), len(r.client.calls)
        held = resolver.held("metadata", address=X, needs_record=True)
        assert held is not None
        assert held.instance.id == instance_id
        assert await resolver.caller("metadata", address=X, needs_record=True) is held
        assert len(r.client.calls) == calls
        assert counts(r) == (0, 0)


async def test_an_unknown_caller_is_looked_up_once_and_its_miss_counted_once():
    """Pull mode: the first request fetches by address (one miss), the next is held (no call, no miss)."""
    async with rig() as r:
        instance_id = new_id()
        r.client.answers[("metadata", "ip", str(X))] = record(instance_id, [str(X)])
        resolver = Resolver(r.catalog, r.metrics, r.lookup)
        assert resolver.held("metadata", address=X) is None
        assert (await resolver.caller("metadata", address=X)).instance.id == instance_id
        assert (await resolver.caller("metadata", address=X)).instance.id == instance_id
        assert r.client.calls == [("metadata", "ip", str(X))]
        assert counts(r) == (0, 1)


async def test_an_upstream_404_is_a_404_counted_once_per_request_and_remembered():
    """Not found upstream: InstanceNotFound, one miss per request; the second request is a negative-cache hit."""
    async with rig() as r:
        resolver = Resolver(r.catalog, r.metrics, r.lookup)
        for _ in range(2):
            with pytest.raises(InstanceNotFound):
                await resolver.caller("metadata", address=X)
        assert r.client.calls == [("metadata", "ip", str(X))]
        assert counts(r) == (0, 2)
        assert r.sample("imds_lookup_negative_cache_hits_total") == 1


async def test_an_upstream_failure_is_the_answer_and_a_miss_without_count_is_not_counted():
    """The lookup's error reaches the caller (502); ``count=False`` leaves hollow's counters alone."""
    async with rig() as r:
        r.client.answers[("metadata", "ip", str(X))] = UpstreamError("upstream sent garbage")
        resolver = Resolver(r.catalog, r.metrics, r.lookup)
        with pytest.raises(UpstreamError, match="garbage"):
            await resolver.caller("metadata", address=X, count=False)
        assert counts(r) == (0, 0)


async def test_a_missing_record_is_looked_up_by_id_and_counted_as_its_kinds_miss():
    """A held instance without userdata: fetched by id once (a userdata miss); without pull mode, RecordNotFound."""
    async with rig() as r:
        instance_id = new_id()
        r.client.answers[("metadata", "ip", str(X))] = record(instance_id, [str(X)])
        r.client.answers[("userdata", "id", instance_id)] = {"id": instance_id, "ipAddresses": [str(X)],
                                                              "userdata": "#!/bin/sh\n"}
        await r.lookup.resolve("metadata", address=X)
        assert await Resolver(r.catalog, r.metrics).caller("userdata", address=X) is not None
        with pytest.raises(RecordNotFound):
            await Resolver(r.catalog, r.metrics).caller("userdata", address=X, needs_record=True)
        resolver = Resolver(r.catalog, r.metrics, r.lookup)
        entry = await resolver.caller("userdata", address=X, needs_record=True)
        assert entry.instance.userdata == b"#!/bin/sh\n"
        assert r.client.calls[-1] == ("userdata", "id", instance_id)
        assert counts(r, "userdata") == (0, 1)
