"""``?wait_for_change=true`` on Ganeti's paths: parameters.json and the listings wait like every flavor.

A write to the OS record (a new parameter value) wakes a held ``parameters.json`` read,
which answers the new values and the new ETag; ``read`` (a message, no document) never waits.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from factories import next_ipv4
from ganeti_data import os_body, put_os
from helpers import admin_client, client_from, make_settings, push_record, running_app, wait_for_async
from imds.web.instance import InstanceFront

pytestmark = pytest.mark.anyio
PARAMS = "/ganeti/latest/os/parameters.json"
WAIT_BOUND = 10.0  # seconds a test waits for something that should happen at once


async def read(app: Any, path: str, **params: Any) -> httpx.Response:
    async with client_from(app, app.guest_ip, timeout=WAIT_BOUND * 3) as guest:
        return await guest.get(path, params=params)


async def waiting(app: Any, count: int) -> None:
    """Until ``count`` requests are held on the instance's catalog entry (bounded)."""
    await wait_for_async(lambda: len(app.services.catalog.get(app.instance_id).waiters or ()) >= count,
                         what=f"{count} change-watch request(s) held", timeout=WAIT_BOUND)


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[InstanceFront]:
    """The app with one installing instance at GUEST."""
    async with running_app(make_settings(db=db_url, watch_max_timeout=60)) as running:
        running.guest_ip = next_ipv4()  # type: ignore[attr-defined]
        async with admin_client(running) as admin:
            running.instance_id = await push_record(admin, [running.guest_ip])  # type: ignore[attr-defined]
            await put_os(admin, os_body(running.instance_id, os_type="any"))  # type: ignore[attr-defined]
        yield running


async def test_parameters_json_waits_for_the_os_record_to_change(app):
    """A held parameters.json returns the new value when the OS record is rewritten."""
    before = await read(app, PARAMS)
    etag = before.headers["etag"]
    held = asyncio.create_task(read(app, PARAMS, wait_for_change="true", last_etag=etag, timeout_sec=50))
    listing = asyncio.create_task(read(app, "/ganeti/latest", wait_for_change="true",
                                       last_etag=etag, timeout_sec=50))
    await waiting(app, 2)
    assert not held.done()
    renamed = {"hostname": {"value": "web-2", "visibility": "public"}}
    async with admin_client(app) as admin:
        await put_os(admin, os_body(app.instance_id, os_type="any", parameters=renamed))
    answer, listed = await asyncio.wait_for(asyncio.gather(held, listing), WAIT_BOUND)
    assert answer.status_code == 200
    assert json.loads(answer.content)["hostname"] == ["web-2", "public"]
    assert answer.headers["etag"] not in (etag, None)
    assert listed.status_code == 200
    assert listed.headers["etag"] == answer.headers["etag"]


async def test_parameters_json_answers_at_once_for_an_old_etag(app):
    """A last_etag that is no longer current: the current document at once, nothing held."""
    answer = await asyncio.wait_for(
        read(app, PARAMS, wait_for_change="true", last_etag='"old"', timeout_sec=50), WAIT_BOUND)
    assert answer.status_code == 200
    assert json.loads(answer.content)["hostname"] == ["web-1", "public"]
    assert app.services.catalog.get(app.instance_id).waiters is None


async def test_read_is_not_a_document_and_never_waits(app):
    """GET /ganeti/latest/read with wait_for_change answers at once (404: nothing queued), with no ETag."""
    answer = await asyncio.wait_for(read(app, "/ganeti/latest/read", wait_for_change="true"), WAIT_BOUND)
    assert answer.status_code == 404
    assert "etag" not in answer.headers
