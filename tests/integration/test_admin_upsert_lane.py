"""The admin upserts go from the instance front straight to their endpoints, not through the admin app.

``POST /device-metadata`` and ``/device-userdata`` are the write path at fleet rates, so the
front calls them directly (``imds.web.instance._direct``). Everything else on the admin API
still goes through the framework. A spy on the front's admin app tells which way each
request went; the answers must be the ones the admin app gives (errors included).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from factories import metadata_body, new_id, next_ipv4, userdata_body
from helpers import admin_client, client_from, make_settings, running_app
from imds.web.instance import InstanceFront

pytestmark = pytest.mark.anyio

PREFIXES = ["", "/api/v1"]


class _Spy:
    """Wraps the front's admin app and records the paths it was asked for."""

    def __init__(self, app: InstanceFront) -> None:
        self.inner = app.admin
        self.paths: list[str] = []
        app.admin = self

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            self.paths.append(scope["path"])
        await self.inner(scope, receive, send)


@asynccontextmanager
async def spied_app() -> AsyncIterator[tuple[InstanceFront, httpx.AsyncClient, _Spy]]:
    async with running_app(make_settings()) as app, admin_client(app) as admin:
        yield app, admin, _Spy(app)


@pytest.mark.parametrize("prefix", PREFIXES)
async def test_upserts_bypass_the_admin_app_and_are_served(prefix):
    async with spied_app() as (app, admin, spy):
        body = metadata_body(ips=[ip := next_ipv4()], hostname="lane-1")
        posted = await admin.post(f"{prefix}/device-metadata", json=body)
        assert posted.json() == {"id": body["id"], "applied": True, "ipAddresses": [ip], "moved": {}, "dropped": []}
        assert posted.headers["x-imds-write"] == "applied"
        assert posted.headers["content-type"] == "application/json"
        user = await admin.post(f"{prefix}/device-userdata", json=userdata_body(body["id"], [ip], "#!/bin/sh\n"))
        assert user.json()["applied"] is True
        assert spy.paths == []  # neither write touched the framework
        async with client_from(app, ip) as guest:
            assert (await guest.get("/metadata")).json()["hostname"] == "lane-1"
            assert (await guest.get("/userdata")).content == b"#!/bin/sh\n"
        got = await admin.get(f"{prefix}/device-metadata/{body['id']}")  # other admin routes still go through it
        assert got.json()["hostname"] == "lane-1"
        assert spy.paths == [f"{prefix}/device-metadata/{body['id']}"]


async def test_errors_on_the_lane_are_the_admin_apps_answers():
    async with spied_app() as (app, admin, spy):
        bad = await admin.post("/device-metadata", json={"id": "not-a-uuid", "ipAddresses": [], "metadata": {}})
        assert bad.status_code == 400
        assert "id" in {error["field"] for error in bad.json()["errors"]}
        async with client_from(app, "127.0.0.9") as anonymous:
            refused = await anonymous.post("/device-userdata", json=userdata_body(new_id(), ["127.0.0.9"], "x"))
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"] == 'Bearer realm="imds"'
        assert refused.json() == {"message": refused.json()["message"]}
        assert spy.paths == []
        # Other methods on the same paths are the framework's to refuse.
        wrong = await admin.put("/device-metadata", json={})
        assert wrong.status_code == 405
        assert spy.paths == ["/device-metadata"]


async def test_lane_writes_are_counted_in_the_admin_group():
    async with spied_app() as (app, admin, _spy):
        statuses = app.services.metrics.tally.group("admin").statuses
        before = dict(statuses)
        await admin.post("/device-metadata", json=metadata_body(ips=[next_ipv4()]))
        await admin.post("/api/v1/device-userdata", json={"id": new_id()})  # 400: ipAddresses missing
        assert statuses.get(200, 0) == before.get(200, 0) + 1
        assert statuses.get(400, 0) == before.get(400, 0) + 1
