"""The installation's server side through HTTP: os/environment, the end of the install, read/write gating."""

from __future__ import annotations

import shlex
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from factories import next_ipv4
from ganeti_data import os_body, put_os, two_replicas
from helpers import admin_client, client_from, guest_get, make_settings, push_record, running_app

pytestmark = [pytest.mark.anyio, pytest.mark.stores("memory", "sqlite")]

EXAMPLES = Path(__file__).parents[2] / "examples" / "ganeti-os"
NASTY = "a 'quoted' \"value\" $(touch /tmp/x) `id`\nnext line"


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[Any]:
    """The app with the example OS definitions, on memory:// and on migrated SQLite."""
    async with running_app(make_settings(db=db_url, os_definitions_dir=EXAMPLES)) as running:
        yield running


async def test_environment_is_served_while_installing(app):
    """os/environment: sorted shell-quoted lines; OSP_ of each visibility; listed in os/; 404 in plain run mode."""
    ip = next_ipv4()
    async with admin_client(app) as admin:
        instance_id = await push_record(admin, [ip], {"hostname": "web-1"})
        body = os_body(instance_id, os_type="tiny+small")
        body["parameters"]["root-password"]["value"] = NASTY
        await put_os(admin, body)
        answer = await guest_get(app, ip, "/ganeti/latest/os/environment")
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"].startswith("text/plain")
        env = dict(word.split("=", 1) for word in shlex.split(answer.text))
        assert list(env) == sorted(env)  # one line per variable, sorted by name
        assert {key: env[key] for key in ("OS_API_VERSION", "OS_NAME", "OS_VARIANT", "INSTANCE_OS", "INSTANCE_NAME",
                                          "INSTANCE_UUID", "OSP_HOSTNAME", "OSP_ROOT_HASH", "OSP_DISK")} == {
            "OS_API_VERSION": "20", "OS_NAME": "tiny", "OS_VARIANT": "small", "INSTANCE_OS": "tiny+small",
            "INSTANCE_NAME": "web-1", "INSTANCE_UUID": instance_id, "OSP_HOSTNAME": "web-1",
            "OSP_ROOT_HASH": "private-value", "OSP_DISK": "/dev/vda",
        }
        assert env["OSP_ROOT_PASSWORD"] == NASTY
        assert "environment" in (await guest_get(app, ip, "/ganeti/latest/os")).text.splitlines()
        await put_os(admin, {**body, "mode": "run", "communication": False})
        gone = await guest_get(app, ip, "/ganeti/latest/os/environment")
        assert (gone.status_code, gone.text) == (404, "404 - Not Found")
        await put_os(admin, {**body, "mode": "run", "communication": True})
        env = dict(word.split("=", 1) for word in shlex.split((await guest_get(app, ip,
                                                                              "/ganeti/latest/os/environment")).text))
        assert "OSP_DISK" not in env  # install parameters only while installing
        assert env["OSP_ROOT_PASSWORD"] == NASTY


async def guest_write(app: Any, ip: str, body: dict[str, Any]) -> httpx.Response:
    async with client_from(app, ip) as guest:
        return await guest.post("/ganeti/latest/write", json=body)


async def stream_of(admin: httpx.AsyncClient, instance_id: str) -> list[tuple[str, str | None]]:
    page = await admin.get(f"/device-events/{instance_id}")
    assert page.status_code == 200, page.text
    return [(e["state"], e["message"]) for e in page.json()["events"]]


async def test_read_and_write_answer_only_while_installing_or_communicating(app):
    """Run without communication: read and write are 404 like every /ganeti path; install or communication: served."""
    ip, stranger = next_ipv4(), next_ipv4()
    async with admin_client(app) as admin:
        instance_id = await push_record(admin, [ip])
        for mode, communication, status in [("run", False, 404), ("run", True, 200), ("install", False, 200),
                                            ("self_install", False, 200)]:
            await put_os(admin, os_body(instance_id, mode=mode, communication=communication))
            wrote = await guest_write(app, ip, {"state": "started"})
            assert wrote.status_code == status, (mode, communication, wrote.text)
            assert (await admin.post(f"/device-messages/{instance_id}", content=b"proceed")).status_code == 200
            read = await guest_get(app, ip, "/ganeti/latest/read")
            assert read.status_code == status, (mode, communication)
            if status == 404:
                assert (wrote.text, read.text) == ("404 - Not Found", "404 - Not Found")
            else:
                assert read.content == b"proceed"
        assert (await guest_get(app, stranger, "/ganeti/latest/read")).text == "404 - Not Found"
        assert (await guest_write(app, stranger, {"state": "started"})).status_code == 404
        # The 404s stored nothing: one "started" event per answering mode.
        assert await stream_of(admin, instance_id) == [("started", None)] * 3


@pytest.mark.stores("memory", "sqlite", "postgres")  # the switch is a store write: every kind of store
async def test_succeeded_returns_the_record_to_run_mode_and_the_stream_says_so(app):
    """Install → succeeded: mode run (durable, audited as the instance), a ``mode`` event, then /ganeti is 404."""
    ip = next_ipv4()
    async with admin_client(app) as admin:
        instance_id = await push_record(admin, [ip])
        await put_os(admin, os_body(instance_id, mode="self_install"))
        for state in ("started", "image", "package", "script"):
            assert (await guest_write(app, ip, {"state": state})).status_code == 200
        done = await guest_write(app, ip, {"state": "succeeded", "code": 0})
        assert (done.status_code, done.json()["state"]) == (200, "succeeded")
        view = (await admin.get(f"/device-os/{instance_id}")).json()
        assert (view["mode"], view["served"]) == ("run", False)
        assert view["parameters"]["root-password"]["secret_state"] == "held"  # same write: its secrets stay
        assert await stream_of(admin, instance_id) == [
            ("started", None), ("image", None), ("package", None), ("script", None), ("succeeded", None),
            ("mode", "run")]
        audit = (await admin.get("/audit", params={"instance": instance_id})).json()["entries"]
        last = audit[-1]
        assert (last["subject"], last["action"], last["kind"], last["applied"]) == ("instance", "write", "os", True)
        assert (last["detail"]["mode"], last["detail"]["from"]) == ("run", "self_install")
        for path in ("/ganeti/latest/os/parameters.json", "/ganeti/latest/os/environment", "/ganeti/latest/read"):
            assert (await guest_get(app, ip, path)).text == "404 - Not Found", path
        assert (await guest_write(app, ip, {"state": "succeeded"})).status_code == 404
        assert len(await stream_of(admin, instance_id)) == 6


async def test_failed_keeps_the_mode_and_run_mode_is_never_switched(app):
    """failed: still installing; succeeded with communication in run mode: no mode change, no mode event."""
    ip = next_ipv4()
    async with admin_client(app) as admin:
        instance_id = await push_record(admin, [ip])
        await put_os(admin, os_body(instance_id, mode="install"))
        assert (await guest_write(app, ip, {"state": "failed", "code": 2, "message": "no disk"})).status_code == 200
        assert (await admin.get(f"/device-os/{instance_id}")).json()["mode"] == "install"
        assert (await guest_get(app, ip, "/ganeti/latest/os/parameters.json")).status_code == 200
        await put_os(admin, os_body(instance_id, mode="run", communication=True))
        assert (await guest_write(app, ip, {"state": "succeeded"})).status_code == 200
        assert (await admin.get(f"/device-os/{instance_id}")).json()["mode"] == "run"
        assert [state for state, _ in await stream_of(admin, instance_id)] == ["failed", "succeeded"]
        forged = await guest_write(app, ip, {"state": "mode", "message": "run"})
        assert forged.status_code == 400
        assert "written by imds itself" in forged.text
        async with client_from(app, ip) as guest:  # /events ends nothing and cannot forge either
            assert (await guest.post("/events", json={"state": "mode"})).status_code == 400


@pytest.mark.stores("sqlite", "postgres")  # one database two replicas share
async def test_the_other_replica_sees_the_switch_through_the_store(db_url):
    """Succeeded through replica A: replica B, once it follows the feed, serves 404 to the instance too."""
    async with two_replicas(db_url, mode="install") as r:
        async with client_from(r.b, r.ip) as guest:
            assert (await guest.get("/ganeti/latest/os/parameters.json")).status_code == 200
        assert (await guest_write(r.a, r.ip, {"state": "succeeded"})).status_code == 200
        await r.b.services.catalog.catch_up()
        async with client_from(r.b, r.ip) as guest:
            assert (await guest.get("/ganeti/latest/os/parameters.json")).text == "404 - Not Found"
        assert (await r.admin_b.get(f"/device-os/{r.instance_id}")).json()["mode"] == "run"
        assert await stream_of(r.admin_b, r.instance_id) == [("succeeded", None), ("mode", "run")]
