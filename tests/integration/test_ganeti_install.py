"""The installation's server side through HTTP: os/environment, the end of the install, read/write gating."""

from __future__ import annotations

import shlex
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from factories import next_ipv4
from ganeti_data import os_body, put_os
from helpers import admin_client, client_from, make_settings, push_record, running_app

pytestmark = [pytest.mark.anyio, pytest.mark.stores("memory", "sqlite")]

EXAMPLES = Path(__file__).parents[2] / "examples" / "ganeti-os"
NASTY = "a 'quoted' \"value\" $(touch /tmp/x) `id`\nnext line"


async def guest_get(app: Any, ip: str, path: str) -> httpx.Response:
    async with client_from(app, ip) as guest:
        return await guest.get(path)


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
