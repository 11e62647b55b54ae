"""Hollow's readings on the write path, through the admin API (and --strict-records, which keeps the old rules).

hollow-metadataservice stores addresses in an INET column and matches by containment, so
its fixtures push addresses as Equinix lists them (``10.70.17.8/31``, ``2604:…::9/127``);
it stores a document whose ``id`` differs from the record id; and a write without
``ipAddresses`` leaves the instance with none. imds now accepts all three with that
meaning, says so in the write's answer, and refuses them under ``--strict-records``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from factories import new_id
from fake_upstream import running_upstream
from helpers import admin_client, guest_get, make_settings, running_app
from imds.web.instance import InstanceFront

pytestmark = [pytest.mark.anyio, pytest.mark.stores("memory", "sqlite")]

# The addresses of hollow's fixture instance A (internal/dbtools/fixtures.go), and one with host bits set.
HOLLOW_A = ["139.178.82.3", "2604:1380:4641:1f00::9/127", "10.70.17.8/31"]
SPELLED = "10.70.17.9/31"


@asynccontextmanager
async def admin_app(url: str, **overrides: Any) -> AsyncIterator[tuple[InstanceFront, httpx.AsyncClient]]:
    async with running_app(make_settings(db=url, **overrides)) as app, admin_client(app) as admin:
        yield app, admin


def body_of(instance_id: str, ips: list[str] | None, **document: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"id": instance_id, "metadata": {"id": instance_id, "hostname": "a", **document}}
    if ips is not None:
        body["ipAddresses"] = ips
    return body


async def test_hollows_fixture_addresses_are_accepted_and_matched_by_containment(db_url):
    """2604:…::9/127 and 10.70.17.9/31 cover ::8-::9 and .8-.9; both stay as sent, the answer names the network."""
    instance_id = new_id()
    async with admin_app(db_url) as (app, admin):
        answer = await admin.post("/device-metadata", json=body_of(instance_id, [*HOLLOW_A[:2], SPELLED]))
        assert answer.status_code == 200, answer.text
        written = answer.json()
        assert written["ipAddresses"] == [*HOLLOW_A[:2], SPELLED]
        tail = " (matched by containment, longest prefix; stored and shown as sent)"
        assert written["warnings"] == [
            f"ipAddresses: {HOLLOW_A[1]} has host bits set: it covers the network 2604:1380:4641:1f00::8/127{tail}",
            f"ipAddresses: 10.70.17.9/31 has host bits set: it covers the network 10.70.17.8/31{tail}",
        ]
        for ip in ("10.70.17.8", "10.70.17.9", "2604:1380:4641:1f00::8", "2604:1380:4641:1f00::9", "139.178.82.3"):
            served = await guest_get(app, ip, "/metadata")
            assert served.status_code == 200, ip
            assert served.json()["id"] == instance_id
        for outside in ("10.70.17.10", "10.70.17.7", "2604:1380:4641:1f00::a"):
            assert (await guest_get(app, outside, "/metadata")).status_code == 404, outside
        stored = (await admin.get(f"/device-records/{instance_id}")).json()
        assert sorted(stored["ipAddresses"]) == sorted([*HOLLOW_A[:2], SPELLED])
        explained = (await admin.get("/explain", params={"q": "10.70.17.8"})).json()
        assert explained["matched"] == {"entry": SPELLED, "kind": "cidr", "prefix": 31, "instance_id": instance_id,
                                        "covers": "10.70.17.8/31"}
        listed = (await admin.get(f"/explain/{instance_id}")).json()["instance"]["entries"]
        assert {e["entry"]: e.get("covers") for e in listed} == {
            "139.178.82.3": None, "2604:1380:4641:1f00::9/127": "2604:1380:4641:1f00::8/127",
            SPELLED: "10.70.17.8/31"}


async def test_a_spelled_address_survives_a_restart_as_sent(sqlite_url):
    """Stored as sent in the database; a new process loads it, still matching the whole network."""
    instance_id = new_id()
    async with admin_app(sqlite_url) as (_app, admin):
        assert (await admin.post("/device-metadata", json=body_of(instance_id, [SPELLED]))).status_code == 200
    async with admin_app(sqlite_url) as (app, admin):
        assert (await guest_get(app, "10.70.17.8", "/metadata")).json()["id"] == instance_id
        assert (await guest_get(app, "10.70.17.9", "/metadata")).json()["id"] == instance_id
        assert (await admin.get(f"/device-records/{instance_id}")).json()["ipAddresses"] == [SPELLED]
        exported = [line for line in (await admin.get("/device-records")).text.splitlines() if instance_id in line]
        assert f'"ipAddresses":["{SPELLED}"]' in exported[0]
        # The same network written in its plain form takes its place; a longer prefix inside it still wins.
        other = new_id()
        answer = await admin.post("/device-metadata", json=body_of(other, ["10.70.17.9"]))
        assert answer.status_code == 200
        assert (await guest_get(app, "10.70.17.9", "/metadata")).json()["id"] == other
        assert (await guest_get(app, "10.70.17.8", "/metadata")).json()["id"] == instance_id


async def test_a_document_id_other_than_the_record_id_is_stored_as_sent(db_url):
    """The JSON flavor serves the document as sent; EC2, OpenStack and NoCloud name the record id."""
    instance_id, other = new_id(), new_id()
    body = body_of(instance_id, ["10.70.20.5"])
    body["metadata"]["id"] = other
    async with admin_app(db_url) as (app, admin):
        answer = await admin.post("/device-metadata", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["warnings"] == [(
            f"metadata.id: {other!r} is not the record id: the document is stored and served as sent; "
            f"every flavor names the instance {instance_id}")]
        assert (await admin.get(f"/device-metadata/{instance_id}")).json()["id"] == other
        assert (await guest_get(app, "10.70.20.5", "/metadata")).json()["id"] == other
        assert (await guest_get(app, "10.70.20.5", "/latest/meta-data/instance-id")).text == instance_id
        assert (await guest_get(app, "10.70.20.5", "/2009-04-04/meta-data/instance-id")).text == instance_id
        identity = (await guest_get(app, "10.70.20.5", "/latest/dynamic/instance-identity/document")).json()
        assert identity["instanceId"] == instance_id
        openstack = (await guest_get(app, "10.70.20.5", "/openstack/latest/meta_data.json")).json()
        assert openstack["uuid"] == instance_id
        nocloud = (await guest_get(app, "10.70.20.5", "/nocloud/meta-data")).text
        assert f"instance-id: {instance_id}" in nocloud


async def test_a_write_without_ip_addresses_drops_them_all_and_says_which(db_url):
    """Hollow's reading of a missing list: empty. The answer's "dropped" names each address that went."""
    instance_id = new_id()
    async with admin_app(db_url) as (app, admin):
        assert (await admin.post("/device-metadata", json=body_of(instance_id, ["10.70.21.5", SPELLED]))
                ).status_code == 200
        answer = await admin.post("/device-metadata", json=body_of(instance_id, None, plan="c3"))
        assert answer.status_code == 200, answer.text
        assert answer.json()["ipAddresses"] == []
        assert sorted(answer.json()["dropped"]) == sorted(["10.70.21.5", SPELLED])
        assert (await guest_get(app, "10.70.21.5", "/metadata")).status_code == 404
        assert (await admin.get(f"/device-metadata/{instance_id}")).json()["plan"] == "c3"
        userdata = await admin.post("/device-userdata", json={"id": instance_id, "userdata": "#!/bin/sh\n"})
        assert userdata.status_code == 200, userdata.text


async def test_strict_records_keeps_the_old_rules(db_url):
    """--strict-records: host bits, a foreign document id and a missing list are each a 400; nothing is stored."""
    instance_id = new_id()
    async with admin_app(db_url, strict_records=True) as (app, admin):
        spelled = await admin.post("/device-metadata", json=body_of(instance_id, [SPELLED]))
        assert spelled.status_code == 400
        assert spelled.json()["errors"] == [{"field": "ipAddresses[0]", "message": (
            "'10.70.17.9/31' has host bits set: write the network 10.70.17.8/31 or the host 10.70.17.9 "
            "(a CIDR is never widened)")}]
        foreign = body_of(instance_id, ["10.70.22.5"])
        foreign["metadata"]["id"] = new_id()
        answer = await admin.post("/device-metadata", json=foreign)
        assert (answer.status_code, answer.json()["errors"][0]["field"]) == (400, "metadata.id")
        missing = await admin.post("/device-metadata", json=body_of(instance_id, None))
        assert (missing.status_code, missing.json()["errors"][0]["field"]) == (400, "ipAddresses")
        assert (await admin.get(f"/device-metadata/{instance_id}")).status_code == 404
        assert (await guest_get(app, "10.70.17.9", "/metadata")).status_code == 404


async def test_bulk_writes_read_the_same_way(db_url):
    """POST /device-records shares the wire rules: a spelled address is accepted and stored as sent."""
    instance_id = new_id()
    async with admin_app(db_url) as (app, admin):
        answer = await admin.post("/device-records", json=[body_of(instance_id, [SPELLED])])
        assert answer.json()["results"] == [{"id": instance_id, "outcome": "created", "reason": None}]
        assert (await guest_get(app, "10.70.17.8", "/metadata")).json()["id"] == instance_id
        assert (await admin.get(f"/device-records/{instance_id}")).json()["ipAddresses"] == [SPELLED]
    async with admin_app(db_url, strict_records=True) as (_app, admin):
        refused = (await admin.post("/device-records", json=[body_of(new_id(), [SPELLED])])).json()["results"]
        assert refused[0]["outcome"] == "rejected"
        assert "has host bits set" in refused[0]["reason"]


async def test_explaining_an_address_no_entry_holds_is_an_answer_not_a_500():
    """No lookup configured used to raise KeyError 'by_ip_cache' (500); now: nobody holds it, and why."""
    async with admin_app("memory://") as (_app, admin):
        answer = await admin.get("/explain", params={"q": "10.70.99.1"})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert (body["instance_id"], body["matched"], body["upstream"]) == (None, None, {"configured": False})
        assert body["why"] == "no stored entry contains it: no instance holds 10.70.99.1"


async def test_pull_mode_lookups_read_the_same_way(db_url):
    """An upstream (hollow) answer listing 10.70.17.9/31 serves the caller .8 and is stored as sent."""
    instance_id = new_id()
    record = body_of(instance_id, [SPELLED])
    with running_upstream() as upstream:
        upstream.answer("/device-metadata", 200, record)
        async with admin_app(db_url, lookup_url=upstream.base, lookup_timeout=2.0) as (app, admin):
            served = await guest_get(app, "10.70.17.8", "/metadata")
            assert (served.status_code, served.json()["id"]) == (200, instance_id)
            assert (await admin.get(f"/device-records/{instance_id}")).json()["ipAddresses"] == [SPELLED]
        async with admin_app("memory://", lookup_url=upstream.base, lookup_timeout=2.0, strict_records=True) as (
                app, _admin):
            refused = await guest_get(app, "10.70.17.8", "/metadata")
            assert refused.status_code == 502
            assert "ipAddresses[0]" in refused.text
