"""ETags on instance documents and ``?wait_for_change=true`` (GCE's change watch), in-process.

A held request returns when the instance changes (a write on this replica), at once when
``last_etag`` is not the current one, and with the current value when its timeout passes.
The cross-replica case runs against real processes in ``test_channel_serve.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from factories import new_id
from helpers import admin_client, client_from, make_settings, push_record, running_app, wait_for_async
from imds.web.instance import InstanceFront

pytestmark = pytest.mark.anyio

GUEST = "10.81.1.7"
WAIT_BOUND = 10.0  # seconds a test waits for something that should happen at once
DOCUMENTS = ("/metadata", "/userdata", "/latest/meta-data/hostname", "/openstack/latest/meta_data.json")


async def push(app: InstanceFront, instance_id: str, hostname: str) -> None:
    """The instance's hostname (and userdata) become ``hostname``."""
    await push_record(app, [GUEST], {"hostname": hostname}, f"#!/bin/sh\n# {hostname}", instance_id=instance_id)


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[InstanceFront]:
    """The app on each store kind, with one instance at GUEST."""
    async with running_app(make_settings(db=db_url, watch_max_timeout=60)) as running:
        running.instance_id = new_id()  # type: ignore[attr-defined]
        await push(running, running.instance_id, "before")  # type: ignore[attr-defined]
        yield running


async def read(app: InstanceFront, path: str, **params: Any) -> httpx.Response:
    async with client_from(app, GUEST, timeout=WAIT_BOUND * 3) as guest:
        return await guest.get(path, params=params)


async def waiting(app: InstanceFront, instance_id: str, count: int = 1) -> None:
    """Until ``count`` requests are held on the instance's catalog entry (bounded)."""

    def held() -> bool:
        entry = app.services.catalog.get(instance_id)
        return entry is not None and len(entry.waiters or ()) >= count

    await wait_for_async(held, what=f"{count} change-watch request(s) held", timeout=WAIT_BOUND)


async def test_every_document_has_a_stable_strong_etag_that_changes_with_the_instance(app):
    """JSON, EC2 and OpenStack reads carry the instance version's strong ETag; a write changes it."""
    first = {path: (await read(app, path)).headers.get("etag") for path in DOCUMENTS}
    assert all(tag and tag.startswith('"') and tag.endswith('"') for tag in first.values()), first
    assert len(set(first.values())) == 1  # one version of one instance
    assert {path: (await read(app, path)).headers.get("etag") for path in DOCUMENTS} == first
    await push(app, app.instance_id, "after")
    changed = (await read(app, "/metadata")).headers["etag"]
    assert changed != first["/metadata"]
    async with client_from(app, "10.81.9.9") as stranger:
        assert "etag" not in (await stranger.get("/metadata")).headers


async def test_a_held_request_returns_when_the_instance_changes(app):
    """wait_for_change holds /metadata until a write, then answers the new document and ETag."""
    before = await read(app, "/metadata")
    etag = before.headers["etag"]
    held = asyncio.create_task(read(app, "/metadata", wait_for_change="true", last_etag=etag, timeout_sec=50))
    await waiting(app, app.instance_id)
    assert not held.done()
    await push(app, app.instance_id, "after")
    answer = await asyncio.wait_for(held, WAIT_BOUND)
    assert answer.status_code == 200
    assert answer.json()["hostname"] == "after"
    assert answer.headers["etag"] not in (etag, None)
    assert app.services.catalog.get(app.instance_id).waiters is None  # nothing left behind


async def test_every_flavor_can_wait(app):
    """EC2, OpenStack and userdata reads wait too; one write to the instance wakes all of them.

    The ETag is the instance's, not one document's: the metadata write that ``push`` makes
    first wakes the userdata read too, which answers the (unchanged) userdata with the new ETag.
    """
    etag = (await read(app, "/metadata")).headers["etag"]
    paths = ("/userdata", "/latest/meta-data/hostname", "/openstack/latest/meta_data.json")
    held = [asyncio.create_task(read(app, p, wait_for_change="true", last_etag=etag)) for p in paths]
    await waiting(app, app.instance_id, count=3)
    await push(app, app.instance_id, "after")
    answers = await asyncio.wait_for(asyncio.gather(*held), WAIT_BOUND)
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert {a.headers["etag"] for a in answers} != {etag}
    assert answers[0].text.startswith("#!/bin/sh")
    assert answers[1].text == "after"
    assert answers[2].json()["hostname"] == "after"


async def test_without_last_etag_it_waits_for_the_next_change(app):
    """No last_etag: the version current when the request came is the one it waits to see change."""
    held = asyncio.create_task(read(app, "/metadata", wait_for_change="true", timeout_sec=50))
    await waiting(app, app.instance_id)
    await push(app, app.instance_id, "after")
    assert (await asyncio.wait_for(held, WAIT_BOUND)).json()["hostname"] == "after"


async def test_a_different_last_etag_answers_at_once(app):
    """An outdated last_etag gets the current value right away (no request is held)."""
    answer = await asyncio.wait_for(
        read(app, "/metadata", wait_for_change="true", last_etag='"outdated"', timeout_sec=50), WAIT_BOUND
    )
    assert answer.status_code == 200
    assert answer.json()["hostname"] == "before"


async def test_the_timeout_answers_the_current_value(app):
    """Nothing changes within timeout_sec=1: 200 with the same document and ETag."""
    before = await read(app, "/metadata")
    answer = await read(app, "/metadata", wait_for_change="true", last_etag=before.headers["etag"], timeout_sec=1)
    assert (answer.status_code, answer.content, answer.headers["etag"]) == (200, before.content, before.headers["etag"])
    assert app.services.catalog.get(app.instance_id).waiters in (None, set())


async def test_an_unrelated_instance_does_not_wake_the_request(app):
    """A write to another instance leaves the held request waiting (then its timeout answers)."""
    etag = (await read(app, "/metadata")).headers["etag"]
    held = asyncio.create_task(read(app, "/metadata", wait_for_change="true", last_etag=etag, timeout_sec=2))
    await waiting(app, app.instance_id)
    async with admin_client(app) as admin:
        other = await admin.post("/device-metadata", json={"id": new_id(), "ipAddresses": ["10.81.2.2"],
                                                           "metadata": {"hostname": "other"}})
    assert other.status_code == 200
    assert not held.done()
    answer = await asyncio.wait_for(held, WAIT_BOUND)
    assert (answer.json()["hostname"], answer.headers["etag"]) == ("before", etag)


async def test_bad_watch_parameters_are_400_naming_them(app):
    """timeout_sec out of range or not a number, wait_for_change not a boolean: 400 with the field."""
    for params, field in (
        ({"wait_for_change": "true", "timeout_sec": "0"}, "timeout_sec"),
        ({"wait_for_change": "true", "timeout_sec": "61"}, "timeout_sec"),
        ({"wait_for_change": "true", "timeout_sec": "soon"}, "timeout_sec"),
        ({"wait_for_change": "maybe"}, "wait_for_change"),
    ):
        answer = await read(app, "/metadata", **params)
        assert answer.status_code == 400, (params, answer.text)
        assert [e["field"] for e in answer.json()["errors"]] == [field]
    plain = await read(app, "/metadata", wait_for_change="false", other="1")
    assert (plain.status_code, plain.json()["hostname"]) == (200, "before")


async def test_a_client_that_disconnects_frees_its_held_request(app):
    """The ASGI receive channel says http.disconnect: the hold ends at once, nothing stays registered."""
    etag = (await read(app, "/metadata")).headers["etag"]
    left = asyncio.Event()
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if not sent and not left.is_set() and not getattr(receive, "asked", False):
            receive.asked = True  # type: ignore[attr-defined]
            return {"type": "http.request", "body": b"", "more_body": False}
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "method": "GET", "path": "/metadata", "headers": [], "client": (GUEST, 40000),
        "query_string": f"wait_for_change=true&last_etag={etag}&timeout_sec=50".encode(),
    }
    held = asyncio.create_task(app(scope, receive, send))
    await waiting(app, app.instance_id)
    assert app.services.metrics.watch_waiting._value.get() == 1
    left.set()
    await asyncio.wait_for(held, WAIT_BOUND)
    assert app.services.catalog.get(app.instance_id).waiters in (None, set())
    assert app.services.metrics.watch_waiting._value.get() == 0
    assert sent[0]["status"] == 200  # what it would have got: the current document


async def test_a_cancelled_held_read_gives_its_per_source_slot_back(app):
    """The per-source in-flight count (``--max-requests-per-source``) drops back to 0 when a held read is cancelled."""
    etag = (await read(app, "/metadata")).headers["etag"]
    held = asyncio.create_task(read(app, "/metadata", wait_for_change="true", last_etag=etag, timeout_sec="60"))
    await waiting(app, app.instance_id)
    assert app._in_flight.held(GUEST) == 1
    held.cancel()
    with pytest.raises(asyncio.CancelledError):
        await held
    assert (app._in_flight.held(GUEST), len(app._in_flight)) == (0, 0)
