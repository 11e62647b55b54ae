"""``GET /device-records`` (JSON lines) and ``/device-records/{id}``: whole records for operators' tools."""

from __future__ import annotations

import json

import pytest

from factories import metadata_body, new_id, next_ipv4, userdata_body
from helpers import admin_client, client_from, make_settings, running_app

pytestmark = pytest.mark.anyio


async def test_records_stream_as_json_lines_in_the_upsert_format():
    """Each line is one instance as POST /device-metadata + /device-userdata take it; one record by id too."""
    async with running_app() as app, admin_client(app) as admin:
        first, second, ip = new_id(), new_id(), next_ipv4()
        for body in (metadata_body(first, [ip]), userdata_body(first, [ip], "hi", userdata_encoding="text"),
                     metadata_body(second, [])):
            kind = "userdata" if "userdata" in body else "metadata"
            assert (await admin.post(f"/device-{kind}", json=body)).is_success
        listed = await admin.get("/device-records")
        assert listed.headers["content-type"] == "application/x-ndjson"
        records = [json.loads(line) for line in listed.text.splitlines()]
        assert sorted(r["id"] for r in records) == sorted([first, second])
        one = (await admin.get(f"/api/v1/device-records/{first}")).json()
        assert one == {"id": first, "ipAddresses": [ip], "metadata": metadata_body(first, [ip])["metadata"],
                       "userdata": "hi", "userdata_encoding": "text"}
        assert one in records
        missing = await admin.get(f"/device-records/{new_id()}")
        assert missing.status_code == 404
        assert missing.json()["message"].startswith("no instance ")


async def test_records_need_read_scopes_for_both_kinds(tmp_path):
    """No token → 401; a token that may read metadata but not userdata → 403 (both come back)."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [
        {"subject": "meta", "token": "meta-only", "scopes": ["metadata:read:metadata"]},
        {"subject": "all", "token": "reader", "scopes": ["read"]},
    ]}))
    async with running_app(make_settings(admin_token=None, admin_tokens_file=tokens)) as app:
        async with client_from(app) as anonymous:
            assert (await anonymous.get("/device-records")).status_code == 401
        async with client_from(app, token="meta-only") as partial:
            assert (await partial.get("/device-records")).status_code == 403
        async with client_from(app, token="reader") as reader:
            assert (await reader.get("/device-records")).status_code == 200


async def test_post_records_applies_a_batch_and_reports_each_item_in_order():
    """POST /device-records: created / rejected / unchanged per item, in order; dry_run writes nothing."""
    async with running_app() as app, admin_client(app) as admin:
        good, ip = new_id(), next_ipv4()
        item = {"id": good, "ipAddresses": [ip], "metadata": {"hostname": "g"}}
        batch = [item, {"id": "bad", "ipAddresses": [], "metadata": {}}, {"id": new_id(), "ipAddresses": []}]
        dry = await admin.post("/device-records?dry_run=true", json=batch)
        assert [r["outcome"] for r in dry.json()["results"]] == ["created", "rejected", "rejected"]
        assert (await admin.get(f"/device-records/{good}")).status_code == 404
        done = (await admin.post("/device-records", json=batch)).json()["results"]
        assert done[0] == {"id": good, "outcome": "created", "reason": None}
        assert done[1]["reason"].startswith("id: must be a UUID")
        assert done[2]["reason"] == "metadata: or userdata is required (an item carries at least one)"
        async with client_from(app, ip) as guest:
            assert (await guest.get("/metadata")).json()["hostname"] == "g"  # served at once
        again = (await admin.post("/api/v1/device-records", json=[item])).json()["results"]
        assert again == [{"id": good, "outcome": "unchanged", "reason": None}]
        assert (await admin.post("/device-records", json={"not": "a list"})).status_code == 400
