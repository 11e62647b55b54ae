"""Lifecycle notices through the admin API, in process, with an injected clock.

``POST``/``GET``/``PATCH``/``DELETE /device-notices``: validation naming the field (nothing
written), the body limit, scopes of kind ``notice``, the audit log, history as the clock
passes, and a guest's acknowledgement posted through the channel (``POST /events``) that the
admin API then shows.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from factories import new_id
from helpers import ADMIN_TOKEN, FakeClock, admin_client, client_from, make_settings, push_record
from imds.app import build_app
from imds.web.instance import InstanceFront

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)
GUEST, NEIGHBOUR, STRANGER = "10.84.1.7", "10.84.1.8", "10.84.2.7"
NOTICES = "/device-notices"


def at(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class Fleet:
    """The app, its clock and three instances: two in project acme (facilities da11, ny5), one elsewhere."""

    def __init__(self, app: InstanceFront, clock: FakeClock) -> None:
        self.app = app
        self.clock = clock
        self.ids: dict[str, str] = {}

    async def admin(self, method: str, path: str, token: str = ADMIN_TOKEN, **kwargs: Any) -> httpx.Response:
        async with admin_client(self.app, token) as client:
            return await client.request(method, path, **kwargs)

    async def create(self, **body: Any) -> dict[str, Any]:
        answer = await self.admin("POST", NOTICES, json=body)
        assert answer.status_code == 200, answer.text
        created: dict[str, Any] = answer.json()
        return created

    async def ack(self, notice_id: str, ip: str = GUEST) -> httpx.Response:
        async with client_from(self.app, ip) as guest:
            return await guest.post("/events", json={"state": "notice-ack", "message": notice_id})


async def fleet_with(settings: Any = None) -> AsyncIterator[Fleet]:
    clock = FakeClock((T0 - timedelta(hours=1)).timestamp())
    app = build_app(settings or make_settings(event_burst=100), clock=clock)
    async with app.services.running():
        fleet = Fleet(app, clock)
        for name, ip, project, facility in (("guest", GUEST, "acme", "da11"), ("neighbour", NEIGHBOUR, "acme", "ny5"),
                                            ("stranger", STRANGER, "other", "da11")):
            instance_id = new_id()
            await push_record(app, [ip], {"id": instance_id, "project_id": project, "facility": facility})
            fleet.ids[name] = instance_id
        yield fleet


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    async for made in fleet_with():
        yield made


async def test_create_read_change_delete(fleet):
    """A notice is stored with an id and revision 1; a change bumps it; a delete removes it; then 404."""
    created = await fleet.create(project_id="acme", kind="maintenance", time=at(T0),
                                 window_end=at(T0 + timedelta(hours=2)), description="host kernel update")
    assert len(created["id"]) == 17
    assert {k: created[k] for k in ("scope", "project_id", "kind", "state", "history", "revision", "time",
                                    "window_end", "description", "acknowledgements")} == {
        "scope": "project", "project_id": "acme", "kind": "maintenance", "state": "scheduled", "history": False,
        "revision": 1, "time": "2026-12-01T02:00:00Z", "window_end": "2026-12-01T04:00:00Z",
        "description": "host kernel update", "acknowledgements": []}
    path = f"{NOTICES}/{created['id']}"
    assert (await fleet.admin("GET", path)).json() == created
    head = await fleet.admin("HEAD", path)
    assert (head.status_code, head.content) == (200, b"")
    moved = await fleet.admin("PATCH", path, json={"time": at(T0 + timedelta(hours=1)),
                                                   "window_end": at(T0 + timedelta(hours=3))})
    assert moved.status_code == 200, moved.text
    assert (moved.json()["revision"], moved.json()["time"]) == (2, "2026-12-01T03:00:00Z")
    deleted = await fleet.admin("DELETE", path)
    assert (deleted.status_code, deleted.json()) == (200, {"id": created["id"], "deleted": "notice"})
    assert (await fleet.admin("GET", path)).status_code == 404
    assert (await fleet.admin("DELETE", path)).status_code == 404
    assert (await fleet.admin("PATCH", path, json={"state": "active"})).status_code == 404


async def test_the_clock_moves_a_notice_to_history(fleet):
    """Scheduled → active when its time comes → completed (history) once its window closed; filters follow."""
    created = await fleet.create(facility="da11", kind="maintenance", time=at(T0),
                                 window_end=at(T0 + timedelta(hours=1)))
    path = f"{NOTICES}/{created['id']}"

    async def state() -> tuple[str, bool]:
        shown = (await fleet.admin("GET", path)).json()
        return shown["state"], shown["history"]

    assert await state() == ("scheduled", False)
    fleet.clock.now = (T0 + timedelta(minutes=1)).timestamp()
    assert await state() == ("active", False)
    fleet.clock.now = (T0 + timedelta(hours=1)).timestamp()
    assert await state() == ("completed", True)
    assert [n["id"] for n in (await fleet.admin("GET", NOTICES, params={"history": "true"})).json()["notices"]] == [
        created["id"]]
    assert (await fleet.admin("GET", NOTICES, params={"history": "false"})).json()["notices"] == []
    conflict = await fleet.admin("PATCH", path, json={"state": "canceled"})
    assert conflict.status_code == 200  # its stored state is still scheduled: the host may still record the outcome
    again = await fleet.admin("PATCH", path, json={"description": "too late"})
    assert again.status_code == 409, again.text  # canceled is final


async def test_listing_filters_by_whom_a_notice_reaches(fleet):
    """?instance_id= lists the instance's own, its project's and its facility's notices; other filters exact."""
    own = await fleet.create(instance_id=fleet.ids["guest"], kind="stop", time=at(T0))
    project = await fleet.create(project_id="acme", kind="reboot", time=at(T0 + timedelta(hours=1)))
    facility = await fleet.create(facility="da11", kind="rebalance", time=at(T0 - timedelta(minutes=5)))
    other = await fleet.create(project_id="other", kind="lifecycle", time=at(T0), target_state="Terminated")

    async def ids(**params: str) -> list[str]:
        answer = await fleet.admin("GET", NOTICES, params=params)
        assert answer.status_code == 200, answer.text
        return [n["id"] for n in answer.json()["notices"]]

    assert await ids(instance_id=fleet.ids["guest"]) == [facility["id"], own["id"], project["id"]]
    assert await ids(instance_id=fleet.ids["neighbour"]) == [project["id"]]
    assert await ids(instance_id=fleet.ids["stranger"]) == [facility["id"], other["id"]]
    assert await ids(project_id="acme") == [project["id"]]
    assert await ids(facility="da11") == [facility["id"]]
    assert await ids(kind="lifecycle") == [other["id"]]
    assert len(await ids()) == 4
    for params, field in (({"kind": "nap"}, "kind"), ({"instance_id": "nope"}, "instance_id"),
                          ({"project_id": "Bad Name"}, "project_id"), ({"facility": "a b"}, "facility")):
        bad = await fleet.admin("GET", NOTICES, params=params)
        assert (bad.status_code, bad.json()["errors"][0]["field"]) == (400, field)
    missing = await fleet.admin("GET", NOTICES, params={"instance_id": new_id()})
    assert missing.status_code == 404


GOOD = {"project_id": "acme", "kind": "maintenance", "time": at(T0), "window_end": at(T0 + timedelta(hours=1))}


@pytest.mark.parametrize(("change", "field"), [
    ({"kind": "nap"}, "kind"),
    ({"kind": None}, "kind"),
    ({"time": "2026-12-01 02:00"}, "time"),
    ({"time": "2026-12-01T02:00:00"}, "time"),  # no time zone
    ({"time": "1999-12-31T23:00:00Z"}, "time"),
    ({"window_end": at(T0)}, "window_end"),  # not after time
    ({"window_end": None}, "window_end"),  # maintenance needs a window
    ({"state": "canceled"}, "state"),  # a new notice is scheduled or active
    ({"description": "x" * 256}, "description"),
    ({"description": "\ud800"}, "description"),
    ({"target_state": "InService"}, "target_state"),  # only for lifecycle
    ({"kind": "lifecycle", "window_end": None, "target_state": "Sleeping"}, "target_state"),
    ({"project_id": "Bad Name"}, "project_id"),
    ({"facility": "da11"}, "instance_id"),  # two scopes
    ({"surprise": 1}, "surprise"),
])
async def test_a_bad_notice_is_a_400_naming_the_field(fleet, change, field):
    """Each rule has its field named; nothing is written."""
    body = {k: v for k, v in {**GOOD, **change}.items() if v is not None or k == "kind"}
    if change.get("window_end", "") is None:
        body.pop("window_end", None)
    answer = await fleet.admin("POST", NOTICES, content=json.dumps(body), headers={"content-type": "application/json"})
    assert answer.status_code == 400, answer.text
    assert field in [p["field"] for p in answer.json()["errors"]], answer.text
    assert (await fleet.admin("GET", NOTICES)).json()["notices"] == []


@pytest.mark.parametrize(("change", "field"), [
    ({"kind": "reboot"}, "kind"), ({"project_id": "other"}, "project_id"), ({"state": "sleeping"}, "state"),
    ({"window_end": None}, "window_end"), ({}, "body"), ({"time": at(T0 + timedelta(hours=2))}, "window_end"),
])
async def test_a_bad_change_is_a_400_and_changes_nothing(fleet, change, field):
    """Scope and kind never change; the merged notice keeps its rules; revision stays 1."""
    created = await fleet.create(**GOOD)
    path = f"{NOTICES}/{created['id']}"
    answer = await fleet.admin("PATCH", path, json=change)
    assert answer.status_code == 400, answer.text
    assert field in [p["field"] for p in answer.json()["errors"]], answer.text
    assert (await fleet.admin("GET", path)).json() == created


async def test_an_instance_notice_needs_the_instance_and_bodies_are_bounded():
    """404 for an instance that is not stored; 413 over --max-body-bytes; a bad id in the path is a 400."""
    async for fleet in fleet_with(make_settings(max_body_bytes=512)):
        missing = await fleet.admin("POST", NOTICES, json={"instance_id": new_id(), "kind": "stop", "time": at(T0)})
        assert missing.status_code == 404, missing.text
        big = await fleet.admin("POST", NOTICES, json={**GOOD, "description": "x" * 600})
        assert big.status_code == 413
        assert (await fleet.admin("GET", f"{NOTICES}/not-an-id")).status_code == 400
        assert (await fleet.admin("GET", NOTICES)).json()["notices"] == []


async def test_writes_are_audited_with_facts_only(fleet):
    """Each write and delete has its audit entry under notice:<id>: kind, scope, target, state, revision."""
    created = await fleet.create(**GOOD, description="do-not-log-this")
    path = f"{NOTICES}/{created['id']}"
    await fleet.admin("PATCH", path, json={"state": "active"})
    await fleet.admin("DELETE", path)
    entries = (await fleet.admin("GET", "/audit")).json()["entries"]
    mine = [e for e in entries if e["kind"] == "notice"]
    assert [(e["action"], e["instance_id"], e["detail"]["state"], e["detail"]["revision"]) for e in mine] == [
        ("write", f"notice:{created['id']}", "scheduled", 1), ("write", f"notice:{created['id']}", "active", 2),
        ("delete", f"notice:{created['id']}", "active", 2)]
    assert mine[0]["detail"] == {"kind": "maintenance", "scope": "project", "target": "acme", "state": "scheduled",
                                 "revision": 1}
    assert "do-not-log-this" not in json.dumps(entries)
    rows = (await fleet.admin("GET", "/device-changes")).json()["changes"]
    assert [(r["instance_id"], r["present"]) for r in rows[:3]] == [(f"notice:{created['id']}", False)] * 3
    only = (await fleet.admin("GET", "/audit", params={"instance": f"notice:{created['id']}"})).json()["entries"]
    assert [e["action"] for e in only] == ["write", "write", "delete"]
    bad = await fleet.admin("GET", "/audit", params={"instance": "notice:nope"})
    assert (bad.status_code, bad.json()["errors"][0]["field"]) == (400, "instance")


async def test_scopes_of_kind_notice(tmp_path: Path):
    """Metadata scopes do not reach notices; metadata:*:notice and read/write/delete do."""
    scopes = ("metadata:update:metadata", "metadata:create:notice", "metadata:read:notice", "metadata:delete:notice",
              "read")
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": [{"subject": s, "token": f"tok-{s}-0123456789", "scopes": [s]}
                                           for s in scopes]}))
    async for fleet in fleet_with(make_settings(admin_tokens_file=path)):
        def token(scope: str) -> str:
            return f"tok-{scope}-0123456789"

        assert (await fleet.admin("POST", NOTICES, token("metadata:update:metadata"), json=GOOD)).status_code == 403
        made = await fleet.admin("POST", NOTICES, token("metadata:create:notice"), json=GOOD)
        assert made.status_code == 200
        one = f"{NOTICES}/{made.json()['id']}"
        assert (await fleet.admin("GET", one, token("metadata:update:metadata"))).status_code == 403
        assert (await fleet.admin("GET", one, token("metadata:read:notice"))).status_code == 200
        assert (await fleet.admin("GET", NOTICES, token("read"))).status_code == 200
        assert (await fleet.admin("PATCH", one, token("read"), json={"state": "active"})).status_code == 403
        assert (await fleet.admin("DELETE", one, token("metadata:read:notice"))).status_code == 403
        assert (await fleet.admin("DELETE", one, token("metadata:delete:notice"))).status_code == 200


async def test_a_guest_acknowledges_through_the_channel_and_the_admin_api_shows_it(fleet):
    """The notice-ack event records the first acknowledgement per instance and is stored as an event too."""
    project = await fleet.create(**GOOD)
    posted = await fleet.ack(project["id"])
    assert posted.status_code == 200, posted.text
    fleet.clock.advance(30)
    assert (await fleet.ack(f"instance-event-{project['id']}", NEIGHBOUR)).status_code == 200  # EC2's EventId too
    assert (await fleet.ack(project["id"])).status_code == 200  # again: the first one stays
    shown = (await fleet.admin("GET", f"{NOTICES}/{project['id']}")).json()["acknowledgements"]
    first = T0 - timedelta(hours=1)
    assert shown == [{"instance_id": fleet.ids["guest"], "at": at(first)},
                     {"instance_id": fleet.ids["neighbour"], "at": at(first + timedelta(seconds=30))}]
    events = (await fleet.admin("GET", f"/device-events/{fleet.ids['guest']}")).json()["events"]
    assert [(e["state"], e["message"]) for e in events] == [("notice-ack", project["id"])] * 2


async def test_an_acknowledgement_the_guest_may_not_give_is_refused_and_not_stored(fleet):
    """Not for it (404, as for no notice at all), history (409), a bad id (400): no event is stored."""
    project = await fleet.create(**GOOD)
    assert (await fleet.ack(project["id"], STRANGER)).status_code == 404
    assert (await fleet.ack("ffffffffffffffff0")).status_code == 404
    assert (await fleet.ack("not-a-notice")).status_code == 400
    await fleet.admin("PATCH", f"{NOTICES}/{project['id']}", json={"state": "canceled"})
    assert (await fleet.ack(project["id"])).status_code == 409
    for name in ("guest", "stranger"):
        assert (await fleet.admin("GET", f"/device-events/{fleet.ids[name]}")).json()["events"] == []
    assert (await fleet.admin("GET", f"{NOTICES}/{project['id']}")).json()["acknowledgements"] == []
