"""Real clients reading lifecycle notices from a real ``imds serve`` (granian, loopback sources).

- ``ec2-metadata`` (PyPI) reads ``spot_instance_action`` and ``autoscaling_target_lifecycle_state``
  (None before any notice: its 404 handling), over IMDSv2 as it always speaks.
- Google's sample long-poller on ``instance/maintenance-event`` wakes after the admin write
  (``wait_for_change`` with ``last_etag``), and TensorFlow's GCE termination watcher turns true.
- Two replicas on one database (SQLite, PostgreSQL): a notice written through A reaches B's
  EC2, GCE and JSON readers, and wakes B's held watch, within the replica-coherence budget.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from pathlib import Path

import ec2_metadata
import httpx
import pytest
import urllib3

from factories import new_id
from helpers import wait_for
from notice_clients import admin, termination_watcher_gce, wait_for_maintenance
from serve_process import Server, client_at, in_background, metric, serving

GUEST, NEIGHBOUR = "127.0.87.7", "127.0.87.8"
GOOGLE = {"Metadata-Flavor": "Google"}
BUDGET = 5.0  # seconds: the feed is polled every 0.1 s here; PostgreSQL wakes B by NOTIFY at once


def at(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def place(server: Server, ip: str, project: str = "acme") -> str:
    instance_id = new_id()
    server.post("/device-metadata", {"id": instance_id, "ipAddresses": [ip], "metadata": {
        "id": instance_id, "hostname": f"vm-{ip.rsplit('.', 1)[1]}", "project_id": project, "facility": "da11"}})
    return instance_id


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("notices-clients")
    with serving(tmp, "--db", f"sqlite:///{tmp / 'imds.db'}") as running:
        yield running


def test_ec2_metadata_reads_the_spot_action_and_the_lifecycle_state(server):
    """None before; the notice's action and time, and the target lifecycle state, after."""
    instance_id = place(server, GUEST)
    pool = urllib3.PoolManager(source_address=(GUEST, 0))
    client = ec2_metadata.EC2Metadata(pool_manager=pool)
    client.service_url = f"{server.url}/latest/"
    client.metadata_url = f"{client.service_url}meta-data/"
    try:
        assert client.spot_instance_action is None
        assert client.autoscaling_target_lifecycle_state is None
        when = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(minutes=2)
        admin(server, "POST", "/device-notices", json={"instance_id": instance_id, "kind": "terminate",
                                                       "time": at(when)})
        admin(server, "POST", "/device-notices", json={"instance_id": instance_id, "kind": "lifecycle",
                                                       "state": "active", "time": at(when),
                                                       "target_state": "Warmed:Stopped"})
        action = client.spot_instance_action
        assert action is not None
        assert (action.action, action.time) == ("terminate", when)
        assert client.autoscaling_target_lifecycle_state == "Warmed:Stopped"
        assert client.instance_id == instance_id
    finally:
        pool.clear()


def test_google_sample_long_poller_and_tensorflow_watcher_wake_on_maintenance(server):
    """The sample's first read (last_etag 0) says NONE (no callback); after the admin write its held read answers."""
    place(server, NEIGHBOUR, project="gpu-train")
    events: list[str | None] = []
    failures: list[BaseException] = []
    done = threading.Event()

    def poll() -> None:
        try:
            with client_at(NEIGHBOUR) as client:
                wait_for_maintenance(client, server.url, events.append, done.is_set)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            failures.append(exc)

    worker = threading.Thread(target=poll, daemon=True)
    worker.start()
    try:
        wait_for(lambda: failures or metric(server, "imds_watch_waiting") >= 1, what="the long-poll to be held")
        assert (failures, events) == ([], [])
        with client_at(NEIGHBOUR) as client:
            assert termination_watcher_gce(client, server.url) is False
        now = dt.datetime.now(dt.UTC)
        admin(server, "POST", "/device-notices", json={
            "project_id": "gpu-train", "kind": "maintenance", "state": "active", "time": at(now),
            "window_end": at(now + dt.timedelta(hours=1))})
        wait_for(lambda: events == ["TERMINATE_ON_HOST_MAINTENANCE"], what="the poller to wake", timeout=BUDGET)
        with client_at(NEIGHBOUR) as client:
            assert termination_watcher_gce(client, server.url) is True
    finally:
        done.set()
        worker.join(timeout=15)
    assert not worker.is_alive()
    assert failures == []


def test_a_held_watch_wakes_when_the_window_opens_with_no_write(server):
    """The replica's notice clock: a migrate window opening seconds later answers the held read, unprompted.

    The read asks to be held 300 s and the client gives up after 50 s: only the clock's wake at the
    window's opening (not ``CLOCK_TICK``'s 60 s, not the watch's timeout) answers it in time. A machine
    so slow that the window opened before the held read was sent tries again with a wider margin.
    """
    url = f"{server.url}/computeMetadata/v1/instance/maintenance-event"
    for attempt, margin in enumerate((8, 20, 45)):
        project = f"clockwork-{attempt}"
        ip = f"127.0.87.{20 + attempt}"
        place(server, ip, project=project)
        with client_at(ip) as guest:
            opens = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(seconds=margin)
            admin(server, "POST", "/device-notices", json={
                "project_id": project, "kind": "migrate", "time": at(opens),
                "window_end": at(opens + dt.timedelta(hours=1))})
            first = guest.get(url, headers=GOOGLE)
            sent = dt.datetime.now(dt.UTC)
            if sent >= opens:
                continue  # the window opened before the read could be held: nothing to learn from this one
            assert first.text == "NONE"
            held = guest.get(url, headers=GOOGLE, timeout=50.0, params={
                "wait_for_change": "true", "last_etag": first.headers["etag"], "timeout_sec": "300"})
        assert (held.status_code, held.text) == (200, "MIGRATE_ON_HOST_MAINTENANCE")
        assert held.headers["etag"] != first.headers["etag"]
        assert dt.datetime.now(dt.UTC) >= opens  # it answered because the window opened, not before
        return
    pytest.fail("the window opened before every held read could be sent")


@pytest.mark.stores("sqlite", "postgres")
def test_a_notice_written_through_a_reaches_b_and_wakes_its_watch(tmp_path: Path, db_url: str):
    """Write on A; B's held maintenance-event read answers, B's EC2 and JSON documents say the same."""
    args = ("--db", db_url, "--feed-poll-interval", "0.1")
    with serving(tmp_path, *args) as a, serving(tmp_path, *args) as b:
        instance_id = place(a, GUEST)
        wait_for(lambda: _gce(b, "hostname").status_code == 200, what="B to follow the feed")
        first = _gce(b, "maintenance-event")
        assert first.text == "NONE"
        held = in_background(lambda: _gce(b, "maintenance-event", wait_for_change="true",
                                          last_etag=first.headers["etag"], timeout_sec="30"))
        wait_for(lambda: metric(b, "imds_watch_waiting") == 1, what="B to hold the watch")
        now = dt.datetime.now(dt.UTC)
        notice = admin(a, "POST", "/device-notices", json={
            "instance_id": instance_id, "kind": "migrate", "state": "active", "time": at(now),
            "window_end": at(now + dt.timedelta(hours=1))})
        woken = held.get(timeout=BUDGET)
        assert not isinstance(woken, BaseException), woken
        assert (woken.status_code, woken.text) == (200, "MIGRATE_ON_HOST_MAINTENANCE")
        with client_at(GUEST) as guest:
            scheduled = guest.get(f"{b.url}/latest/meta-data/events/maintenance/scheduled").json()
            assert [e["EventId"] for e in scheduled] == [f"instance-event-{notice['id']}"]
            assert guest.get(f"{b.url}/notices").json()["notices"][0]["id"] == notice["id"]
        assert admin(b, "GET", f"/device-notices/{notice['id']}")["state"] == "active"
        admin(b, "PATCH", f"/device-notices/{notice['id']}", json={"state": "completed"})
        wait_for(lambda: _gce(a, "maintenance-event").text == "NONE", what="A to follow B's change",
                 timeout=BUDGET)


def _gce(server: Server, key: str, **params: str) -> httpx.Response:
    with client_at(GUEST) as guest:
        return guest.get(f"{server.url}/computeMetadata/v1/instance/{key}", params=params, headers=GOOGLE,
                         timeout=60.0)
