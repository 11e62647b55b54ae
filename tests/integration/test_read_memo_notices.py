"""The read memo and notices whose window moves with the clock: a remembered read never outlives its moment.

In process over HTTP with an injected clock. The catalog's clock task resets an entry when
one of its notices changes on its own; a read arriving after that moment but before the
task has run must not be answered from what was remembered before it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import pytest

from factories import new_id
from helpers import ADMIN_TOKEN, FakeClock, admin_client, client_from, make_settings, push_record
from imds.app import build_app
from imds.web.instance import InstanceFront

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)
GUEST = "10.85.9.7"
SCHEDULED = "/latest/meta-data/events/maintenance/scheduled"


def _at(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_a_remembered_read_is_not_answered_past_its_notice_moment():
    """Active, read twice (remembered); the window ends: the next read is [] even before the clock task runs."""
    async with active_notice() as (app, clock), client_from(app, GUEST) as guest:
        for _ in range(3):  # the second and third are the memo's
            active = json.loads((await guest.get(SCHEDULED)).text)
            assert [(e["Description"], e["State"]) for e in active] == [("switch firmware", "active")]
        clock.now = (T0 + timedelta(hours=1)).timestamp()  # the window ends; no expire_notices() yet
        after = await guest.get(SCHEDULED)
    assert (after.status_code, after.text) == (200, "[]")


@pytest.mark.parametrize("path", ["/notices", "/openstack/latest/notices.json"])
async def test_the_notices_document_is_remembered_until_its_notice_moment(path):
    """The JSON/OpenStack notices document is remembered while current; past the window's end it says so at once."""
    async with active_notice() as (app, clock), client_from(app, GUEST) as guest:
        first = await guest.get(path)
        assert [n["state"] for n in first.json()["notices"]] == ["active"]
        remembered = app.remembered((GUEST, 40000), path, "GET", [(b"host", b"169.254.169.254")])
        assert remembered is not None
        assert remembered.body == first.content
        assert (await guest.get(path)).content == first.content
        clock.now = (T0 + timedelta(hours=1)).timestamp()  # the window ends; no expire_notices() yet
        assert app.remembered((GUEST, 40000), path, "GET", [(b"host", b"169.254.169.254")]) is None
        after = (await guest.get(path)).json()
    assert (after["notices"], [n["description"] for n in after["history"]]) == ([], ["switch firmware"])


@asynccontextmanager
async def active_notice() -> AsyncIterator[tuple[InstanceFront, FakeClock]]:
    """An app whose clock is five minutes into a maintenance window of GUEST's facility."""
    clock = FakeClock((T0 + timedelta(minutes=5)).timestamp())
    app = build_app(make_settings(), clock=clock)
    async with app.services.running():
        await push_record(app, [GUEST], {"id": new_id(), "hostname": "g", "project_id": "acme", "facility": "da11"})
        async with admin_client(app, ADMIN_TOKEN) as admin:
            notice = await admin.post("/device-notices", json={
                "facility": "da11", "kind": "maintenance", "time": _at(T0),
                "window_end": _at(T0 + timedelta(hours=1)), "description": "switch firmware"})
            assert notice.status_code == 200, notice.text
        yield app, clock
