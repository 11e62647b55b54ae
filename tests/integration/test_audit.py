"""The audit log over HTTP on every store: who changed which instance, how, and which addresses moved from whom.

Writes and deletes (metadata, userdata, OS records, the password) each leave one entry with
the token's subject; ``GET /audit`` (read scope) pages through them by instance. No
document, userdata or OS parameter value (public, private or secret) ever appears in it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from factories import metadata_body, next_ipv4, userdata_body
from ganeti_data import os_body
from helpers import admin_client, client_from, make_settings, running_app

pytestmark = pytest.mark.anyio

WRITER, READER = "writer-token-0123456789", "auditor-token-0123456789"
CANARIES = ("private-value", "secret-value", "audit-userdata-canary", "host-")


@pytest.fixture
async def clients(db_url: str, tmp_path) -> AsyncIterator[tuple[Any, Any]]:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [
        {"subject": "ci-writer", "token": WRITER, "scopes": ["write", "delete"]},
        {"subject": "auditor", "token": READER, "scopes": ["read"]},
    ]}))
    settings = make_settings(db=db_url, admin_token=None, admin_tokens_file=tokens)
    async with running_app(settings) as app, client_from(app, token=WRITER) as writer, \
            client_from(app, token=READER) as reader:
        yield writer, reader


async def _ok(answer: Any) -> Any:
    assert answer.status_code == 200, answer.text
    return answer.json()


async def test_every_admin_change_is_audited_with_subject_addresses_and_no_values(clients):
    """Writes, a move, a stale write, an OS record with private/secret values, deletes: one entry each."""
    writer, reader = clients
    shared, own_a, own_b = next_ipv4(), next_ipv4(), next_ipv4()
    a = metadata_body(ips=[own_a, shared], updated_at="2026-01-02T00:00:00Z")
    b = metadata_body(ips=[own_b, shared])
    await _ok(await writer.post("/device-metadata", json=a))
    await _ok(await writer.post("/device-metadata", json=b))  # takes `shared` from a
    await _ok(await writer.post("/device-userdata", json=userdata_body(
        b["id"], [own_b, shared], "#!/bin/sh\necho audit-userdata-canary\n", userdata_encoding="text")))
    stale = {**a, "metadata": {**a["metadata"], "updated_at": "2025-01-01T00:00:00Z"}}
    assert (await _ok(await writer.post("/device-metadata", json=stale)))["applied"] is False
    await _ok(await writer.post("/device-os", json=os_body(a["id"])))
    assert (await writer.delete(f"/device-os/{a['id']}")).status_code == 200
    assert (await writer.delete(f"/device-userdata/{b['id']}")).status_code == 200

    page_a = await _ok(await reader.get("/audit", params={"instance": a["id"]}))
    got_a = [(e["action"], e["kind"], e["applied"], e["subject"]) for e in page_a["entries"]]
    assert got_a == [("write", "metadata", True, "ci-writer"), ("write", "metadata", False, "ci-writer"),
                     ("write", "os", True, "ci-writer"), ("delete", "os", True, "ci-writer")]
    first, stale_entry, os_entry = page_a["entries"][:3]
    assert first["detail"] == {"addresses": 2, "moved": {}, "dropped": []}
    assert stale_entry["detail"]["reason"].startswith("stale: updated_at")
    assert os_entry["detail"]["os_type"] == "tiny"
    assert os_entry["detail"]["parameters"] == {"public": 1, "private": 1, "secret": 1}

    page_b = await _ok(await reader.get("/audit", params={"instance": b["id"]}))
    moved = page_b["entries"][0]
    assert (moved["action"], moved["kind"], moved["instance_id"]) == ("write", "metadata", b["id"])
    assert moved["detail"]["moved"] == {shared: a["id"]}  # which address moved from which instance
    assert [e["kind"] for e in page_b["entries"]] == ["metadata", "userdata", "userdata"]
    assert page_b["entries"][-1]["action"] == "delete"
    assert page_b["entries"][-1]["detail"] == {"addresses_removed": False}

    everything = await reader.get("/audit", params={"limit": 1000})
    assert len(everything.json()["entries"]) == 7
    for canary in CANARIES:
        assert canary not in everything.text, canary


async def test_the_log_pages_by_cursor_and_checks_its_query(clients):
    """limit/after page through in order; a bad limit or cursor is a 400 naming it; read scope only."""
    writer, reader = clients
    ids = []
    for _ in range(5):
        body = metadata_body(ips=[next_ipv4()])
        ids.append(body["id"])
        await _ok(await writer.post("/device-metadata", json=body))
    seen, after = [], 0
    while True:
        page = await _ok(await reader.get("/audit", params={"after": after, "limit": 2}))
        if not page["entries"]:
            break
        assert len(page["entries"]) <= 2
        seen += [e["instance_id"] for e in page["entries"]]
        after = page["next"]
    assert seen == ids
    assert [e["seq"] for e in (await _ok(await reader.get("/audit")))["entries"]] == sorted(
        e["seq"] for e in (await _ok(await reader.get("/audit")))["entries"])
    for params, field in (({"limit": 0}, "limit"), ({"limit": 1001}, "limit"), ({"after": -1}, "after")):
        bad = await reader.get("/audit", params=params)
        assert bad.status_code == 400
        assert bad.json()["errors"][0]["field"] == field
    assert (await reader.get("/audit", params={"instance": "not-a-uuid"})).status_code == 400
    assert (await writer.get("/audit")).status_code == 403
    async with client_from(writer._transport.app) as anonymous:
        assert (await anonymous.get("/audit")).status_code == 401


async def test_clearing_a_password_is_audited_without_the_password(db_url):
    """The instance posts its password (not an admin change); the admin's clear is one 'delete password' entry."""
    async with running_app(make_settings(db=db_url)) as app, admin_client(app) as admin:
        ip = next_ipv4()
        body = metadata_body(ips=[ip])
        await _ok(await admin.post("/device-metadata", json=body))
        async with client_from(app, ip) as guest:
            posted = await guest.post("/openstack/latest/password", content=b"audit-password-canary")
            assert posted.status_code == 200
        assert (await admin.delete(f"/device-password/{body['id']}")).status_code == 200
        page = await _ok(await admin.get("/audit", params={"instance": body["id"]}))
    assert [(e["action"], e["kind"], e["subject"]) for e in page["entries"]] == [
        ("write", "metadata", "admin-token"), ("delete", "password", "admin-token")]
    assert "audit-password-canary" not in json.dumps(page)
