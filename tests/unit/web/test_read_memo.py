"""The read memo in process (ASGI): when a read is answered from it, when it goes the whole way, what it replays.

Each test counts how often the flavor's handler runs for ``/metadata`` (a wrapper around
the front's dispatch entry): a remembered read does not call it. The answers themselves
are compared too, so a memo answering something else would fail here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from helpers import client_from, make_settings, push_record, running_app
from imds.web.instance import InstanceFront
from imds.web.routing import InstanceCall, Reply

pytestmark = pytest.mark.anyio
GUEST = "10.82.0.9"


@pytest.fixture
async def app() -> AsyncIterator[InstanceFront]:
    """The app with one instance at GUEST and a call counter on the ``/metadata`` handler."""
    async with running_app(make_settings()) as running:
        await push_record(running, [GUEST], {"id": "11111111-1111-4111-8111-111111111111", "hostname": "one"})
        handler = running._exact["/metadata"]
        running.calls = 0  # type: ignore[attr-defined]

        async def counted(call: InstanceCall) -> Reply:
            running.calls += 1  # type: ignore[attr-defined]
            return await handler(call)

        running._exact["/metadata"] = counted
        yield running


async def _read(app: InstanceFront, times: int = 3, **headers: str) -> list[str]:
    async with client_from(app, GUEST) as guest:
        return [(await guest.get("/metadata", headers=headers)).json()["hostname"] for _ in range(times)]


async def test_a_repeated_plain_read_runs_the_handler_once(app):
    """Three plain reads: the same answer three times, the handler ran for the first only."""
    assert await _read(app) == ["one"] * 3
    assert app.calls == 1


async def test_a_header_a_handler_may_read_goes_the_whole_way(app):
    """Any header outside the inert set (a forwarding one, a flavor one) runs the handler every time."""
    await _read(app, 2, **{"X-Forwarded-For": "10.0.0.1"})
    await _read(app, 2, Metadata="true")
    assert app.calls == 4


async def test_a_query_string_goes_the_whole_way(app):
    """A read with a query string (a watch, GCE's alt=json...) is never recalled."""
    async with client_from(app, GUEST) as guest:
        for _ in range(2):
            assert (await guest.get("/metadata", params={"x": "1"})).json()["hostname"] == "one"
    assert app.calls == 2


async def test_a_new_version_of_the_instance_is_read_afresh(app):
    """After a write the next read runs the handler again and answers the new document."""
    assert await _read(app) == ["one"] * 3
    await push_record(app, [GUEST], {"id": "11111111-1111-4111-8111-111111111111", "hostname": "two"})
    assert await _read(app) == ["two"] * 3
    assert app.calls == 2


async def test_hollow_counters_count_remembered_reads(app):
    """metadata_cache_hit counts every read, the remembered ones included."""
    reads = app.services.metrics.tally.reads
    before = reads[("metadata", True)]
    await _read(app, 4)
    assert reads[("metadata", True)] - before == 4
    assert app.calls == 1


async def test_the_head_of_a_remembered_read_is_the_first_one(app):
    """A remembered answer carries the same ETag, type and length as the first."""
    async with client_from(app, GUEST) as guest:
        first, second = (await guest.get("/metadata")), (await guest.get("/metadata"))
    assert app.calls == 1
    for name in ("etag", "content-type", "content-length"):
        assert first.headers[name] == second.headers[name]
    assert first.content == second.content


@pytest.mark.parametrize("value", ["{etag}", "W/{etag}", '"other", {etag}', "*"])
async def test_if_none_match_naming_the_etag_is_304(app, value):
    """The current ETag (strong, weak, in a list, or *) answers 304 with the ETag and no body."""
    async with client_from(app, GUEST) as guest:
        etag = (await guest.get("/metadata")).headers["etag"]
        answer = await guest.get("/metadata", headers={"If-None-Match": value.format(etag=etag)})
    assert (answer.status_code, answer.content, answer.headers["etag"]) == (304, b"", etag)
    assert "content-length" not in answer.headers


async def test_if_none_match_naming_another_etag_is_the_document(app):
    """An ETag that is not the current one answers 200 with the document."""
    async with client_from(app, GUEST) as guest:
        answer = await guest.get("/metadata", headers={"If-None-Match": '"not-it"'})
    assert (answer.status_code, answer.json()["hostname"]) == (200, "one")


async def test_the_catalog_version_moves_with_every_placed_or_dropped_entry(app):
    """A write and a delete each move Catalog.version (what the memo's caller cache checks)."""
    catalog = app.services.catalog
    before = catalog.version
    instance_id = await push_record(app, ["10.82.0.10"])
    written = catalog.version
    assert written > before
    async with client_from(app, "192.0.2.250", token="test-admin-token") as admin:
        assert (await admin.delete(f"/device-metadata/{instance_id}")).status_code == 200
    assert catalog.version > written


FLAVOR = (b"metadata-flavor", b"Google")
HOSTNAME = "/computeMetadata/v1/instance/hostname"


async def test_a_gce_read_is_remembered_under_its_metadata_flavor_value(app):
    """GCE's reads carry Metadata-Flavor: Google: kept under the path and that value, recalled only with it."""
    host = (GUEST, 40000)
    assert app.remembered(host, HOSTNAME, "GET", [FLAVOR]) is None
    async with client_from(app, GUEST) as guest:
        first = await guest.get(HOSTNAME, headers={"Metadata-Flavor": "Google"})
        assert (first.status_code, first.text) == (200, "one")
        found = app.remembered(host, HOSTNAME, "GET", [(b"host", b"metadata.google.internal"), FLAVOR])
        assert found is not None
        assert found.body == b"one"
        kept = dict(found.headers)
        assert (kept[b"metadata-flavor"], kept[b"etag"].decode()) == (b"Google", first.headers["etag"])
        assert app.again(host, HOSTNAME, found)
        for headers in ([], [(b"metadata-flavor", b"google")], [FLAVOR, FLAVOR], [FLAVOR, (b"metadata", b"true")]):
            assert app.remembered(host, HOSTNAME, "GET", headers) is None, headers
        refused = await guest.get(HOSTNAME)  # no header: GCE's 403, never the kept 200
        assert refused.status_code == 403
        await push_record(app, [GUEST], {"id": "11111111-1111-4111-8111-111111111111", "hostname": "two"})
        assert app.remembered(host, HOSTNAME, "GET", [FLAVOR]) is None  # a new version: read afresh
        assert (await guest.get(HOSTNAME, headers={"Metadata-Flavor": "Google"})).text == "two"


async def test_a_guarded_read_kept_with_a_flavor_header_is_never_recalled_without_it():
    """--instance-auth json: a read with Metadata-Flavor is kept under that value; a plain read stays 401."""
    async with running_app(make_settings(instance_auth=("json",))) as running:
        await push_record(running, [GUEST], {"id": "11111111-1111-4111-8111-111111111111", "hostname": "one"})
        async with client_from(running, GUEST) as guest:
            for _ in range(2):
                allowed = await guest.get("/metadata", headers={"Metadata-Flavor": "imds"})
                assert allowed.json()["hostname"] == "one"
            assert running.remembered((GUEST, 1), "/metadata", "GET", [(b"metadata-flavor", b"imds")]) is not None
            assert running.remembered((GUEST, 1), "/metadata", "GET", []) is None
            assert (await guest.get("/metadata")).status_code == 401


async def test_answers_kept_for_many_instances_share_what_is_equal(app):
    """Two instances' kept answers of one path hold one key and one content-type pair, each its own ETag."""
    other = "10.82.0.11"
    await push_record(app, [other], {"id": "44444444-4444-4444-8444-444444444444", "hostname": "two"})
    path = "/latest/meta-data/hostname"
    for source in (GUEST, other):
        async with client_from(app, source) as guest:
            assert (await guest.get(path)).status_code == 200
    one, two = (app.remembered((source, 1), path, "GET", []) for source in (GUEST, other))
    assert one is not None
    assert two is not None
    assert (one.body, two.body) == (b"one", b"two")
    assert one.key is two.key
    assert dict(one.headers)[b"etag"] != dict(two.headers)[b"etag"]
    assert next(p for p in one.headers if p[0] == b"content-type") is next(
        p for p in two.headers if p[0] == b"content-type")
