"""Prometheus metrics: one registry per application (so tests can build many apps).

Request counts and latency are labelled by route group (``instance``, ``admin``, ``ops``,
``other``) and status; hollow's counters keep their names. Those counted on every request
live in ``imds.tally`` (plain ints, no lock) and are exported at scrape time.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from imds.models import METADATA, USERDATA
from imds.tally import Tally, TallyCollector

GROUPS = ("instance", "admin", "ops", "other")
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def _per_kind(registry: CollectorRegistry, name: str, what: str) -> dict[str, Counter]:
    """One of hollow's counters for each record kind: ``metadata_<name>`` and ``metadata_userdata_<name>``."""
    return {METADATA: Counter(f"metadata_{name}", f"Metadata {what}", registry=registry),
            USERDATA: Counter(f"metadata_userdata_{name}", f"Userdata {what}", registry=registry)}


class Metrics:
    """Every metric imds exports, registered in ``registry``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # imds_http_requests_total, imds_http_request_duration_seconds and hollow's cache counters.
        self.tally = Tally(_BUCKETS)
        r.register(TallyCollector(self.tally))
        self.instances = Gauge("imds_catalog_instances", "Instances held in memory.", registry=r)
        self.feed_position = Gauge("imds_catalog_feed_position", "Last change-feed entry applied.", registry=r)
        self.ahead_pending = Gauge("imds_render_ahead_pending",
                                   "Instances waiting for their first renderings to be built ahead of a read.",
                                   registry=r)
        self.ahead_built = Gauge("imds_render_ahead_built",
                                 "Instances whose first renderings were built ahead of a read since the start.",
                                 registry=r)
        # hollow-metadataservice's counters, same names (the cache hit/miss ones are in the tally), the
        # per-kind ones by record kind (``inserts[METADATA]`` is metadata_inserts).
        self.inserts = _per_kind(r, "inserts", "writes applied from the API.")
        self.deletions = Counter("metadata_deletions", "Record deletions from the API.", registry=r)
        self.lookup_requests = _per_kind(r, "lookup_request", "lookups sent upstream.")
        self.lookup_errors = _per_kind(r, "lookup_error", "lookups that failed.")
        self.store_errors = _per_kind(r, "store_error", "writes that failed in the database.")
        self.lookup_latency = Histogram(
            "imds_lookup_duration_seconds", "Time of upstream lookup calls.", buckets=_BUCKETS, registry=r
        )
        self.lookup_breaker = Gauge(
            "imds_lookup_breaker_state", "Upstream circuit breaker: 0 closed, 1 open, 2 half-open.", registry=r
        )
        self.lookup_negative_hits = Counter(
            "imds_lookup_negative_cache_hits", "Misses answered from the negative cache (no upstream call).",
            registry=r,
        )
        self.lookup_joined = Counter(
            "imds_lookup_singleflight_joined", "Misses that joined a lookup already in flight.", registry=r
        )
        self.lookup_stale = Counter(
            "imds_lookup_stale", "Background refreshes that failed while the stored copy kept being served.",
            registry=r,
        )
        self.connections_shut = Counter(
            "imds_connections_shut", "Connections shut down for exceeding --max-connections-per-source.",
            registry=r,
        )
        self.watch_waiting = Gauge(
            "imds_watch_waiting", "Change-watch (wait_for_change) requests held now.", registry=r
        )

    def count_read(self, kind: str, *, hit: bool) -> None:
        """Hollow's cache counters: an instance read of ``metadata``/``userdata`` found (hit) or not."""
        self.tally.count_read(kind, hit=hit)
