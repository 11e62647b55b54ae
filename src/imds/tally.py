"""Request counts, latencies and hollow's cache counters in plain ints, exported at scrape time.

prometheus_client's ``Counter.inc`` and ``Histogram.observe`` take a lock and walk a few
calls each; on the instance read path that was ~7% of the profile's samples
(``bench/profiles/``). Everything counted here happens on one worker's event loop thread,
so plain ints and lists suffice: ``GroupTally.add`` is a dict update, a bisect and a float
add. ``TallyCollector`` turns them into the usual families when ``/metrics`` is scraped:
``imds_http_requests_total{group,status}``, ``imds_http_request_duration_seconds{group}``
and hollow's ``metadata_cache_hit_total`` and friends. Each worker counts its own
requests, as prometheus_client's own metrics did.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

# hollow-metadataservice's counter names: (kind, hit) → (name, help)
HOLLOW = {
    ("metadata", True): ("metadata_cache_hit", "Metadata requests answered from what imds holds."),
    ("metadata", False): ("metadata_cache_miss", "Metadata requests from callers imds does not know."),
    ("userdata", True): ("metadata_userdata_cache_hit", "Userdata requests answered from what imds holds."),
    ("userdata", False): ("metadata_userdata_cache_miss", "Userdata requests from callers imds does not know."),
}


class GroupTally:
    """One route group's answers: a count per status, a latency histogram and its sum."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.statuses: dict[int, int] = {}
        self.buckets = [0] * (len(bounds) + 1)  # non-cumulative; the last one is +Inf
        self.seconds = 0.0

    def add(self, status: int, seconds: float) -> None:
        """Count one answer with ``status`` that took ``seconds``."""
        statuses = self.statuses
        statuses[status] = statuses.get(status, 0) + 1
        self.buckets[bisect_left(self.bounds, seconds)] += 1  # le is inclusive: a value equal to a bound is in it
        self.seconds += seconds


class Tally:
    """Every group's ``GroupTally`` (exported once asked for, as labelled children were) and hollow's counters."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.groups: dict[str, GroupTally] = {}
        self.reads = dict.fromkeys(HOLLOW, 0)

    def group(self, name: str) -> GroupTally:
        """The tally of route group ``name`` (created on first use)."""
        tally = self.groups.get(name)
        if tally is None:
            tally = self.groups[name] = GroupTally(self.bounds)
        return tally

    def answered(self) -> int:
        """Requests answered so far, every group (what tells ``RenderAhead`` the server is busy)."""
        return sum(sum(group.statuses.values()) for group in self.groups.values())

    def count_read(self, kind: str, *, hit: bool) -> None:
        """Hollow's cache counters: a ``metadata``/``userdata`` read found (hit) or not."""
        key = ("userdata" if kind == "userdata" else "metadata", hit)
        self.reads[key] += 1


class TallyCollector(Collector):
    """Exports a ``Tally`` in Prometheus's families when the registry is collected."""

    def __init__(self, tally: Tally) -> None:
        self._tally = tally

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        """The request counter, the latency histogram and hollow's four counters."""
        tally = self._tally
        requests = CounterMetricFamily(
            "imds_http_requests", "HTTP requests answered, by route group and status.", labels=["group", "status"]
        )
        latency = HistogramMetricFamily("imds_http_request_duration_seconds", "Time to answer, by route group.",
                                        labels=["group"])
        for name, group in tally.groups.items():
            for status, count in sorted(group.statuses.items()):
                requests.add_metric([name, str(status)], count)
            latency.add_metric([name], _cumulative(tally.bounds, group.buckets), group.seconds)
        yield requests
        yield latency
        for key, (name, text) in HOLLOW.items():
            yield CounterMetricFamily(name, text, value=tally.reads[key])


def _cumulative(bounds: tuple[float, ...], buckets: list[int]) -> list[tuple[str, float]]:
    total = 0
    out: list[tuple[str, float]] = []
    labels = (*(repr(float(b)) for b in bounds), "+Inf")  # as prometheus_client writes them
    for bound, count in zip(labels, buckets, strict=True):
        total += count
        out.append((bound, total))
    return out
