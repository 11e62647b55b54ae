"""/metrics counts every instance request exactly once, by group and status, on a real server.

The counters behind these families are plain ints per worker (``imds.tally``); this drives
a real ``imds serve`` (granian, one worker) from several threads at once and checks that
every family equals the number of requests sent, histogram buckets included.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from serve_process import client_at, serving

DEMO = "127.0.0.1"  # --demo binds its instance to 127.0.0.1 and ::1
STRANGER = "127.0.0.83"  # a source address no instance has
# (path, method, source, times, expected status)
PLAN = (
    ("/metadata", "GET", DEMO, 37, 200),
    ("/latest/meta-data/instance-id", "GET", DEMO, 23, 200),
    ("/openstack/latest/meta_data.json", "GET", DEMO, 11, 200),
    ("/userdata", "GET", DEMO, 5, 200),
    ("/latest/meta-data/no-such-leaf", "GET", DEMO, 4, 404),
    ("/metadata", "GET", STRANGER, 7, 404),
    ("/metadata", "POST", DEMO, 3, 405),
)


def send(url: str, path: str, method: str, source: str) -> int:
    with client_at(source) as client:
        return client.request(method, f"{url}{path}").status_code


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with client_at() as client:
        text = client.get(f"{url}/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_every_instance_request_is_counted_exactly_once(tmp_path: Path) -> None:
    """Concurrent reads, misses and refusals: each family equals the requests sent, no more, no less."""
    with serving(tmp_path, "--db", "memory://", "--demo", "--metrics-public", "--workers", "1") as server:
        jobs = [(path, method, source) for path, method, source, times, _ in PLAN for _ in range(times)]
        with ThreadPoolExecutor(max_workers=8) as pool:
            statuses = list(pool.map(lambda job: send(server.url, *job), jobs))
        expected = [status for *_, times, status in PLAN for _ in range(times)]
        assert statuses == expected
        found = scrape(server.url)

    def requests(status: str) -> float:
        return found.get(("imds_http_requests_total", (("group", "instance"), ("status", status))), 0.0)

    assert requests("200") == 37 + 23 + 11 + 5
    assert requests("404") == 4 + 7
    assert requests("405") == 3
    counted = {labels for name, labels in found
               if name == "imds_http_requests_total" and ("group", "instance") in labels}
    assert counted == {(("group", "instance"), ("status", s)) for s in ("200", "404", "405")}
    total = sum(times for *_, times, _ in PLAN)
    instance = (("group", "instance"),)
    assert found[("imds_http_request_duration_seconds_count", instance)] == total
    assert found[("imds_http_request_duration_seconds_bucket", (("group", "instance"), ("le", "+Inf")))] == total
    buckets = sorted(
        (float(dict(labels)["le"]), value)
        for (name, labels), value in found.items()
        if name == "imds_http_request_duration_seconds_bucket" and ("group", "instance") in labels
    )
    assert [value for _, value in buckets] == sorted(value for _, value in buckets)  # cumulative
    assert 0 < found[("imds_http_request_duration_seconds_sum", instance)] < total  # each well under a second
    # hollow's counters: EC2 meta-data and OpenStack reads are metadata hits; the unknown source is a miss.
    assert found[("metadata_cache_hit_total", ())] == 37 + 23 + 11
    assert found[("metadata_userdata_cache_hit_total", ())] == 5
    assert found[("metadata_cache_miss_total", ())] == 7
    assert found[("metadata_userdata_cache_miss_total", ())] == 0


def test_a_scrape_counts_itself_in_ops_and_never_in_instance(tmp_path: Path) -> None:
    """Scrapes land in ``ops`` (one more each time); the instance families stay as they were."""
    with serving(tmp_path, "--db", "memory://", "--demo", "--metrics-public", "--workers", "1") as server:
        assert send(server.url, "/metadata", "GET", DEMO) == 200
        first = scrape(server.url)
        second = scrape(server.url)
    ops = ("imds_http_requests_total", (("group", "ops"), ("status", "200")))
    instance = ("imds_http_requests_total", (("group", "instance"), ("status", "200")))
    assert second[ops] == first[ops] + 1
    assert first[instance] == second[instance] == 1
