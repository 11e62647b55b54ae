"""Pull mode over HTTP: unknown callers fetched from a fake upstream on a real socket, through the whole app.

The store is parametrised (memory, SQLite, PostgreSQL) wherever what is stored matters. Timing-dependent
cases use small settings and bounded polling; nothing asserts a wall-clock duration.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from factories import metadata_body, new_id, next_ipv4, next_ipv6, userdata_body
from fake_upstream import DISCOVERY_PATH, TOKEN_PATH, FakeUpstream, running_upstream
from helpers import FakeClock, admin_client, client_from, make_settings, wait_for_async
from imds import __version__
from imds.app import build_app
from imds.errors import StoreUnavailable
from imds.store import MemoryStore, Store
from imds.web.instance import InstanceFront

pytestmark = pytest.mark.anyio

POLL_LIMIT = 10.0


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with running_upstream() as fake:
        yield fake


@asynccontextmanager
async def pull_app(upstream: FakeUpstream | None, db_url: str = "memory://", *, store: Store | None = None,
                   **overrides: Any) -> AsyncIterator[InstanceFront]:
    """The app in pull mode against ``upstream`` (lookup off when None), with its services running."""
    # A generous timeout: an upstream that answers must not time out on a loaded machine (the tests of
    # timeouts set their own, with an upstream that never answers).
    values: dict[str, Any] = {"db": db_url, "lookup_timeout": 30.0}
    if upstream is not None:
        values["lookup_url"] = upstream.base
    settings = make_settings(**{**values, **overrides})
    app = build_app(settings, store=store, http=httpx.AsyncClient(timeout=30.0, trust_env=False))
    async with app.services.running():
        yield app


async def get(app: InstanceFront, ip: str, path: str, method: str = "GET", **kwargs: Any) -> httpx.Response:
    async with client_from(app, ip) as guest:
        return await guest.request(method, path, **kwargs)


async def admin(app: InstanceFront, method: str, path: str, **kwargs: Any) -> httpx.Response:
    async with admin_client(app) as client:
        return await client.request(method, path, **kwargs)


async def push(app: InstanceFront, path: str, body: dict[str, Any]) -> None:
    answer = await admin(app, "POST", path, json=body)
    assert answer.json()["applied"] is True, answer.text


async def scrape(app: InstanceFront) -> dict[str, float]:
    """/metrics as {sample name: value} for unlabelled samples."""
    async with admin_client(app) as client:
        text = (await client.get("/metrics")).text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels
    }


def sample(app: InstanceFront, name: str) -> float:
    """One metric read in-process (for polling loops)."""
    return app.services.metrics.registry.get_sample_value(name) or 0.0


async def until(predicate: Callable[[], bool], what: str) -> None:
    """Wait (bounded by POLL_LIMIT) until ``predicate()`` holds."""
    await wait_for_async(predicate, what=what, timeout=POLL_LIMIT)


def doc(instance_id: str, **fields: Any) -> dict[str, Any]:
    return {"id": instance_id, "hostname": f"host-{instance_id[:8]}", **fields}


def message(answer: httpx.Response) -> str:
    assert answer.headers["content-type"] == "application/json", answer.text
    body = answer.json()
    assert set(body) == {"message"}, body
    return str(body["message"])


async def instances(app: InstanceFront) -> int:
    answer = await get(app, next_ipv4(), "/readyz")
    return int(answer.json()["instances"])


# --- hollow's lookup router cases ----------------------------------------------------------------------------


async def test_an_upstream_404_is_a_404(upstream, db_url):
    """Unknown caller, upstream 404 → 404 JSON naming the address; one upstream call by IP."""
    ip = next_ipv4()
    async with pull_app(upstream, db_url) as app:
        answer = await get(app, ip, "/metadata")
        assert answer.status_code == 404
        assert message(answer) == f"no instance is associated with {ip}"
        assert [c.target for c in upstream.log()] == [f"/device-metadata?ip_address={ip}"]
        assert await instances(app) == 0


@pytest.mark.parametrize(("path", "kind"), [("/metadata", "metadata"), ("/api/v1/userdata", "userdata")])
async def test_an_upstream_error_with_nothing_stored_is_a_502_with_a_json_body(upstream, db_url, path, kind):
    """Upstream 500 and nothing stored → 502 JSON saying what the upstream did; never 500, nothing stored."""
    upstream.fail_all(500)
    async with pull_app(upstream, db_url) as app:
        answer = await get(app, next_ipv4(), path)
        assert answer.status_code == 502
        assert message(answer) == f"upstream answered 500 for /device-{kind}"
        assert await instances(app) == 0
        metrics = await scrape(app)
    name = "metadata_lookup" if kind == "metadata" else "metadata_userdata_lookup"
    assert (metrics[f"{name}_request_total"], metrics[f"{name}_error_total"]) == (1.0, 1.0)


@pytest.mark.parametrize("as_string", [False, True], ids=["object", "json-string"])
async def test_a_200_is_stored_and_the_next_request_makes_no_upstream_call(upstream, db_url, as_string):
    """200 → stored through the write path and served; later requests come from memory (one upstream call)."""
    ip, instance_id = next_ipv4(), new_id()
    document = doc(instance_id, plan="c3.small")
    upstream.put_metadata(instance_id, [ip], document, as_string=as_string)
    async with pull_app(upstream, db_url) as app:
        for _ in range(3):
            answer = await get(app, ip, "/metadata")
            assert answer.status_code == 200
            assert answer.json() == document
        assert upstream.count() == 1
        stored = await admin(app, "GET", f"/device-metadata/{instance_id}")
        assert stored.json() == document
        metrics = await scrape(app)
    assert metrics["metadata_lookup_request_total"] == 1.0
    assert metrics["metadata_lookup_error_total"] == 0.0
    assert metrics["metadata_cache_miss_total"] == 1.0
    assert metrics["metadata_cache_hit_total"] == 3.0
    assert metrics["metadata_inserts_total"] == 1.0
    assert metrics["imds_lookup_duration_seconds_count"] == 1.0
    assert metrics["imds_lookup_breaker_state"] == 0.0


async def test_userdata_by_ip_is_decoded_stored_and_served_byte_exact(upstream, db_url):
    """Hollow's base64 userdata is decoded once; /userdata serves the bytes; the next read makes no call."""
    ip, instance_id = next_ipv4(), new_id()
    script = b"#!/bin/sh\necho \xe2\x9c\x93\n"
    upstream.put_userdata(instance_id, [ip], script)
    async with pull_app(upstream, db_url) as app:
        first, second = await get(app, ip, "/userdata"), await get(app, ip, "/userdata")
        assert first.content == second.content == script
        assert first.headers["content-type"].startswith("text/plain")
        assert [c.target for c in upstream.log()] == [f"/device-userdata?ip_address={ip}"]
        stored = await admin(app, "GET", f"/device-userdata/{instance_id}")
        assert stored.content == script
        metrics = await scrape(app)
    assert (metrics["metadata_userdata_lookup_request_total"], metrics["metadata_userdata_cache_miss_total"]) == (1, 1)


async def test_an_ipv6_caller_is_looked_up_with_its_address_url_encoded(upstream, db_url):
    """A v6 caller's address reaches the upstream percent-encoded and intact, and is then served from memory."""
    ip, instance_id = next_ipv6(), new_id()
    upstream.put_metadata(instance_id, [ip], doc(instance_id))
    async with pull_app(upstream, db_url) as app:
        assert (await get(app, ip, "/metadata")).json()["id"] == instance_id
        assert (await get(app, ip, "/metadata")).json()["id"] == instance_id
    (call,) = upstream.log()
    assert call.raw_target == "/device-metadata?ip_address=" + ip.replace(":", "%3A")
    assert call.query == {"ip_address": ip}
    assert call.headers["user-agent"] == f"imds/{__version__}"


async def test_lookup_off_means_unknown_callers_are_plain_404s(upstream):
    """Without --lookup-url the upstream is never asked."""
    async with pull_app(None) as app:
        ip = next_ipv4()
        assert message(await get(app, ip, "/metadata")) == f"no instance is associated with {ip}"
    assert upstream.count("/") == 0


class UnwritableStore(MemoryStore):
    """A memory store whose writes fail, as a database that went away would."""

    @asynccontextmanager
    async def write(self) -> AsyncIterator[Any]:
        raise StoreUnavailable("database unreachable: connection refused")
        yield  # pragma: no cover - makes this an async generator


async def test_a_store_that_cannot_take_the_looked_up_record_is_a_503_not_a_500(upstream):
    """The upstream answered but the write failed → 503 JSON from the store error (the front never says 500)."""
    ip, instance_id = next_ipv4(), new_id()
    upstream.put_metadata(instance_id, [ip], doc(instance_id))
    async with pull_app(upstream, store=UnwritableStore()) as app:
        answer = await get(app, ip, "/metadata")
        assert answer.status_code == 503
        assert message(answer) == "database unreachable: connection refused"
        ec2 = await get(app, ip, "/latest/meta-data/instance-id")
        assert (ec2.status_code, ec2.text) == (503, "503 - Service Unavailable")
        assert (await scrape(app))["metadata_store_error_total"] == 2.0


# --- lookup by id when the caller is known but lacks a record type -------------------------------------------


async def test_a_missing_userdata_is_looked_up_by_id(upstream, db_url):
    """Known caller without userdata → GET /device-userdata/{id}, stored, served; then no more calls."""
    ip, instance_id = next_ipv4(), new_id()
    async with pull_app(upstream, db_url) as app:
        await push(app, "/device-metadata", metadata_body(instance_id, [ip]))
        upstream.put_userdata(instance_id, [ip], "#cloud-config\nhostname: pulled\n")
        for _ in range(2):
            answer = await get(app, ip, "/userdata")
            assert answer.status_code == 200
            assert answer.text == "#cloud-config\nhostname: pulled\n"
        assert (await get(app, ip, "/metadata")).json()["id"] == instance_id
        metrics = await scrape(app)
    assert [c.target for c in upstream.log()] == [f"/device-userdata/{instance_id}"]
    assert metrics["metadata_userdata_lookup_request_total"] == 1.0
    assert metrics["metadata_lookup_request_total"] == 0.0


async def test_a_missing_metadata_is_looked_up_by_id(upstream, db_url):
    """Known caller with userdata only → GET /device-metadata/{id} for /metadata and EC2 meta-data."""
    ip, instance_id = next_ipv4(), new_id()
    async with pull_app(upstream, db_url) as app:
        await push(app, "/device-userdata", userdata_body(instance_id, [ip]))
        upstream.put_metadata(instance_id, [ip], doc(instance_id))
        answer = await get(app, ip, "/latest/meta-data/instance-id")
        assert (answer.status_code, answer.text) == (200, instance_id)
        assert (await get(app, ip, "/metadata")).json() == doc(instance_id)
    assert [c.target for c in upstream.log()] == [f"/device-metadata/{instance_id}"]


async def test_a_record_type_the_upstream_lacks_too_is_404_and_negatively_cached(upstream, db_url):
    """By-id 404 → 404 naming the record; the next request within the negative TTL makes no call."""
    ip, instance_id = next_ipv4(), new_id()
    async with pull_app(upstream, db_url) as app:
        await push(app, "/device-metadata", metadata_body(instance_id, [ip]))
        for _ in range(3):
            answer = await get(app, ip, "/userdata")
            assert answer.status_code == 404
            assert message(answer) == f"no userdata stored for instance {instance_id}"
        assert upstream.count() == 1
        assert (await scrape(app))["imds_lookup_negative_cache_hits_total"] == 2.0


# --- protection: single flight, negative cache, timeout, concurrency cap -------------------------------------


async def test_a_hundred_concurrent_misses_make_one_upstream_call(upstream, db_url):
    """Single flight: 100 concurrent requests from one unknown caller share one upstream call and all get 200."""
    ip, instance_id = next_ipv4(), new_id()
    upstream.put_metadata(instance_id, [ip], doc(instance_id))
    upstream.hold()
    # 100 at once from one address is over --max-requests-per-source's default: lifted here.
    lifted = {"lookup_timeout": 10.0, "max_requests_per_source": 0}
    async with pull_app(upstream, db_url, **lifted) as app, client_from(app, ip) as guest:
        tasks = [asyncio.create_task(guest.get("/metadata")) for _ in range(100)]
        await until(lambda: sample(app, "imds_lookup_singleflight_joined_total") == 99, "99 joiners")
        upstream.release()
        answers = await asyncio.gather(*tasks)
        assert {a.status_code for a in answers} == {200}
        assert all(a.json() == doc(instance_id) for a in answers)
        assert upstream.count() == 1
        metrics = await scrape(app)
    assert metrics["imds_lookup_singleflight_joined_total"] == 99.0
    assert metrics["metadata_lookup_request_total"] == 1.0
    assert metrics["metadata_cache_miss_total"] == 100.0


async def test_a_404_is_remembered_for_the_negative_ttl(upstream, db_url):
    """Within lookup_negative_ttl repeated misses make no call (counted); past it the upstream is asked again."""
    ip = next_ipv4()
    async with pull_app(upstream, db_url, lookup_negative_ttl=60.0) as app:
        for _ in range(5):
            assert (await get(app, ip, "/metadata")).status_code == 404
        assert upstream.count() == 1
        assert sample(app, "imds_lookup_negative_cache_hits_total") == 4
        assert (await get(app, ip, "/userdata")).status_code == 404  # another kind is another key
        assert upstream.count() == 2
        instance_id = new_id()
        upstream.put_metadata(instance_id, [ip], doc(instance_id))
        lookup = app.services.lookup
        assert lookup is not None
        later = time.monotonic() + 61.0
        lookup._clock = lambda: later  # past the TTL without waiting for it
        assert (await get(app, ip, "/metadata")).json() == doc(instance_id)
        assert upstream.count() == 3


async def test_a_short_negative_ttl_from_settings_expires(upstream):
    """lookup_negative_ttl=0.2: once it has passed, a caller the upstream has since learned is served."""
    ip, instance_id = next_ipv4(), new_id()
    async with pull_app(upstream, lookup_negative_ttl=0.2) as app:
        assert app.services.lookup is not None
        clock = FakeClock(time.monotonic())
        app.services.lookup._clock = clock
        assert (await get(app, ip, "/metadata")).status_code == 404
        upstream.put_metadata(instance_id, [ip], doc(instance_id))
        clock.advance(0.19)
        assert (await get(app, ip, "/metadata")).status_code == 404  # from the negative cache
        assert upstream.count() == 1
        clock.advance(0.02)
        assert (await get(app, ip, "/metadata")).json() == doc(instance_id)
        assert upstream.count() == 2


async def test_a_hanging_upstream_times_out_into_a_502(upstream, db_url):
    """lookup_timeout=0.2 and an upstream that never answers → 502 JSON saying it timed out; counted as an error."""
    upstream.hang_all()
    async with pull_app(upstream, db_url, lookup_timeout=0.2) as app:
        answer = await get(app, next_ipv4(), "/metadata")
        assert answer.status_code == 502
        assert message(answer) == "upstream timed out after 0.2 s"
        metrics = await scrape(app)
    assert (metrics["metadata_lookup_request_total"], metrics["metadata_lookup_error_total"]) == (1.0, 1.0)
    assert metrics["imds_lookup_duration_seconds_count"] == 1.0


async def test_no_more_than_the_concurrency_cap_is_in_flight_upstream(upstream):
    """lookup_concurrency=2 with a held upstream: the fake never sees more than 2 calls at once; all 6 finish."""
    callers = {next_ipv4(): new_id() for _ in range(6)}
    for ip, instance_id in callers.items():
        upstream.put_metadata(instance_id, [ip], doc(instance_id))
    upstream.hold()
    async with pull_app(upstream, lookup_concurrency=2, lookup_timeout=10.0) as app:
        tasks = {ip: asyncio.create_task(get(app, ip, "/metadata")) for ip in callers}
        await until(lambda: upstream.in_flight == 2, "two calls in flight")
        gate = app.services.lookup._semaphore  # type: ignore[union-attr]
        await until(lambda: len(gate._waiters or ()) == 4, "the other four queued at the cap")  # none went out
        assert (upstream.in_flight, upstream.count()) == (2, 2)
        upstream.release()
        for ip, task in tasks.items():
            assert (await task).json() == doc(callers[ip])
    assert upstream.max_in_flight == 2
    assert upstream.count() == 6


# --- by-IP answers that do not list the asking address -------------------------------------------------------


async def test_a_by_ip_record_not_listing_the_caller_is_served_and_cached(upstream, db_url):
    """The upstream says X is A but A's list lacks X: X is served A, and repeats within cache_ttl make no call."""
    asking, listed, instance_id = next_ipv4(), next_ipv4(), new_id()
    body = upstream.put_metadata(instance_id, [listed], doc(instance_id))
    upstream.answer(f"/device-metadata?ip_address={asking}", 200, body)
    async with pull_app(upstream, db_url, lookup_cache_ttl=60.0) as app:
        for _ in range(5):
            assert (await get(app, asking, "/metadata")).json() == doc(instance_id)
        assert (await get(app, listed, "/metadata")).json() == doc(instance_id)
        assert [c.target for c in upstream.log()] == [f"/device-metadata?ip_address={asking}"]
        assert (await get(app, asking, "/latest/meta-data/instance-id")).text == instance_id
        assert upstream.count() == 1


async def test_the_by_ip_cache_expires_after_cache_ttl(upstream):
    """lookup_cache_ttl=0.2: after it the unlisted caller's next request asks the upstream again."""
    asking, instance_id = next_ipv4(), new_id()
    upstream.answer(f"/device-metadata?ip_address={asking}", 200,
                    {"id": instance_id, "ipAddresses": [], "metadata": doc(instance_id)})
    async with pull_app(upstream, lookup_cache_ttl=0.2) as app:
        assert app.services.lookup is not None
        clock = FakeClock(time.monotonic())
        app.services.lookup._clock = clock
        assert (await get(app, asking, "/metadata")).json() == doc(instance_id)
        clock.advance(0.19)
        assert (await get(app, asking, "/metadata")).json() == doc(instance_id)
        assert upstream.count() == 1
        clock.advance(0.02)
        assert (await get(app, asking, "/metadata")).json() == doc(instance_id)
        assert upstream.count() == 2


# --- the normal write path -----------------------------------------------------------------------------------


async def test_a_looked_up_record_follows_the_full_ip_list_rules(upstream, db_url):
    """Upstream's list is the whole truth: unlisted addresses are dropped, addresses of others move to it."""
    a, b = new_id(), new_id()
    asking, old, taken = next_ipv4(), next_ipv4(), next_ipv4()
    async with pull_app(upstream, db_url) as app:
        await push(app, "/device-userdata", userdata_body(a, [old]))
        await push(app, "/device-metadata", metadata_body(b, [taken]))
        upstream.put_metadata(a, [asking, taken], doc(a))
        assert (await get(app, asking, "/metadata")).json() == doc(a)
        assert (await get(app, taken, "/metadata")).json() == doc(a)  # moved from b, no upstream call
        assert upstream.count() == 1
        assert (await get(app, old, "/userdata")).status_code == 404  # dropped: unknown now, upstream 404
        assert [c.target for c in upstream.log()][1:] == [f"/device-userdata?ip_address={old}"]
        assert (await get(app, asking, "/userdata")).text == userdata_body(a, [])["userdata"]
        assert (await admin(app, "GET", f"/device-metadata/{b}")).json()["id"] == b  # b keeps its record


async def test_an_older_upstream_record_changes_nothing(upstream, db_url):
    """Staleness guard: an upstream document older than the stored one leaves document and addresses alone."""
    instance_id = new_id()
    held, asking = next_ipv4(), next_ipv4()
    newer = doc(instance_id, hostname="newer", updated_at="2024-06-01T00:00:00Z")
    older = doc(instance_id, hostname="older", updated_at="2024-01-01T00:00:00Z")
    upstream.put_metadata(instance_id, [asking], older)
    async with pull_app(upstream, db_url) as app:
        await push(app, "/device-metadata", {"id": instance_id, "ipAddresses": [held], "metadata": newer})
        refreshed = await admin(app, "POST", f"/device-metadata/refresh/{instance_id}")
        assert (refreshed.status_code, refreshed.json()) == (200, newer)
        assert (await get(app, held, "/metadata")).json() == newer
        assert (await get(app, asking, "/metadata")).json() == newer  # by IP: the stale answer wrote nothing
        assert (await admin(app, "GET", f"/device-metadata/{instance_id}")).json() == newer
        assert (await scrape(app))["metadata_inserts_total"] == 1.0  # only the admin push applied


@pytest.mark.parametrize(
    ("kind", "answer", "expected"),
    [
        ("metadata", b"{not json", "upstream answered non-JSON for /device-metadata"),
        ("metadata", {"id": "not-a-uuid", "ipAddresses": ["10.0.0.999"], "metadata": 5},
         "upstream sent an invalid metadata record (id, ipAddresses[0], metadata)"),
        ("metadata", ["a", "list"], "upstream sent an invalid metadata record (body, id, ipAddresses, metadata)"),
        ("userdata", {"id": "3f2504e0-4f89-11d3-9a0c-0305e82c3301", "ipAddresses": []},
         "upstream sent an invalid userdata record (userdata)"),
    ],
    ids=["bad-json", "bad-fields", "not-an-object", "no-userdata"],
)
async def test_an_unusable_upstream_answer_is_a_502_and_nothing_is_stored(upstream, db_url, kind, answer, expected):
    """Invalid JSON or an invalid record in a 200 → 502 JSON naming the problem; nothing is written."""
    upstream.answer(f"/device-{kind}", 200, answer)
    async with pull_app(upstream, db_url) as app:
        response = await get(app, next_ipv4(), f"/{kind}")
        assert response.status_code == 502
        assert message(response) == expected
        assert await instances(app) == 0
        assert (await admin(app, "GET", "/device-metadata/3f2504e0-4f89-11d3-9a0c-0305e82c3301")).status_code == 404


# --- the EC2 flavor ------------------------------------------------------------------------------------------


async def test_ec2_paths_and_the_imdsv2_token_put_trigger_lookups(upstream, db_url):
    """meta-data, user-data and PUT /latest/api/token from unknown callers are looked up and answered."""
    meta_ip, user_ip, token_ip = next_ipv4(), next_ipv4(), next_ipv4()
    ids = {ip: new_id() for ip in (meta_ip, user_ip, token_ip)}
    for ip, instance_id in ids.items():
        upstream.put_metadata(instance_id, [ip], doc(instance_id))
    upstream.put_userdata(ids[user_ip], [user_ip], b"\x1f\x8b binary")
    async with pull_app(upstream, db_url) as app:
        answer = await get(app, meta_ip, "/latest/meta-data/instance-id")
        assert (answer.status_code, answer.text) == (200, ids[meta_ip])
        answer = await get(app, user_ip, "/latest/user-data")
        assert (answer.status_code, answer.content) == (200, b"\x1f\x8b binary")
        minted = await get(app, token_ip, "/latest/api/token", "PUT",
                           headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
        assert minted.status_code == 200
        assert minted.headers["x-aws-ec2-metadata-token-ttl-seconds"] == "60"
        read = await get(app, token_ip, "/latest/meta-data/instance-id",
                         headers={"X-aws-ec2-metadata-token": minted.text})
        assert (read.status_code, read.text) == (200, ids[token_ip])
    assert sorted(c.target for c in upstream.log()) == sorted([
        f"/device-metadata?ip_address={meta_ip}",
        f"/device-userdata?ip_address={user_ip}",
        f"/device-metadata?ip_address={token_ip}",
    ])


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/latest/meta-data/instance-id"), ("GET", "/latest/user-data"), ("PUT", "/latest/api/token"),
     ("GET", "/2009-04-04/meta-data/")],
)
@pytest.mark.parametrize(("status", "text"), [(500, "502 - Bad Gateway"), (404, "404 - Not Found")])
async def test_ec2_lookup_errors_are_ec2_plain_text(upstream, method, path, status, text):
    """Upstream failure → 502 - Bad Gateway, upstream 404 → 404 - Not Found, both text/plain, never JSON."""
    if status == 404:
        upstream.answer("/device-metadata", 404, {"error": "not found"})
        upstream.answer("/device-userdata", 404, {"error": "not found"})
    else:
        upstream.fail_all(status)
    headers = {"X-aws-ec2-metadata-token-ttl-seconds": "60"} if method == "PUT" else {}
    async with pull_app(upstream) as app:
        answer = await get(app, next_ipv4(), path, method, headers=headers)
    assert (answer.status_code, answer.text) == (int(text[:3]), text)
    assert answer.headers["content-type"].startswith("text/plain")
    assert upstream.count() == 1


# --- stale-if-error and background refresh -------------------------------------------------------------------


@pytest.mark.parametrize("outage", ["500", "hang"])
async def test_background_refresh_picks_up_changes_and_keeps_serving_through_an_outage(upstream, db_url, outage):
    """refresh_after=0.2: an upstream change arrives by itself; then the upstream fails and the copy stays served."""
    ip, instance_id = next_ipv4(), new_id()
    upstream.put_metadata(instance_id, [ip], doc(instance_id, hostname="v1"))
    async with pull_app(upstream, db_url, lookup_refresh_after=0.2, lookup_timeout=30.0,
                        lookup_breaker_failures=1000) as app:
        assert (await get(app, ip, "/metadata")).json()["hostname"] == "v1"
        upstream.put_metadata(instance_id, [ip], doc(instance_id, hostname="v2"))
        hostnames = []

        async def refreshed() -> bool:
            hostnames.append((await get(app, ip, "/metadata")).json()["hostname"])
            return hostnames[-1] == "v2"

        await wait_for_async(refreshed, what="the upstream change to be served", timeout=POLL_LIMIT)
        assert hostnames[-1] == "v2"
        assert f"/device-metadata/{instance_id}" in {c.target for c in upstream.log()}  # refreshed by id
        if outage == "hang":
            # Only now a short timeout: the fetches above must not time out on a loaded machine.
            assert app.services.lookup is not None
            app.services.lookup._client._timeout = 0.2
            upstream.hang_all()
        else:
            upstream.fail_all(500)
        await until(lambda: sample(app, "imds_lookup_stale_total") >= 2, "two failed refreshes")
        for _ in range(3):
            answer = await get(app, ip, "/metadata")
            assert (answer.status_code, answer.json()) == (200, doc(instance_id, hostname="v2"))
        assert (await scrape(app))["imds_lookup_stale_total"] >= 2
        by_ip = [c for c in upstream.log() if c.query]
        assert len(by_ip) == 1  # reads of a stored record never go upstream, outage or not


async def test_stale_if_error_without_background_refresh(upstream, db_url):
    """Fetched once, then the upstream goes down: reads keep being served; an admin refresh says 502."""
    ip, instance_id = next_ipv4(), new_id()
    upstream.put_metadata(instance_id, [ip], doc(instance_id))
    async with pull_app(upstream, db_url) as app:
        assert (await get(app, ip, "/metadata")).json() == doc(instance_id)
        upstream.fail_all(503)
        refreshed = await admin(app, "POST", f"/device-metadata/refresh/{instance_id}")
        assert refreshed.status_code == 502
        assert message(refreshed) == f"upstream answered 503 for /device-metadata/{instance_id}"
        assert (await get(app, ip, "/metadata")).json() == doc(instance_id)
        assert (await get(app, ip, "/latest/meta-data/instance-id")).text == instance_id


# --- the circuit breaker -------------------------------------------------------------------------------------


async def test_the_breaker_opens_fails_fast_and_closes_after_a_successful_trial(upstream, db_url):
    """3 failures open it (1); open: no call reaches the upstream; then one trial (2); its success closes it (0).

    The numbers are the imds_lookup_breaker_state gauge read from /metrics.
    """
    async with pull_app(upstream, db_url, lookup_breaker_failures=3, lookup_breaker_reset=0.2) as app:
        # The breaker's time stands still until the test moves it: the open phase lasts as long as it needs.
        assert app.services.lookup is not None
        clock = FakeClock(time.monotonic())
        app.services.lookup.breaker._clock = clock
        app.services.lookup.breaker._jitter = lambda: 1.0
        upstream.fail_all(500)
        for _ in range(3):
            answer = await get(app, next_ipv4(), "/metadata")
            assert (answer.status_code, message(answer)) == (502, "upstream answered 500 for /device-metadata")
        assert upstream.count() == 3
        assert (await scrape(app))["imds_lookup_breaker_state"] == 1.0

        # Open: fail fast, JSON and EC2 alike, without touching the upstream.
        fast = [await get(app, next_ipv4(), "/metadata") for _ in range(5)]
        assert {a.status_code for a in fast} == {502}
        assert all(message(a).startswith("upstream circuit breaker is open for ") for a in fast)
        ec2 = await get(app, next_ipv4(), "/latest/meta-data/instance-id")
        assert (ec2.status_code, ec2.text) == (502, "502 - Bad Gateway")
        assert upstream.count() == 3

        # After the reset interval: exactly one trial goes out (held at the fake while we look).
        trial_ip, instance_id = next_ipv4(), new_id()
        upstream.recover()
        upstream.put_metadata(instance_id, [trial_ip], doc(instance_id))
        upstream.hold()
        clock.advance(0.19)  # under the reset interval (0.2 s, jitter fixed at 1)... still open
        still_open = await get(app, next_ipv4(), "/metadata")
        assert message(still_open).startswith("upstream circuit breaker is open")
        clock.advance(0.1)  # ... and past it
        trial = asyncio.create_task(get(app, trial_ip, "/metadata"))
        await until(lambda: upstream.count() > 3, "the trial call")
        refused_while_open = 1
        assert upstream.count() == 4
        assert (await scrape(app))["imds_lookup_breaker_state"] == 2.0
        other = await get(app, next_ipv4(), "/metadata")
        assert (other.status_code, upstream.count()) == (502, 4)  # only one trial at a time
        upstream.release()
        answer = await trial
        assert (answer.status_code, answer.json()) == (200, doc(instance_id))
        assert (await scrape(app))["imds_lookup_breaker_state"] == 0.0

        # Closed again: misses go upstream.
        assert (await get(app, next_ipv4(), "/metadata")).status_code == 404
        assert upstream.count() == 5
        metrics = await scrape(app)
    assert metrics["metadata_lookup_request_total"] == 5.0
    assert metrics["metadata_lookup_error_total"] == 3 + 5 + 1 + 1 + refused_while_open


# --- credentials through the app -----------------------------------------------------------------------------


async def test_the_static_lookup_token_is_sent(upstream):
    """--lookup-token → Authorization: Bearer on every upstream call, with imds's User-Agent."""
    upstream.require_static_bearer("pull-token")
    ip, instance_id = next_ipv4(), new_id()
    upstream.put_metadata(instance_id, [ip], doc(instance_id))
    async with pull_app(upstream, lookup_token="pull-token") as app:
        assert (await get(app, ip, "/metadata")).json() == doc(instance_id)
        assert (await get(app, next_ipv4(), "/userdata")).status_code == 404
    assert [(c.headers["authorization"], c.headers["user-agent"]) for c in upstream.log()] == [
        ("Bearer pull-token", f"imds/{__version__}")
    ] * 2


async def test_oauth_client_credentials_through_the_app(upstream):
    """Discovery → token grant (basic auth, scope, audience) → bearer upstream calls; one 401 → renewed once."""
    upstream.enable_oauth("imds", "pull-secret", expires_in=3600)
    upstream.require_bearer()
    callers = {next_ipv4(): new_id() for _ in range(3)}
    for ip, instance_id in callers.items():
        upstream.put_metadata(instance_id, [ip], doc(instance_id))
    first, second, third = callers
    async with pull_app(upstream, lookup_oidc_issuer=upstream.issuer, lookup_client_id="imds",
                        lookup_client_secret="pull-secret", lookup_scope=("metadata:read",),
                        lookup_audience="source-of-truth") as app:
        assert (await get(app, first, "/metadata")).json() == doc(callers[first])
        assert (await get(app, second, "/metadata")).json() == doc(callers[second])
        upstream.revoke_tokens()
        assert (await get(app, third, "/metadata")).json() == doc(callers[third])
    assert [c.path for c in upstream.log("/oauth")] == [DISCOVERY_PATH, TOKEN_PATH, TOKEN_PATH]
    grant = upstream.log(TOKEN_PATH)[0]
    assert grant.basic_auth() == ("imds", "pull-secret")
    assert grant.form() == {"grant_type": "client_credentials", "scope": "metadata:read",
                            "audience": "source-of-truth"}
    assert [c.headers["authorization"] for c in upstream.log()] == [
        "Bearer access-1", "Bearer access-1", "Bearer access-1", "Bearer access-2",
    ]


# --- refresh endpoints ---------------------------------------------------------------------------------------


async def test_refresh_fetches_by_id_stores_and_answers_the_stored_value(upstream, db_url):
    """POST /device-{metadata,userdata}/refresh/{id}: fetched now, stored, served to the instance afterwards."""
    ip, instance_id = next_ipv4(), new_id()
    upstream.put_metadata(instance_id, [ip], doc(instance_id, hostname="v1"))
    upstream.put_userdata(instance_id, [ip], b"\x00\x01binary")
    async with pull_app(upstream, db_url) as app:
        refreshed = await admin(app, "POST", f"/device-metadata/refresh/{instance_id}")
        assert (refreshed.status_code, refreshed.json()) == (200, doc(instance_id, hostname="v1"))
        refreshed = await admin(app, "POST", f"/api/v1/device-userdata/refresh/{instance_id}")
        assert (refreshed.status_code, refreshed.content) == (200, b"\x00\x01binary")
        assert refreshed.headers["content-type"] == "application/octet-stream"
        assert (await get(app, ip, "/metadata")).json()["hostname"] == "v1"
        upstream.put_metadata(instance_id, [ip], doc(instance_id, hostname="v2"))
        assert (await admin(app, "POST", f"/device-metadata/refresh/{instance_id}")).json()["hostname"] == "v2"
        assert (await get(app, ip, "/metadata")).json()["hostname"] == "v2"
        assert (await get(app, ip, "/userdata")).content == b"\x00\x01binary"
    assert [c.target for c in upstream.log()] == [
        f"/device-metadata/{instance_id}", f"/device-userdata/{instance_id}", f"/device-metadata/{instance_id}",
    ]


async def test_refresh_of_what_the_upstream_lacks_is_404_and_bypasses_the_negative_cache(upstream, db_url):
    """Upstream 404 → 404 JSON; once the upstream has it, the next refresh fetches it (no negative caching)."""
    instance_id = new_id()
    async with pull_app(upstream, db_url, lookup_negative_ttl=60.0) as app:
        for kind in ("metadata", "userdata"):
            missing = await admin(app, "POST", f"/device-{kind}/refresh/{instance_id}")
            assert missing.status_code == 404
            assert message(missing) == f"no {kind} stored for instance {instance_id}"
        upstream.put_metadata(instance_id, [next_ipv4()], doc(instance_id))
        found = await admin(app, "POST", f"/device-metadata/refresh/{instance_id}")
        assert (found.status_code, found.json()) == (200, doc(instance_id))
    assert upstream.count() == 3


@pytest.mark.parametrize("failure", [500, "hang", 403])
async def test_refresh_when_the_upstream_fails_is_502(upstream, db_url, failure):
    """5xx, a timeout or a 4xx upstream answer → 502 JSON naming it; nothing stored."""
    instance_id = new_id()
    if failure == "hang":
        upstream.hang_all()
    else:
        upstream.fail_all(int(failure))
    # Only the hanging upstream needs a short timeout (it never answers, so that case cannot flake); an
    # upstream that answers gets a generous one, so a slow answer on a loaded machine is not a timeout.
    timeout = 0.2 if failure == "hang" else 30.0
    async with pull_app(upstream, db_url, lookup_timeout=timeout) as app:
        answer = await admin(app, "POST", f"/device-userdata/refresh/{instance_id}")
        assert answer.status_code == 502
        expected = ("upstream timed out after 0.2 s" if failure == "hang"
                    else f"upstream answered {failure} for /device-userdata/{instance_id}")
        assert message(answer) == expected
        assert await instances(app) == 0


async def test_refresh_without_an_upstream_is_409():
    """No --lookup-url → 409 JSON telling how to enable it."""
    async with pull_app(None) as app:
        answer = await admin(app, "POST", f"/device-metadata/refresh/{new_id()}")
    assert answer.status_code == 409
    assert message(answer) == "no upstream is configured: set --lookup-url / IMDS_LOOKUP_URL to enable refreshes"


async def test_refresh_needs_an_admin_token_and_a_uuid(upstream):
    """Without credentials 401 (no upstream call); a malformed id 400 naming the field."""
    async with pull_app(upstream) as app:
        async with client_from(app) as anonymous:
            unauthenticated = await anonymous.post(f"/device-metadata/refresh/{new_id()}")
        malformed = await admin(app, "POST", "/device-metadata/refresh/not-a-uuid")
    assert unauthenticated.status_code == 401
    assert unauthenticated.headers["www-authenticate"] == 'Bearer realm="imds"'
    assert malformed.status_code == 400
    assert malformed.json()["errors"][0]["field"] == "id"
    assert upstream.count("/") == 0


async def test_userdata_bytes_from_upstream_base64_round_trip(upstream):
    """Arbitrary bytes sent base64 by the upstream are served exactly (gzip magic included)."""
    ip, instance_id = next_ipv4(), new_id()
    payload = bytes(range(256))
    upstream.answer(f"/device-userdata?ip_address={ip}", 200,
                    {"id": instance_id, "ipAddresses": [ip], "userdata": base64.b64encode(payload).decode()})
    async with pull_app(upstream) as app:
        answer = await get(app, ip, "/userdata")
    assert (answer.content, answer.headers["content-type"]) == (payload, "application/octet-stream")
