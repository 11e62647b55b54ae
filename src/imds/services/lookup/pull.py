"""Pull mode: records fetched from the upstream source of truth when instances ask.

Used when the caller's address matches nothing (lookup by IP), or matches an instance
that lacks the requested record type (lookup by id). Results go through the normal
write path (``Records``: full-IP-list rules and the staleness guard apply).

Protection, because one booting rack must not become a burst upstream and an upstream
outage must not become 500s:

- single flight: concurrent misses for one key share one upstream call;
- negative cache: a 404 is remembered for ``negative_ttl`` seconds;
- a per-call timeout and a cap on concurrent upstream calls;
- a circuit breaker (``services.breaker``) after consecutive failures;
- stale-if-error: anything fetched before stays in the store and keeps being served when a
  refresh fails (counted); with nothing stored, the caller gets 502, never 500;
- records fetched by lookup are refreshed in the background after ``refresh_after``.

A record found by IP whose ``ipAddresses`` lack the asking address (hollow then misses
on every later request) is served to that caller anyway, and the by-IP answer is kept
for ``cache_ttl`` seconds so repeated requests do not each go upstream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from imds import log
from imds.errors import ImdsError, InvalidInput, RecordNotFound, UpstreamError, UpstreamUnavailable
from imds.metrics import Metrics
from imds.models import METADATA, Address, Instance
from imds.services.catalog.catalog import Catalog
from imds.services.lookup.breaker import STATE_VALUES, Breaker
from imds.services.records.limits import Limits
from imds.services.records.upsert import Records
from imds.services.records.wire import parse_metadata_write, parse_userdata_write
from imds.upstream.client import UpstreamClient

_log = log.get("lookup")
Key = tuple[str, str, str]  # (kind, "ip" | "id", value)
_PRUNE_FLOOR = 1024


@dataclass(frozen=True)
class LookupPolicy:
    """Timing and limits of upstream lookups: the ``--lookup-*`` options' values (their defaults are the options')."""

    timeout: float
    negative_ttl: float
    refresh_after: float
    cache_ttl: float
    concurrency: int
    limits: Limits = field(default_factory=Limits)


class Lookup:
    """Fetches unknown callers' records from upstream, with the protections above."""

    def __init__(  # noqa: PLR0913 - collaborators and policy, all keyword-only after the first four
        self,
        client: UpstreamClient,
        records: Records,
        catalog: Catalog,
        metrics: Metrics,
        *,
        policy: LookupPolicy,
        breaker: Breaker | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._records = records
        self._catalog = catalog
        self._metrics = metrics
        self.policy = policy
        self.breaker = breaker or Breaker()
        self._clock = clock
        self._semaphore = asyncio.Semaphore(self.policy.concurrency)
        self._flights: dict[Key, asyncio.Future[str | None]] = {}
        self._negative: dict[Key, float] = {}
        self._by_ip: dict[tuple[str, str], tuple[str, float]] = {}
        self._fetched: dict[tuple[str, str], float] = {}
        self._prune_at = _PRUNE_FLOOR

    # -- read path --------------------------------------------------------------------

    def cached(self, kind: str, address: Address) -> str | None:
        """The instance a recent by-IP lookup returned for an address its record does not list."""
        hit = self._by_ip.get((kind, str(address)))
        if hit is None or hit[1] <= self._clock():
            return None
        return hit[0]

    def provenance(self, address: Address | None, instance_id: str | None) -> dict[str, Any]:
        """What the upstream lookup did for this address / instance (``imds explain``).

        ``by_ip_cache``: kind → the instance a recent by-IP lookup answered for ``address``;
        ``fetched``: the kinds of ``instance_id`` this replica fetched from upstream.
        """
        kinds = sorted({kind for kind, _ in self._fetched} | {kind for kind, _ in self._by_ip})
        cached = {kind: hit for kind in kinds if address is not None and (hit := self.cached(kind, address))}
        fetched = [kind for kind in kinds if instance_id is not None and (kind, instance_id) in self._fetched]
        return {"by_ip_cache": cached, "fetched": fetched}

    async def resolve(
        self, kind: str, *, address: Address | None = None, instance_id: str | None = None
    ) -> ImdsError | None:
        """Fetch the ``kind`` record the read path missed (by id, else by address); the error to answer with, if any."""
        if instance_id is not None:
            key: Key = (kind, "id", instance_id)
        else:
            key = (kind, "ip", str(address))
        if self._negative.get(key, 0.0) > self._clock():
            self._metrics.lookup_negative_hits.inc()
            return None
        self._prune()
        try:
            await self._single_flight(key, address)
        except ImdsError as exc:  # upstream failures (502), and a store that cannot take the write (503)
            return exc
        return None

    # -- admin refresh ------------------------------------------------------------------

    async def refresh(self, kind: str, instance_id: str, *, subject: str) -> Instance:
        """Fetch by id now and store (logged as ``subject``); RecordNotFound on an upstream 404."""
        key: Key = (kind, "id", instance_id)
        self._negative.pop(key, None)
        if await self._single_flight(key, None, subject) is None:
            raise RecordNotFound(kind, instance_id)
        return await self._records.get(kind, instance_id)

    # -- background refresh -------------------------------------------------------------

    async def refresh_loop(self) -> None:
        """Re-fetch records that lookups brought in, every ``refresh_after`` seconds, until cancelled."""
        period = self.policy.refresh_after
        while True:
            await asyncio.sleep(max(period / 4, 0.05))
            now = self._clock()
            due = [(kind, i) for (kind, i), at in list(self._fetched.items()) if now - at >= period]
            for kind, instance_id in due:
                if not self._still_held(kind, instance_id):
                    # Deleted by an admin since it was fetched: refreshing would bring it back.
                    self._fetched.pop((kind, instance_id), None)
                    continue
                await self._refresh_quietly(kind, instance_id)

    def _still_held(self, kind: str, instance_id: str) -> bool:
        entry = self._catalog.get(instance_id)
        if entry is None:
            return False
        return (entry.instance.metadata if kind == METADATA else entry.instance.userdata) is not None

    async def _refresh_quietly(self, kind: str, instance_id: str) -> None:
        try:
            found = await self._single_flight((kind, "id", instance_id), None)
        except ImdsError as exc:  # the upstream or the store failed: keep serving, keep the loop alive
            self._metrics.lookup_stale.inc()
            self._fetched[(kind, instance_id)] = self._clock()  # try again next period, not every tick
            _log.warning("lookup.refresh_failed", kind=kind, instance_id=instance_id, error=exc.message)
            return
        if found is None:
            # Deleting on an upstream 404 would turn a flapping upstream into data loss; keep it.
            self._fetched[(kind, instance_id)] = self._clock()
            _log.warning("lookup.refresh_not_found", kind=kind, instance_id=instance_id)

    # -- internals ----------------------------------------------------------------------

    def _prune(self) -> None:
        """Drop expired cache entries once the caches have doubled since the last sweep.

        Unknown callers are unbounded in number; without this the negative and by-IP caches
        would grow for ever. Amortised O(1) per miss.
        """
        if len(self._negative) + len(self._by_ip) < self._prune_at:
            return
        now = self._clock()
        self._negative = {k: until for k, until in self._negative.items() if until > now}
        self._by_ip = {k: hit for k, hit in self._by_ip.items() if hit[1] > now}
        self._prune_at = max(_PRUNE_FLOOR, 2 * (len(self._negative) + len(self._by_ip)))

    async def _single_flight(self, key: Key, address: Address | None, subject: str = "lookup") -> str | None:
        flight = self._flights.get(key)
        if flight is not None:
            self._metrics.lookup_joined.inc()
            return await asyncio.shield(flight)
        flight = asyncio.get_running_loop().create_future()
        self._flights[key] = flight
        try:
            result = await self._fetch_and_store(key, address, subject)
        except asyncio.CancelledError:
            flight.cancel()
            raise
        except Exception as exc:
            flight.set_exception(exc)
            flight.exception()  # mark it retrieved: joiners re-raise it, nobody else must
            raise
        else:
            flight.set_result(result)
            return result
        finally:
            del self._flights[key]

    async def _fetch_and_store(self, key: Key, address: Address | None, subject: str) -> str | None:
        kind, by, value = key
        if by == "ip":
            body = await self._call(kind, lambda: self._client.by_ip(kind, value))
        else:
            body = await self._call(kind, lambda: self._client.by_id(kind, value))
        if body is None:
            self._negative[key] = self._clock() + self.policy.negative_ttl
            return None
        answered = body.get("id") if isinstance(body, dict) else None
        if by == "id" and isinstance(answered, str) and answered.lower() != value:
            msg = f"upstream answered the {kind} of instance {answered} when asked for {value}"
            raise UpstreamError(msg)
        instance_id = await self._store(kind, body, subject)
        self._fetched[(kind, instance_id)] = self._clock()
        if address is not None:
            entry = self._catalog.lookup(address)
            if entry is None or entry.instance.id != instance_id:
                self._by_ip[(kind, str(address))] = (instance_id, self._clock() + self.policy.cache_ttl)
        return instance_id

    async def _call(self, kind: str, call: Callable[[], Awaitable[Any]]) -> Any:
        requests, errors = self._metrics.lookup_requests[kind], self._metrics.lookup_errors[kind]
        if not self.breaker.allow():
            self._publish_breaker()
            errors.inc()
            msg = f"upstream circuit breaker is open for {self.breaker.seconds_left():.1f} s more"
            raise UpstreamUnavailable(msg)
        self._publish_breaker()  # half-open while this call is the trial
        try:
            return await self._limited(call, requests, errors)
        except BaseException:
            self.breaker.abandon()  # cancelled (or a bug) with no outcome: a claimed trial must not stick
            raise

    async def _limited(self, call: Callable[[], Awaitable[Any]], requests: Any, errors: Any) -> Any:
        async with self._semaphore:
            requests.inc()
            started = self._clock()
            try:
                body = await asyncio.wait_for(call(), self.policy.timeout)
            except (UpstreamError, TimeoutError) as exc:
                self.breaker.failure()
                errors.inc()
                if isinstance(exc, TimeoutError):
                    msg = f"upstream timed out after {self.policy.timeout:g} s"
                    raise UpstreamUnavailable(msg) from exc
                raise
            else:
                self.breaker.success()
                return body
            finally:
                self._metrics.lookup_latency.observe(self._clock() - started)
                self._publish_breaker()

    async def _store(self, kind: str, body: Any, subject: str) -> str:
        try:
            if kind == METADATA:
                metadata = parse_metadata_write(body, self.policy.limits)
                await self._records.put_metadata(metadata, subject=subject)
                return metadata.id
            userdata = parse_userdata_write(body, self.policy.limits)
            await self._records.put_userdata(userdata, subject=subject)
        except InvalidInput as exc:
            fields = ", ".join(p.field for p in exc.problems)
            msg = f"upstream sent an invalid {kind} record ({fields})"
            raise UpstreamError(msg) from exc
        return userdata.id

    def _publish_breaker(self) -> None:
        self._metrics.lookup_breaker.set(STATE_VALUES[self.breaker.state])

