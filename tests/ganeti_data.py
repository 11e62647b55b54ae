"""Bodies and helpers for the Ganeti OS-record tests."""

from __future__ import annotations

from typing import Any

import httpx

from factories import metadata_body


def os_body(instance_id: str, **overrides: Any) -> dict[str, Any]:
    """A POST /device-os body with one parameter of each visibility plus an install parameter."""
    body: dict[str, Any] = {
        "id": instance_id,
        "os_type": "tiny",
        "mode": "install",
        "communication": False,
        "parameters": {
            "hostname": {"value": "web-1", "visibility": "public"},
            "root-hash": {"value": "private-value", "visibility": "private"},
            "root-password": {"value": "secret-value", "visibility": "secret"},
        },
        "install_parameters": {"disk": {"value": "/dev/vda", "visibility": "public"}},
    }
    body.update(overrides)
    return body


async def seed_instance(admin: httpx.AsyncClient, ip: str, instance_id: str | None = None) -> str:
    """An instance with metadata at ``ip``; returns its id."""
    body = metadata_body(instance_id, [ip])
    answer = await admin.post("/device-metadata", json=body)
    assert answer.status_code == 200, answer.text
    return str(body["id"])


async def put_os(admin: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    """POST /device-os; fails unless applied."""
    answer = await admin.post("/device-os", json=body)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    assert result["applied"] is True, result
    return result
