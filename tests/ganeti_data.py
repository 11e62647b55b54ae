"""Bodies and helpers for the Ganeti OS-record tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, NamedTuple

import httpx

from factories import next_ipv4
from helpers import admin_client, make_settings, push_record, running_app
from imds.web.instance import InstanceFront

PARAMETERS = {"hostname": "public", "root-hash": "private", "root-password": "secret"}  # name: visibility
VALUES = {"public": "web-1", "private": "private-value", "secret": "secret-value"}  # visibility: value


def os_body(instance_id: str, **overrides: Any) -> dict[str, Any]:
    """A POST /device-os body with one parameter of each visibility plus an install parameter."""
    parameters = {name: {"value": VALUES[shown], "visibility": shown} for name, shown in PARAMETERS.items()}
    body: dict[str, Any] = {"id": instance_id, "os_type": "tiny", "mode": "install", "communication": False,
                            "parameters": parameters,
                            "install_parameters": {"disk": {"value": "/dev/vda", "visibility": "public"}}}
    body.update(overrides)
    return body


async def put_os(admin: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    """POST /device-os; fails unless applied."""
    answer = await admin.post("/device-os", json=body)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    assert result["applied"] is True, result
    return result


class Replicas(NamedTuple):
    """Two apps on one database, their admin clients, and the instance written through A."""

    a: InstanceFront
    b: InstanceFront
    admin_a: httpx.AsyncClient
    admin_b: httpx.AsyncClient
    ip: str
    instance_id: str


@asynccontextmanager
async def two_replicas(db_url: str, **os_changes: Any) -> AsyncIterator[Replicas]:
    """Replicas A and B on ``db_url``; an instance whose OS record (with a secret) went through A; B caught up.

    The replicas follow the feed only when the test says so (``catalog.catch_up()``): a poll in
    between would make "not followed yet" assertions a race on a loaded machine.
    """
    settings = make_settings(db=db_url, feed_poll_interval=600.0)
    ip = next_ipv4()
    async with running_app(settings) as a, running_app(settings) as b, admin_client(a) as admin_a, \
            admin_client(b) as admin_b:
        instance_id = await push_record(admin_a, [ip])
        await put_os(admin_a, os_body(instance_id, **os_changes))
        await b.services.catalog.catch_up()
        yield Replicas(a, b, admin_a, admin_b, ip, instance_id)
