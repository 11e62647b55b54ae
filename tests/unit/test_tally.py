"""``imds.tally``: plain-int counters exported in Prometheus's families at scrape time."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from imds.metrics import Metrics
from imds.tally import Tally, TallyCollector

BOUNDS = (0.001, 0.01, 0.1)


def registry_of(tally: Tally) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(TallyCollector(tally))
    return registry


def test_buckets_are_inclusive_and_cumulative_like_prometheus_client():
    """A value equal to a bound is in that bucket; the export matches a prometheus_client Histogram fed the same."""
    tally = Tally(BOUNDS)
    reference = CollectorRegistry()
    histogram = Histogram("imds_http_request_duration_seconds", "x", ["group"], buckets=BOUNDS, registry=reference)
    for seconds in (0.0005, 0.001, 0.001, 0.005, 0.1, 0.5, 2.0):
        tally.group("instance").add(200, seconds)
        histogram.labels("instance").observe(seconds)
    ours = registry_of(tally)
    for le in ("0.001", "0.01", "0.1", "+Inf"):
        labels = {"group": "instance", "le": le}
        name = "imds_http_request_duration_seconds_bucket"
        assert ours.get_sample_value(name, labels) == reference.get_sample_value(name, labels), le
    assert ours.get_sample_value("imds_http_request_duration_seconds_bucket", {"group": "instance", "le": "0.001"}) == 3
    assert ours.get_sample_value("imds_http_request_duration_seconds_count", {"group": "instance"}) == 7
    assert ours.get_sample_value("imds_http_request_duration_seconds_sum", {"group": "instance"}) == sum(
        (0.0005, 0.001, 0.001, 0.005, 0.1, 0.5, 2.0)
    )


def test_requests_are_counted_per_group_and_status():
    """Each (group, status) pair is its own sample; groups appear once used."""
    tally = Tally(BOUNDS)
    tally.group("admin")  # asked for, never counted: no request samples
    for status in (200, 200, 404, 200, 405):
        tally.group("instance").add(status, 0.0001)
    tally.group("other").add(404, 0.02)
    registry = registry_of(tally)
    counts = {
        (group, status): registry.get_sample_value("imds_http_requests_total", {"group": group, "status": status})
        for group, status in (("instance", "200"), ("instance", "404"), ("instance", "405"), ("other", "404"))
    }
    assert counts == {("instance", "200"): 3, ("instance", "404"): 1, ("instance", "405"): 1, ("other", "404"): 1}
    assert registry.get_sample_value("imds_http_requests_total", {"group": "admin", "status": "200"}) is None


def test_hollows_counters_keep_their_names_in_the_metrics_registry():
    """``Metrics.count_read`` moves metadata_cache_* and metadata_userdata_cache_*, exported once each."""
    metrics = Metrics()
    for kind, hit in (("metadata", True), ("metadata", True), ("metadata", False), ("userdata", True)):
        metrics.count_read(kind, hit=hit)
    registry = metrics.registry
    assert registry.get_sample_value("metadata_cache_hit_total") == 2
    assert registry.get_sample_value("metadata_cache_miss_total") == 1
    assert registry.get_sample_value("metadata_userdata_cache_hit_total") == 1
    assert registry.get_sample_value("metadata_userdata_cache_miss_total") == 0
    text = generate_latest(registry).decode()
    assert text.count("# TYPE metadata_cache_hit_total counter") == 1
    assert text.count("# TYPE imds_http_requests_total counter") == 1
