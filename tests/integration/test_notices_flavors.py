"""Lifecycle notices as each flavor renders them, in process over HTTP, with an injected clock.

EC2 (``events/maintenance/scheduled`` and ``history``, ``spot/instance-action`` and
``termination-time``, ``events/recommendations/rebalance``, ``autoscaling/target-lifecycle-state``),
GCE (``maintenance-event``, ``preempted``, ``upcoming-maintenance``), the JSON flavor's
``/notices`` and OpenStack's ``latest/notices.json``: each from the same record, each listed
where its flavor lists it, and each watch woken by a write and by the clock opening a window.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from factories import new_id
from helpers import ADMIN_TOKEN, FakeClock, admin_client, client_from, make_settings, push_record, wait_for_async
from imds.app import build_app
from imds.web.instance import InstanceFront

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)
GUEST, NEIGHBOUR, STRANGER = "10.85.1.7", "10.85.1.8", "10.85.2.7"
MD = "/latest/meta-data"
V1 = "/computeMetadata/v1"
GOOGLE = {"Metadata-Flavor": "Google"}
WAIT = 20.0


def at(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class Fleet:
    def __init__(self, app: InstanceFront, clock: FakeClock, ids: dict[str, str]) -> None:
        self.app, self.clock, self.ids = app, clock, ids

    async def notice(self, **body: Any) -> str:
        async with admin_client(self.app, ADMIN_TOKEN) as admin:
            answer = await admin.post("/device-notices", json=body)
        assert answer.status_code == 200, answer.text
        notice_id: str = answer.json()["id"]
        return notice_id

    async def change(self, notice_id: str, **body: Any) -> None:
        async with admin_client(self.app, ADMIN_TOKEN) as admin:
            answer = await admin.patch(f"/device-notices/{notice_id}", json=body)
        assert answer.status_code == 200, answer.text

    async def get(self, path: str, ip: str = GUEST, **kwargs: Any) -> httpx.Response:
        async with client_from(self.app, ip, timeout=WAIT * 2) as guest:
            return await guest.get(path, **kwargs)

    def at(self, moment: datetime) -> None:
        """Move the clock to ``moment`` and let the catalog see what that changed (as its clock task does)."""
        self.clock.now = moment.timestamp()
        self.app.services.catalog.expire_notices()


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    clock = FakeClock((T0 - timedelta(hours=1)).timestamp())
    app = build_app(make_settings(), clock=clock)
    async with app.services.running():
        ids = {}
        for name, ip, project, facility in (("guest", GUEST, "acme", "da11"), ("neighbour", NEIGHBOUR, "acme", "ny5"),
                                            ("stranger", STRANGER, "other", "sv15")):
            ids[name] = new_id()
            document = {"id": ids[name], "hostname": f"{name}.example", "project_id": project, "facility": facility,
                        "network": {"addresses": [{"address": ip, "address_family": 4, "public": False},
                                                  {"address": "2001:db8::7", "address_family": 6, "public": True}]}}
            await push_record(app, [ip], document)
        yield Fleet(app, clock, ids)


async def test_ec2_without_notices_answers_what_aws_answers(fleet):
    """Both maintenance lists are 200 [] (listed); spot, rebalance and the lifecycle state are 404 (not listed)."""
    listing = (await fleet.get(f"{MD}/")).text.splitlines()
    assert "events/" in listing
    assert not {"spot/", "autoscaling/"} & set(listing)
    assert (await fleet.get(f"{MD}/events/")).text == "maintenance/"
    assert (await fleet.get(f"{MD}/events/maintenance/")).text == "history\nscheduled"
    for path in ("events/maintenance/scheduled", "events/maintenance/history"):
        answer = await fleet.get(f"{MD}/{path}")
        assert (answer.status_code, answer.text) == (200, "[]")
    for path in ("spot/instance-action", "spot/termination-time", "events/recommendations/rebalance",
                 "autoscaling/target-lifecycle-state"):
        assert (await fleet.get(f"{MD}/{path}")).status_code == 404


async def test_ipv6_is_served_and_listed_for_systemd_imds(fleet):
    """meta-data/ipv6: the instance's first IPv6 address (systemd's EC2 entry reads it)."""
    assert "ipv6" in (await fleet.get(f"{MD}/")).text.splitlines()
    assert (await fleet.get(f"{MD}/ipv6")).text == "2001:db8::7"


async def test_a_scheduled_maintenance_from_schedule_to_cancel_to_history(fleet):
    """AWS's fields and dates; canceled stays in scheduled (State canceled) until its window ends, and in history."""
    notice_id = await fleet.notice(project_id="acme", kind="reboot", time=at(T0),
                                   window_end=at(T0 + timedelta(minutes=16, seconds=40)))
    events = json.loads((await fleet.get(f"{MD}/events/maintenance/scheduled")).text)
    assert events == [{"NotBefore": "1 Dec 2026 02:00:00 GMT", "Code": "instance-reboot",
                       "Description": "scheduled reboot", "EventId": f"instance-event-{notice_id}",
                       "NotAfter": "1 Dec 2026 02:16:40 GMT", "State": "active"}]
    assert list(events[0]) == ["NotBefore", "Code", "Description", "EventId", "NotAfter", "State"]
    assert (await fleet.get(f"{MD}/events/maintenance/history")).text == "[]"
    assert json.loads((await fleet.get(f"{MD}/events/maintenance/scheduled", NEIGHBOUR)).text)[0]["EventId"] == \
        f"instance-event-{notice_id}"
    assert (await fleet.get(f"{MD}/events/maintenance/scheduled", STRANGER)).text == "[]"
    await fleet.change(notice_id, state="canceled")
    canceled = json.loads((await fleet.get(f"{MD}/events/maintenance/scheduled")).text)
    assert [(e["State"], e["Description"]) for e in canceled] == [("canceled", "[Canceled] scheduled reboot")]
    history = json.loads((await fleet.get(f"{MD}/events/maintenance/history")).text)
    assert [(e["EventId"], e["State"]) for e in history] == [(f"instance-event-{notice_id}", "canceled")]
    fleet.at(T0 + timedelta(minutes=17))
    assert (await fleet.get(f"{MD}/events/maintenance/scheduled")).text == "[]"
    assert len(json.loads((await fleet.get(f"{MD}/events/maintenance/history")).text)) == 1


async def test_a_maintenance_window_closes_into_history_on_its_own(fleet):
    """No write after the first: the clock makes it active, then completed (history)."""
    notice_id = await fleet.notice(facility="da11", kind="maintenance", time=at(T0),
                                   window_end=at(T0 + timedelta(hours=1)), description="switch firmware")
    fleet.at(T0 + timedelta(minutes=5))
    scheduled = json.loads((await fleet.get(f"{MD}/events/maintenance/scheduled")).text)
    assert [(e["Code"], e["Description"], e["State"]) for e in scheduled] == [
        ("system-maintenance", "switch firmware", "active")]
    fleet.at(T0 + timedelta(hours=1))
    assert (await fleet.get(f"{MD}/events/maintenance/scheduled")).text == "[]"
    history = json.loads((await fleet.get(f"{MD}/events/maintenance/history")).text)
    assert [(e["EventId"], e["State"], e["Description"]) for e in history] == [
        (f"instance-event-{notice_id}", "completed", "[Completed] switch firmware")]


async def test_a_spot_stop_and_its_termination_time(fleet):
    """spot/ appears (listed) with the action and RFC 3339 time; completing the notice takes it away."""
    notice_id = await fleet.notice(instance_id=fleet.ids["guest"], kind="stop", time=at(T0))
    assert "spot/" in (await fleet.get(f"{MD}/")).text.splitlines()
    assert (await fleet.get(f"{MD}/spot/")).text == "instance-action\ntermination-time"
    action = await fleet.get(f"{MD}/spot/instance-action")
    assert action.json() == {"action": "stop", "time": "2026-12-01T02:00:00Z"}
    assert (await fleet.get(f"{MD}/spot/termination-time")).text == "2026-12-01T02:00:00Z"
    assert (await fleet.get(f"{MD}/spot/instance-action", NEIGHBOUR)).status_code == 404
    await fleet.change(notice_id, state="completed")
    assert (await fleet.get(f"{MD}/spot/instance-action")).status_code == 404


async def test_a_rebalance_recommendation_appears_when_its_time_comes(fleet):
    """404 while scheduled; {"noticeTime"} once active; listed under events/recommendations/."""
    await fleet.notice(project_id="acme", kind="rebalance", time=at(T0))
    assert (await fleet.get(f"{MD}/events/recommendations/rebalance")).status_code == 404
    fleet.at(T0)
    assert (await fleet.get(f"{MD}/events/")).text == "maintenance/\nrecommendations/"
    answer = await fleet.get(f"{MD}/events/recommendations/rebalance")
    assert answer.json() == {"noticeTime": "2026-12-01T02:00:00Z"}


async def test_the_newest_active_lifecycle_state(fleet):
    """autoscaling/target-lifecycle-state is plain text: the newest active lifecycle notice's state."""
    await fleet.notice(instance_id=fleet.ids["guest"], kind="lifecycle", time=at(T0 - timedelta(days=1)),
                       target_state="InService")
    answer = await fleet.get(f"{MD}/autoscaling/target-lifecycle-state")
    assert (answer.status_code, answer.text, answer.headers["content-type"]) == (
        200, "InService", "text/plain; charset=utf-8")
    await fleet.notice(instance_id=fleet.ids["guest"], kind="lifecycle", time=at(T0), target_state="Terminated")
    assert (await fleet.get(f"{MD}/autoscaling/target-lifecycle-state")).text == "InService"
    fleet.at(T0)
    assert (await fleet.get(f"{MD}/autoscaling/target-lifecycle-state")).text == "Terminated"


async def gce(fleet: Fleet, key: str, ip: str = GUEST, **params: str) -> httpx.Response:
    return await fleet.get(f"{V1}/instance/{key}", ip, headers=GOOGLE, params=params)


async def test_gce_keys_from_the_same_records(fleet):
    """maintenance-event NONE → MIGRATE or TERMINATE while active; preempted FALSE → TRUE; upcoming-maintenance JSON."""
    listing = (await gce(fleet, "")).text.splitlines()
    assert {"maintenance-event", "preempted"} <= set(listing)
    assert "upcoming-maintenance" not in listing
    assert (await gce(fleet, "maintenance-event")).text == "NONE"
    assert (await gce(fleet, "preempted")).text == "FALSE"
    assert (await gce(fleet, "upcoming-maintenance")).status_code == 404
    migrate = await fleet.notice(project_id="acme", kind="migrate", time=at(T0), window_end=at(T0 + timedelta(hours=1)))
    upcoming = await gce(fleet, "upcoming-maintenance", alt="json")
    assert upcoming.json() == {"can_reschedule": False, "latest_window_start_time": "2026-12-01T02:00:00Z",
                               "maintenance_status": "PENDING", "type": "SCHEDULED",
                               "window_end_time": "2026-12-01T03:00:00Z", "window_start_time": "2026-12-01T02:00:00Z"}
    assert (await gce(fleet, "maintenance-event")).text == "NONE"
    fleet.at(T0)
    assert (await gce(fleet, "maintenance-event")).text == "MIGRATE_ON_HOST_MAINTENANCE"
    assert (await gce(fleet, "upcoming-maintenance")).json()["maintenance_status"] == "ONGOING"
    await fleet.change(migrate, state="completed")
    assert (await gce(fleet, "maintenance-event")).text == "NONE"
    await fleet.notice(instance_id=fleet.ids["guest"], kind="maintenance", state="active", time=at(T0),
                       window_end=at(T0 + timedelta(hours=1)))
    assert (await gce(fleet, "maintenance-event")).text == "TERMINATE_ON_HOST_MAINTENANCE"
    await fleet.notice(instance_id=fleet.ids["guest"], kind="preemption", time=at(T0))
    assert (await gce(fleet, "preempted")).text == "TRUE"
    assert (await gce(fleet, "preempted", NEIGHBOUR)).text == "FALSE"
    whole = (await fleet.get(f"{V1}/instance/", headers=GOOGLE, params={"recursive": "true"})).json()
    assert (whole["maintenanceEvent"], whole["preempted"]) == ("TERMINATE_ON_HOST_MAINTENANCE", "TRUE")


async def held(fleet: Fleet, path: str, etag: str, ip: str = GUEST, **params: str) -> asyncio.Task[httpx.Response]:
    """A wait_for_change read held on ``etag``, once the server holds it."""
    waiting = fleet.app.services.metrics.watch_waiting
    before = waiting._value.get()
    task = asyncio.create_task(fleet.get(path, ip, headers=GOOGLE, params={
        "wait_for_change": "true", "last_etag": etag, "timeout_sec": str(int(WAIT)), **params}))
    await wait_for_async(lambda: waiting._value.get() > before, what="the watch to be held")
    return task


async def test_a_gce_watch_on_maintenance_event_wakes_on_the_write_and_on_the_clock(fleet):
    """As Google's sample: the held read answers the new value after the admin write, then when the window opens."""
    first = await gce(fleet, "maintenance-event")
    watch = await held(fleet, f"{V1}/instance/maintenance-event", first.headers["etag"])
    await fleet.notice(project_id="acme", kind="maintenance", state="active", time=at(T0 - timedelta(minutes=30)),
                       window_end=at(T0 - timedelta(minutes=1)))
    woken = await asyncio.wait_for(watch, WAIT)
    assert (woken.status_code, woken.text) == (200, "TERMINATE_ON_HOST_MAINTENANCE")
    fleet.at(T0 - timedelta(minutes=1))
    quiet = await gce(fleet, "maintenance-event")
    assert quiet.text == "NONE"
    await fleet.notice(facility="da11", kind="migrate", time=at(T0), window_end=at(T0 + timedelta(minutes=1)))
    again = await gce(fleet, "maintenance-event")
    assert again.text == "NONE"
    watch = await held(fleet, f"{V1}/instance/maintenance-event", again.headers["etag"])
    fleet.at(T0)  # no write: the window opens
    woken = await asyncio.wait_for(watch, WAIT)
    assert woken.text == "MIGRATE_ON_HOST_MAINTENANCE"


async def test_the_json_and_openstack_notices_documents(fleet):
    """/notices (and /api/v1/notices) and openstack/latest/notices.json (unlisted): the same document."""
    empty = await fleet.get("/notices")
    assert (empty.status_code, empty.json()) == (200, {"notices": [], "history": []})
    assert "notices.json" not in (await fleet.get("/openstack/latest/")).text.splitlines()  # not Nova's
    assert (await fleet.get("/openstack/2018-08-27/notices.json")).status_code == 404
    stop = await fleet.notice(instance_id=fleet.ids["guest"], kind="terminate", time=at(T0), description="spot")
    old = await fleet.notice(project_id="acme", kind="reboot", time=at(T0))
    await fleet.change(old, state="canceled")
    document = (await fleet.get("/notices")).json()
    assert document == {
        "notices": [{"id": stop, "kind": "terminate", "scope": "instance", "state": "scheduled",
                     "time": "2026-12-01T02:00:00Z", "window_end": None, "description": "spot",
                     "target_state": None}],
        "history": [{"id": old, "kind": "reboot", "scope": "project", "state": "canceled",
                     "time": "2026-12-01T02:00:00Z", "window_end": None, "description": "", "target_state": None}]}
    assert (await fleet.get("/api/v1/notices")).json() == document
    assert (await fleet.get("/openstack/latest/notices.json")).json() == document
    assert (await fleet.get("/notices", NEIGHBOUR)).json()["notices"] == []


async def test_the_json_notices_document_is_watchable(fleet):
    """?wait_for_change on /notices is woken by a notice for the instance, not by one for another."""
    first = await fleet.get("/notices")
    etag = first.headers["etag"]
    task = asyncio.create_task(fleet.get("/notices", params={"wait_for_change": "true", "last_etag": etag,
                                                              "timeout_sec": str(int(WAIT))}))
    waiting = fleet.app.services.metrics.watch_waiting
    await wait_for_async(lambda: waiting._value.get() == 1, what="the watch to be held")
    await fleet.notice(instance_id=fleet.ids["stranger"], kind="stop", time=at(T0))
    seen = await fleet.get("/notices", STRANGER)  # the catalog has taken the stranger's notice in ...
    assert [n["kind"] for n in seen.json()["notices"]] == ["stop"]
    for _ in range(20):  # ... and a wrongly woken watch would have had its turns on the loop by now
        await asyncio.sleep(0)
    assert not task.done()
    assert waiting._value.get() == 1
    await fleet.notice(facility="da11", kind="rebalance", time=at(T0))
    woken = await asyncio.wait_for(task, WAIT)
    assert woken.status_code == 200
    assert woken.headers["etag"] != etag
    assert [n["kind"] for n in woken.json()["notices"]] == ["rebalance"]
