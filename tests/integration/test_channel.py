"""The instance<->host channel through HTTP, on memory://, SQLite and PostgreSQL.

Events (``/events``, ``/phone-home``, ``/ganeti/<v>/write``) are validated, rate-limited
per instance (an injected clock), stored with increasing cursors and paged by the host;
messages the host queues are read once by the instance, also under concurrent reads and
across two replicas sharing one database.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import httpx
import pytest

from factories import new_id
from helpers import FakeClock, admin_client, client_from, make_settings, push_record, running_app
from imds.services.channel import RateLimiter
from imds.store import open_store
from imds.web.instance import InstanceFront

pytestmark = pytest.mark.anyio

GUEST = "10.80.1.7"
STRANGER = "10.80.9.9"


async def guest_post(app: InstanceFront, path: str, body: Any, ip: str = GUEST, **kwargs: Any) -> httpx.Response:
    async with client_from(app, ip) as guest:
        if isinstance(body, bytes):
            return await guest.post(path, content=body, **kwargs)
        return await guest.post(path, json=body, **kwargs)


async def installing(app: InstanceFront, instance_id: str) -> None:
    """Give the instance an OS record in install mode: /ganeti/<v>/read and /write answer only then."""
    async with admin_client(app) as admin:
        answer = await admin.post("/device-os", json={"id": instance_id, "os_type": "tiny", "mode": "install"})
    assert answer.status_code == 200, answer.text


async def events_of(app: InstanceFront, instance_id: str, after: int = 0) -> dict[str, Any]:
    async with admin_client(app) as admin:
        answer = await admin.get(f"/device-events/{instance_id}", params={"after": after})
    assert answer.status_code == 200, answer.text
    page: dict[str, Any] = answer.json()
    return page


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[InstanceFront]:
    """The app on each store kind, with a generous rate limit."""
    async with running_app(make_settings(db=db_url, event_burst=100)) as running:
        yield running


async def test_events_are_stored_with_increasing_cursors_and_paged(app):
    """Three posts come back in order with increasing cursors; ``after`` pages; the host sees each field."""
    instance_id = await push_record(app, [GUEST], {"hostname": "guest"})
    await installing(app, instance_id)
    posted = [
        await guest_post(app, "/events", {"state": "installing"}),
        await guest_post(app, "/events", {"state": "progress", "code": 40, "message": "copying the image"}),
        await guest_post(app, "/ganeti/latest/write", {"state": "installed", "code": 0}),
    ]
    assert [p.status_code for p in posted] == [200, 200, 200], [p.text for p in posted]
    cursors = [p.json()["cursor"] for p in posted]
    assert cursors == sorted(cursors)
    assert len(set(cursors)) == 3
    page = await events_of(app, instance_id)
    assert [(e["state"], e["code"], e["message"]) for e in page["events"]] == [
        ("installing", None, None), ("progress", 40, "copying the image"), ("installed", 0, None),
    ]
    assert [e["cursor"] for e in page["events"]] == cursors
    assert {e["instance_id"] for e in page["events"]} == {instance_id}
    assert page["cursor"] == cursors[-1]
    later = await events_of(app, instance_id, after=cursors[0])
    assert [e["state"] for e in later["events"]] == ["progress", "installed"]
    done = await events_of(app, instance_id, after=cursors[-1])
    assert (done["events"], done["cursor"]) == ([], cursors[-1])


async def test_phone_home_marks_the_instance_booted(app):
    """cloud-init's phone_home posts a form; the host sees a ``booted`` event."""
    instance_id = await push_record(app, [GUEST], {"hostname": "guest"})
    answer = await guest_post(
        app, "/phone-home", b"instance_id=i-1&hostname=guest",
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["state"] == "booted"
    assert [e["state"] for e in (await events_of(app, instance_id))["events"]] == ["booted"]


async def test_unknown_callers_wrong_methods_and_bad_bodies(app):
    """404 for an unknown caller, 405 for a GET, 400 naming each bad field, 413 over the size cap; nothing stored."""
    instance_id = await push_record(app, [GUEST], {"hostname": "guest"})
    assert (await guest_post(app, "/events", {"state": "x"}, ip=STRANGER)).status_code == 404
    async with client_from(app, GUEST) as guest:
        wrong = await guest.get("/events")
    assert (wrong.status_code, wrong.headers["allow"]) == (405, "POST")
    cases = [
        ({"code": 1}, {"state"}),
        ({"state": "bad state!"}, {"state"}),
        ({"state": "ok", "code": "1"}, {"code"}),
        ({"state": "ok", "code": True}, {"code"}),
        ({"state": "ok", "message": 5}, {"message"}),
        ({"state": "ok", "extra": 1}, {"extra"}),
        ([1, 2], {"body"}),
        (b"{not json", {"body"}),
    ]
    for body, fields in cases:
        answer = await guest_post(app, "/events", body)
        assert answer.status_code == 400, (body, answer.text)
        assert {e["field"] for e in answer.json()["errors"]} == fields, (body, answer.text)
    too_big = await guest_post(app, "/events", {"state": "ok", "message": "x" * 5000})
    assert too_big.status_code == 413, too_big.text
    assert (await events_of(app, instance_id))["events"] == []


async def test_the_rate_limit_answers_429_with_retry_after():
    """Burst 2 at 0.5/s: the third post is 429 (Retry-After: 2); two seconds later one more is allowed."""
    clock = FakeClock()
    async with running_app(make_settings(event_rate=0.5, event_burst=2)) as app:
        app.services.channel.limiter = RateLimiter(0.5, 2, clock)
        instance_id = await push_record(app, [GUEST], {"hostname": "guest"})
        other = await push_record(app, [STRANGER], {"hostname": "guest"})
        assert [(await guest_post(app, "/events", {"state": f"s{i}"})).status_code for i in range(2)] == [200, 200]
        limited = await guest_post(app, "/events", {"state": "s2"})
        assert (limited.status_code, limited.headers["retry-after"]) == (429, "2"), limited.text
        assert "too many requests" in limited.json()["message"]
        # each instance has its own bucket
        assert (await guest_post(app, "/phone-home", b"", ip=STRANGER)).status_code == 200
        clock.now += 1.0
        assert (await guest_post(app, "/events", {"state": "s3"})).status_code == 429
        clock.now += 1.0
        assert (await guest_post(app, "/events", {"state": "s4"})).status_code == 200
        assert [e["state"] for e in (await events_of(app, instance_id))["events"]] == ["s0", "s1", "s4"]
        assert [e["state"] for e in (await events_of(app, other))["events"]] == ["booted"]


async def test_retention_keeps_the_newest_events(db_url):
    """With --event-retain 3, five posts leave the newest three."""
    async with running_app(make_settings(db=db_url, event_retain=3)) as app:
        instance_id = await push_record(app, [GUEST], {"hostname": "guest"})
        for n in range(5):
            assert (await guest_post(app, "/events", {"state": f"s{n}"})).status_code == 200
        assert [e["state"] for e in (await events_of(app, instance_id))["events"]] == ["s2", "s3", "s4"]


async def test_a_queued_message_is_read_once(app):
    """POST /device-messages queues bytes; /ganeti/<v>/read returns them in order, each once, then 404."""
    instance_id = await push_record(app, [GUEST], {"hostname": "guest"})
    await installing(app, instance_id)
    async with admin_client(app) as admin:
        for body in (b"first", b'{"second": true}'):
            queued = await admin.post(f"/device-messages/{instance_id}", content=body)
            assert queued.status_code == 200, queued.text
            assert queued.json()["size"] == len(body)
        missing = await admin.post(f"/device-messages/{new_id()}", content=b"to nobody")
        assert missing.status_code == 404
        too_big = await admin.post(f"/device-messages/{instance_id}", content=b"x" * 70000)
        assert too_big.status_code == 413
    async with client_from(app, GUEST) as guest:
        reads = [await guest.get("/ganeti/latest/read") for _ in range(3)]
        other = await guest.get("/ganeti/latest/read", headers={})
        assert (await guest.post("/ganeti/latest/read")).status_code == 405
        assert (await guest.get("/ganeti/latest/nothing")).status_code == 404
    assert [(r.status_code, r.content) for r in reads[:2]] == [(200, b"first"), (200, b'{"second": true}')]
    assert "etag" not in reads[0].headers
    assert reads[2].status_code == 404
    assert "no message" in reads[2].json()["message"]
    assert other.status_code == 404
    async with client_from(app, STRANGER) as stranger:
        assert (await stranger.get("/ganeti/latest/read")).status_code == 404


async def test_the_message_queue_is_bounded(db_url):
    """With --message-max-queued 2 the third message is 409 on every store; reading one makes room."""
    async with running_app(make_settings(db=db_url, message_max_queued=2)) as app, admin_client(app) as admin:
        instance_id = await push_record(app, [GUEST], {"hostname": "guest"})
        await installing(app, instance_id)
        other = await push_record(app, [STRANGER], {"hostname": "guest"})
        statuses = [(await admin.post(f"/device-messages/{instance_id}", content=b"m%d" % n)).status_code
                    for n in range(3)]
        assert statuses == [200, 200, 409]
        assert "already has 2 unread messages" in (await admin.post(f"/device-messages/{instance_id}",
                                                                    content=b"m")).json()["message"]
        # The cap is per instance: another instance's queue is still empty.
        assert (await admin.post(f"/device-messages/{other}", content=b"o")).status_code == 200
        async with client_from(app, GUEST) as guest:
            assert (await guest.get("/ganeti/latest/read")).content == b"m0"
            assert (await admin.post(f"/device-messages/{instance_id}", content=b"m3")).status_code == 200
            assert (await admin.post(f"/device-messages/{instance_id}", content=b"m4")).status_code == 409
            # Only the accepted messages were stored: the refused ones left nothing behind.
            reads = [await guest.get("/ganeti/latest/read") for _ in range(3)]
        assert [(r.status_code, r.content if r.status_code == 200 else b"") for r in reads] == [
            (200, b"m1"), (200, b"m3"), (404, b"")]


@pytest.mark.stores("sqlite", "postgres")  # one database two replicas share
async def test_the_message_cap_holds_across_replicas_of_one_database(db_url):
    """Two replicas sharing one SQL database count the same queue: the cap is the store's, not a replica's."""
    settings = make_settings(db=db_url, message_max_queued=2)
    async with AsyncExitStack() as stack:
        apps = [await stack.enter_async_context(running_app(settings, store=open_store(db_url))) for _ in range(2)]
        instance_id = await push_record(apps[0], [GUEST], {"hostname": "guest"})
        await apps[1].services.catalog.refresh([instance_id])
        admins = [await stack.enter_async_context(admin_client(app)) for app in apps]
        statuses = [(await admins[n % 2].post(f"/device-messages/{instance_id}", content=b"m")).status_code
                    for n in range(4)]
    assert statuses == [200, 200, 409, 409]


async def test_the_admin_side_needs_scopes(app):
    """No token: 401 on events and messages."""
    instance_id = await push_record(app, [GUEST], {"hostname": "guest"})
    async with client_from(app) as anonymous:
        assert (await anonymous.get(f"/device-events/{instance_id}")).status_code == 401
        assert (await anonymous.post(f"/device-messages/{instance_id}", content=b"m")).status_code == 401
        assert (await anonymous.get(f"/device-events/{instance_id}/stream")).status_code == 401


@pytest.mark.stores("sqlite", "postgres")  # one database two replicas share
async def test_concurrent_reads_across_two_replicas_take_each_message_once(db_url):
    """30 messages, 60 concurrent reads through two replicas of one database: each message is read exactly once."""
    settings = make_settings(db=db_url)
    async with AsyncExitStack() as stack:
        apps = [await stack.enter_async_context(running_app(settings, store=open_store(db_url))) for _ in range(2)]
        instance_id = await push_record(apps[0], [GUEST], {"hostname": "guest"})
        await installing(apps[0], instance_id)
        await apps[1].services.catalog.refresh([instance_id])
        sent = [f"message-{n}".encode() for n in range(30)]
        async with admin_client(apps[0]) as admin:
            for body in sent:
                assert (await admin.post(f"/device-messages/{instance_id}", content=body)).status_code == 200
        guests = [await stack.enter_async_context(client_from(app, GUEST)) for app in apps]
        answers = await asyncio.gather(*(guests[n % 2].get("/ganeti/latest/read") for n in range(60)))
    taken = [a.content for a in answers if a.status_code == 200]
    assert sorted(taken) == sorted(sent)
    assert sorted(a.status_code for a in answers) == [200] * 30 + [404] * 30


@pytest.mark.stores("sqlite", "postgres")  # one database two replicas share
async def test_a_cursor_reader_misses_no_event_of_concurrent_writers_on_two_stores(db_url):
    """Two stores append 40 events each for one instance at once; a reader paging with ``after`` sees all."""
    stores = [open_store(db_url), open_store(db_url)]
    instance_id = new_id()
    try:
        seen: list[int] = []
        writing = True

        async def reader() -> None:
            cursor = 0
            while writing or (await stores[1].events_after(instance_id, cursor, 1000)):
                for event in await stores[1].events_after(instance_id, cursor, 1000):
                    assert event.cursor > cursor
                    seen.append(event.cursor)
                    cursor = event.cursor
                await asyncio.sleep(0)

        async def writer(n: int) -> list[int]:
            return [
                (await stores[n].append_event(instance_id, f"w{n}-{i}", i, None, retain=1000)).cursor for i in range(40)
            ]

        reading = asyncio.create_task(reader())
        written = await asyncio.gather(writer(0), writer(1))
        writing = False
        await asyncio.wait_for(reading, 30)
        assert sorted(seen) == sorted(written[0] + written[1])
        stored = await stores[0].events_after(instance_id, 0, 1000)
        assert [e.cursor for e in stored] == sorted(seen)
        assert len(stored) == 80
    finally:
        for store in stores:
            await store.close()
