"""The admin API over HTTP: writes, reads, deletes, validation and limits, at ``/`` and ``/api/v1``."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from factories import metadata_body, new_id, next_ipv4, next_ipv6, userdata_body
from helpers import admin_client, guest_get, make_settings, running_app
from imds.web.instance import InstanceFront

pytestmark = pytest.mark.anyio

PREFIXES = ["", "/api/v1"]
TOO_LARGE = "request body is larger than 512 bytes (--max-body-bytes / IMDS_MAX_BODY_BYTES)"
TEMPLATES = {"api_url": "https://{{.facility}}.example/{{.id}}", "phone_home_url": "https://ph.example/{{.id}}"}


@asynccontextmanager
async def admin_app(**overrides: Any) -> AsyncIterator[tuple[InstanceFront, httpx.AsyncClient]]:
    async with running_app(make_settings(**overrides)) as app, admin_client(app) as admin:
        yield app, admin


def applied_body(instance_id: str, ips: list[str], moved=None, dropped=None) -> dict[str, Any]:
    """The answer to an applied write; each moved address is also a warning (a move is never silent)."""
    body = {"id": instance_id, "applied": True, "ipAddresses": ips, "moved": moved or {}, "dropped": dropped or []}
    if moved:
        body["warnings"] = [f"ipAddresses: {ip} moved here from instance {holder} (an address has one holder: "
                            "the last write wins)" for ip, holder in moved.items()]
    return body


def errors_of(response: httpx.Response) -> dict[str, str]:
    body = response.json()
    assert set(body) == {"message", "errors"}
    return {e["field"]: e["message"] for e in body["errors"]}


# --- writes and reads -----------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", PREFIXES)
async def test_metadata_as_an_object_is_stored_and_read_back_by_id(prefix):
    """The hollow form: the write answers what it did; GET by id returns the document as stored."""
    async with admin_app() as (app, admin):
        body = metadata_body(ips=[ip := next_ipv4()], plan="c3.small", nested={"a": [1, None, "ü"]})
        posted = await admin.post(f"{prefix}/device-metadata", json=body)
        assert posted.status_code == 200
        assert posted.headers["content-type"] == "application/json"
        assert posted.headers["x-imds-write"] == "applied"
        assert posted.json() == applied_body(body["id"], [ip])
        got = await admin.get(f"{prefix}/device-metadata/{body['id']}")
        assert got.status_code == 200
        assert got.headers["content-type"] == "application/json"
        assert got.json() == body["metadata"]
        assert (await guest_get(app, ip, "/metadata")).json() == body["metadata"]


async def test_metadata_as_a_json_encoded_string_is_stored_as_the_object():
    """The friendlier form: a string holding the document is decoded before it is stored."""
    async with admin_app() as (_app, admin):
        body = metadata_body(ips=[next_ipv4()], facility="ams1")
        document = body["metadata"]
        posted = await admin.post("/device-metadata", json={**body, "metadata": json.dumps(document)})
        assert posted.json()["applied"] is True
        assert (await admin.get(f"/device-metadata/{body['id']}")).json() == document


async def test_upper_case_id_is_stored_lower_case():
    """Ids are canonical: a write with an upper-case UUID is read back with either case."""
    async with admin_app() as (_app, admin):
        body = metadata_body(ips=[next_ipv4()])
        posted = await admin.post("/device-metadata", json={**body, "id": body["id"].upper()})
        assert posted.json()["id"] == body["id"]
        assert (await admin.get(f"/device-metadata/{body['id'].upper()}")).json() == body["metadata"]


@pytest.mark.parametrize(
    ("sent", "extra", "stored"),
    [
        ("#!/bin/sh\necho hi\n", {}, b"#!/bin/sh\necho hi\n"),
        ("#cloud-config\nruncmd: [[ls]]\n", {}, b"#cloud-config\nruncmd: [[ls]]\n"),
        (base64.b64encode(b"#!/bin/sh\nexit 0\n").decode(), {}, b"#!/bin/sh\nexit 0\n"),
        (base64.b64encode(bytes(range(256))).decode(), {}, bytes(range(256))),
        ("YWJj", {"userdata_encoding": "text"}, b"YWJj"),
        ("YWJj", {"userdata_encoding": "base64"}, b"abc"),
        ("", {}, b""),
        ("snow ☃", {}, "snow ☃".encode()),
    ],
)
async def test_userdata_text_or_base64_is_stored_as_bytes(sent, extra, stored):
    """Text is stored verbatim, strict base64 decoded, and userdata_encoding overrides the guess."""
    async with admin_app() as (app, admin):
        instance_id, ip = new_id(), next_ipv4()
        posted = await admin.post("/device-userdata", json=userdata_body(instance_id, [ip], sent, **extra))
        assert posted.json() == applied_body(instance_id, [ip])
        assert posted.headers["x-imds-write"] == "applied"
        got = await admin.get(f"/device-userdata/{instance_id}")
        assert got.headers["content-type"] == "application/octet-stream"
        assert got.content == stored
        assert (await guest_get(app, ip, "/userdata")).content == stored


async def test_a_second_write_replaces_the_record_entirely():
    """Full replacement: keys absent from the new document are gone."""
    async with admin_app() as (_app, admin):
        body = metadata_body(ips=[next_ipv4()], old="x")
        await admin.post("/device-metadata", json=body)
        replacement = {**body, "metadata": {"id": body["id"], "new": "y"}}
        await admin.post("/device-metadata", json=replacement)
        assert (await admin.get(f"/device-metadata/{body['id']}")).json() == {"id": body["id"], "new": "y"}


async def test_addresses_are_normalised_in_the_answer_and_for_lookup():
    """Every textual form is accepted; the answer shows the normalised form; each one identifies the instance."""
    async with admin_app() as (app, admin):
        body = metadata_body(
            ips=["10.77.2.0/255.255.255.0", "2001:DB8:77:0:0:0:0:1", "::ffff:10.78.0.9", "2001:DB8:78::/64",
                 "10.77.2.9"]
        )
        posted = await admin.post("/device-metadata", json=body)
        assert posted.json()["ipAddresses"] == [
            "10.77.2.0/24",
            "2001:db8:77::1",
            "10.78.0.9",
            "2001:db8:78::/64",
            "10.77.2.9",
        ]
        for caller in ("10.77.2.200", "2001:db8:77::1", "10.78.0.9", "::ffff:10.78.0.9", "2001:db8:78::ffff"):
            assert (await guest_get(app, caller, "/metadata")).json() == body["metadata"], caller


async def test_duplicate_addresses_collapse():
    """The same network in two spellings is held once."""
    async with admin_app() as (_app, admin):
        body = metadata_body(ips=["10.79.0.1", "10.79.0.1/32", "::ffff:10.79.0.1"])
        assert (await admin.post("/device-metadata", json=body)).json()["ipAddresses"] == ["10.79.0.1"]


# --- the address list is the whole truth --------------------------------------------------------------


async def test_unlisted_addresses_are_dropped():
    """Each write's list replaces the last; an address left out no longer identifies the instance."""
    async with admin_app() as (app, admin):
        keep, drop, add = next_ipv4(), next_ipv4(), next_ipv6()
        body = metadata_body(ips=[keep, drop])
        await admin.post("/device-metadata", json=body)
        posted = await admin.post("/device-metadata", json={**body, "ipAddresses": [keep, add]})
        assert posted.json() == applied_body(body["id"], [keep, add], dropped=[drop])
        assert (await guest_get(app, drop, "/metadata")).status_code == 404
        assert (await guest_get(app, keep, "/metadata")).json() == body["metadata"]
        assert (await guest_get(app, add, "/metadata")).json() == body["metadata"]


async def test_an_empty_list_removes_every_address_but_keeps_the_record():
    """``ipAddresses: []`` unbinds the instance; it is still readable by id."""
    async with admin_app() as (app, admin):
        body = metadata_body(ips=[ip := next_ipv4()])
        await admin.post("/device-metadata", json=body)
        posted = await admin.post("/device-metadata", json={**body, "ipAddresses": []})
        assert posted.json() == applied_body(body["id"], [], dropped=[ip])
        assert (await guest_get(app, ip, "/metadata")).status_code == 404
        assert (await admin.get(f"/device-metadata/{body['id']}")).json() == body["metadata"]


async def test_an_address_held_by_another_instance_moves_last_write_wins():
    """B naming A's address takes it; A keeps its other addresses and its record."""
    async with admin_app() as (app, admin):
        shared, own = next_ipv4(), next_ipv4()
        a = metadata_body(ips=[shared, own], name="a")
        b = metadata_body(ips=[shared], name="b")
        await admin.post("/device-metadata", json=a)
        posted = await admin.post("/device-metadata", json=b)
        assert posted.json() == applied_body(b["id"], [shared], moved={shared: a["id"]})
        assert (await guest_get(app, shared, "/metadata")).json() == b["metadata"]
        assert (await guest_get(app, own, "/metadata")).json() == a["metadata"]
        assert (await admin.get(f"/device-metadata/{a['id']}")).json() == a["metadata"]


async def test_an_instance_that_loses_its_only_address_stays_readable_by_id():
    """Moving every address away leaves the old instance's records in place."""
    async with admin_app() as (app, admin):
        ip = next_ipv6()
        a = metadata_body(ips=[ip], name="a")
        await admin.post("/device-metadata", json=a)
        await admin.post("/device-userdata", json=userdata_body(a["id"], [ip], "a-script"))
        b = metadata_body(ips=[ip], name="b")
        await admin.post("/device-metadata", json=b)
        assert (await admin.get(f"/device-metadata/{a['id']}")).json() == a["metadata"]
        assert (await admin.get(f"/device-userdata/{a['id']}")).content == b"a-script"
        assert (await guest_get(app, ip, "/metadata")).json() == b["metadata"]


async def test_addresses_move_across_record_types():
    """Userdata for B naming A's metadata address moves it: the caller now is B, which has no metadata."""
    async with admin_app() as (app, admin):
        x = next_ipv4()
        a = metadata_body(ips=[x], name="a")
        await admin.post("/device-metadata", json=a)
        b_id = new_id()
        posted = await admin.post("/device-userdata", json=userdata_body(b_id, [x], "#!/bin/sh\necho b\n"))
        assert posted.json() == applied_body(b_id, [x], moved={x: a["id"]})
        userdata = await guest_get(app, x, "/userdata")
        assert userdata.status_code == 200
        assert userdata.content == b"#!/bin/sh\necho b\n"
        metadata = await guest_get(app, x, "/metadata")
        assert metadata.status_code == 404
        assert metadata.json() == {"message": f"no metadata stored for instance {b_id}"}
        assert (await admin.get(f"/device-metadata/{a['id']}")).json() == a["metadata"]
        missing = await admin.get(f"/device-metadata/{b_id}")
        assert missing.status_code == 404
        assert missing.json() == {"message": f"no metadata stored for instance {b_id}"}


async def test_both_record_types_share_one_address_list():
    """A userdata write's list replaces the list the metadata write set for the same instance."""
    async with admin_app() as (app, admin):
        x, y = next_ipv4(), next_ipv4()
        body = metadata_body(ips=[x, y])
        await admin.post("/device-metadata", json=body)
        posted = await admin.post("/device-userdata", json=userdata_body(body["id"], [x], "u"))
        assert posted.json() == applied_body(body["id"], [x], dropped=[y])
        assert (await guest_get(app, x, "/metadata")).json() == body["metadata"]
        assert (await guest_get(app, x, "/userdata")).content == b"u"
        assert (await guest_get(app, y, "/metadata")).status_code == 404


# --- staleness guard -------------------------------------------------------------------------------------


async def test_an_older_updated_at_changes_nothing_and_says_so():
    """Stale write: 200, applied false, X-Imds-Write: stale; document and addresses unchanged."""
    async with admin_app() as (app, admin):
        old_ip, new_ip = next_ipv4(), next_ipv4()
        current = metadata_body(ips=[old_ip], updated_at="2024-05-02T00:00:00Z", v=2)
        await admin.post("/device-metadata", json=current)
        stale = metadata_body(current["id"], ips=[new_ip], updated_at="2024-05-01T23:59:59+00:00", v=1)
        posted = await admin.post("/device-metadata", json=stale)
        assert posted.status_code == 200
        assert posted.headers["x-imds-write"] == "stale"
        answer = posted.json()
        assert answer["id"] == current["id"]
        assert answer["applied"] is False
        assert "2024-05-01T23:59:59+00:00" in answer["reason"]
        assert "2024-05-02T00:00:00Z" in answer["reason"]
        assert "ipAddresses" not in answer
        assert (await admin.get(f"/device-metadata/{current['id']}")).json() == current["metadata"]
        assert (await guest_get(app, old_ip, "/metadata")).json() == current["metadata"]
        assert (await guest_get(app, new_ip, "/metadata")).status_code == 404


async def test_a_stale_write_does_not_move_addresses_from_other_instances():
    """The guard refuses the whole write, address moves included."""
    async with admin_app() as (app, admin):
        mine, theirs = next_ipv4(), next_ipv4()
        current = metadata_body(ips=[mine], updated_at="2024-05-02T00:00:00Z")
        other = metadata_body(ips=[theirs])
        await admin.post("/device-metadata", json=current)
        await admin.post("/device-metadata", json=other)
        stale = metadata_body(current["id"], ips=[mine, theirs], updated_at="2024-01-01T00:00:00Z")
        assert (await admin.post("/device-metadata", json=stale)).json()["applied"] is False
        assert (await guest_get(app, theirs, "/metadata")).json() == other["metadata"]


@pytest.mark.parametrize(
    ("stored", "incoming"),
    [
        ("2024-05-01T00:00:00Z", "2024-05-01T00:00:00Z"),
        ("2024-05-01T00:00:00Z", "2024-05-01T02:00:00+02:00"),
        ("2024-05-01T00:00:00Z", "2024-05-01T00:00:01Z"),
        ("2024-05-01T00:00:00Z", None),
        (None, "2000-01-01T00:00:00Z"),
    ],
)
async def test_equal_newer_or_unstamped_writes_apply(stored, incoming):
    """Only a strictly older stamp on both sides is stale; equal instants and missing stamps apply."""
    async with admin_app() as (_app, admin):
        first = metadata_body(ips=[next_ipv4()], v=1, **({"updated_at": stored} if stored else {}))
        await admin.post("/device-metadata", json=first)
        second = metadata_body(first["id"], ips=[next_ipv4()], v=2, **({"updated_at": incoming} if incoming else {}))
        posted = await admin.post("/device-metadata", json=second)
        assert posted.headers["x-imds-write"] == "applied"
        assert posted.json()["applied"] is True
        assert (await admin.get(f"/device-metadata/{first['id']}")).json()["v"] == 2


async def test_userdata_writes_are_not_subject_to_the_metadata_stamp():
    """The guard compares metadata documents; a userdata write always applies."""
    async with admin_app() as (_app, admin):
        body = metadata_body(ips=[ip := next_ipv4()], updated_at="2030-01-01T00:00:00Z")
        await admin.post("/device-metadata", json=body)
        posted = await admin.post("/device-userdata", json=userdata_body(body["id"], [ip], "new"))
        assert posted.json()["applied"] is True
        assert (await admin.get(f"/device-userdata/{body['id']}")).content == b"new"


# --- reads: GET and HEAD ------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", PREFIXES)
async def test_head_answers_the_get_length_without_a_body(prefix):
    """HEAD on both record types has GET's Content-Length and content type, template fields included."""
    async with admin_app(**TEMPLATES) as (_app, admin):
        body = metadata_body(ips=[ip := next_ipv4()], facility="fra2", city="Zürich")
        await admin.post("/device-metadata", json=body)
        await admin.post("/device-userdata", json=userdata_body(body["id"], [ip], "#!/bin/sh\necho ☃\n"))
        for kind in ("metadata", "userdata"):
            path = f"{prefix}/device-{kind}/{body['id']}"
            got, head = await admin.get(path), await admin.head(path)
            assert head.status_code == got.status_code == 200
            assert head.content == b""
            assert int(head.headers["content-length"]) == len(got.content) > 0
            assert head.headers["content-type"] == got.headers["content-type"]
        document = (await admin.get(f"{prefix}/device-metadata/{body['id']}")).json()
        assert document["api_url"] == f"https://fra2.example/{body['id']}"
        assert document["phone_home_url"] == f"https://ph.example/{body['id']}"


async def test_head_of_a_missing_record_is_404_without_a_body():
    """HEAD follows GET's status."""
    async with admin_app() as (_app, admin):
        head = await admin.head(f"/device-metadata/{new_id()}")
        assert head.status_code == 404
        assert head.content == b""


async def test_read_by_id_includes_template_fields_only_when_missing():
    """The admin read is the document an instance would see: stored keys win over templates."""
    async with admin_app(**TEMPLATES) as (_app, admin):
        body = metadata_body(ips=[next_ipv4()], facility="ams1", api_url="https://own.example")
        await admin.post("/device-metadata", json=body)
        document = (await admin.get(f"/device-metadata/{body['id']}")).json()
        assert document == {**body["metadata"], "phone_home_url": f"https://ph.example/{body['id']}"}


@pytest.mark.parametrize("kind", ["metadata", "userdata"])
async def test_reading_an_unknown_id_is_404_json(kind):
    """No record → 404 with a message naming the record type and id."""
    async with admin_app() as (_app, admin):
        instance_id = new_id()
        got = await admin.get(f"/device-{kind}/{instance_id}")
        assert got.status_code == 404
        assert got.json() == {"message": f"no {kind} stored for instance {instance_id}"}


# --- delete ---------------------------------------------------------------------------------------------


async def test_delete_keeps_addresses_until_no_record_type_remains():
    """Deleting metadata keeps the IP bound (userdata remains); deleting userdata then unbinds it."""
    async with admin_app() as (app, admin):
        body = metadata_body(ips=[ip := next_ipv4()])
        instance_id = body["id"]
        await admin.post("/device-metadata", json=body)
        await admin.post("/device-userdata", json=userdata_body(instance_id, [ip], "ud"))

        deleted = await admin.delete(f"/device-metadata/{instance_id}")
        assert deleted.status_code == 200
        assert deleted.json() == {"id": instance_id, "deleted": "metadata"}
        assert (await admin.get(f"/device-metadata/{instance_id}")).status_code == 404
        assert (await admin.get(f"/device-userdata/{instance_id}")).content == b"ud"
        assert (await guest_get(app, ip, "/userdata")).content == b"ud"
        gone = await guest_get(app, ip, "/metadata")
        assert gone.status_code == 404
        assert gone.json() == {"message": f"no metadata stored for instance {instance_id}"}

        deleted = await admin.delete(f"/device-userdata/{instance_id}")
        assert deleted.json() == {"id": instance_id, "deleted": "userdata"}
        unknown = await guest_get(app, ip, "/userdata")
        assert unknown.status_code == 404
        assert unknown.json() == {"message": f"no instance is associated with {ip}"}


@pytest.mark.parametrize("kind", ["metadata", "userdata"])
async def test_deleting_an_absent_record_type_is_404(kind):
    """404 when that record type is absent, even if the other exists; nothing else changes."""
    other = "userdata" if kind == "metadata" else "metadata"
    async with admin_app() as (app, admin):
        instance_id, ip = new_id(), next_ipv4()
        if other == "metadata":
            await admin.post("/device-metadata", json=metadata_body(instance_id, ips=[ip]))
        else:
            await admin.post("/device-userdata", json=userdata_body(instance_id, [ip], "u"))
        missing = await admin.delete(f"/device-{kind}/{instance_id}")
        assert missing.status_code == 404
        assert missing.json() == {"message": f"no {kind} stored for instance {instance_id}"}
        assert (await guest_get(app, ip, f"/{other}")).status_code == 200


async def test_deleting_twice_is_404_the_second_time():
    """A delete is not idempotent in status: the second finds nothing."""
    async with admin_app() as (_app, admin):
        body = metadata_body(ips=[next_ipv4()])
        await admin.post("/device-metadata", json=body)
        assert (await admin.delete(f"/device-metadata/{body['id']}")).status_code == 200
        again = await admin.delete(f"/device-metadata/{body['id']}")
        assert again.status_code == 404
        assert again.json()["message"] == f"no metadata stored for instance {body['id']}"


async def test_a_deleted_instance_can_be_written_again():
    """After both records go, the id and addresses are free for a fresh write."""
    async with admin_app() as (app, admin):
        body = metadata_body(ips=[ip := next_ipv4()], v=1)
        await admin.post("/device-metadata", json=body)
        await admin.delete(f"/device-metadata/{body['id']}")
        assert (await guest_get(app, ip, "/metadata")).status_code == 404
        again = metadata_body(body["id"], ips=[ip], v=2)
        assert (await admin.post("/device-metadata", json=again)).json() == applied_body(body["id"], [ip])
        assert (await guest_get(app, ip, "/metadata")).json()["v"] == 2


# --- validation --------------------------------------------------------------------------------------------

VALID_ID = "3f2504e0-4f89-11d3-9a0c-0305e82c3301"


@pytest.mark.parametrize(
    ("path", "raw", "expected"),
    [
        ("/device-metadata", b"{not json", {"body"}),
        ("/device-metadata", b"", {"body"}),
        ("/device-metadata", b"\xff\xfe", {"body"}),
        ("/device-metadata", b"[1, 2]", {"body", "id", "ipAddresses", "metadata"}),
        ("/device-metadata", json.dumps({"ipAddresses": [], "metadata": {}}).encode(), {"id"}),
        ("/device-metadata", json.dumps({"id": "i-123", "ipAddresses": [], "metadata": {}}).encode(), {"id"}),
        (
            "/device-metadata",
            json.dumps(
                {"id": VALID_ID, "ipAddresses": ["10.0.0.1", "::1", "fd00::1", "10.0.0.256"], "metadata": {}}
            ).encode(),
            {"ipAddresses[3]"},
        ),
        ("/device-metadata", json.dumps({"id": VALID_ID, "ipAddresses": [], "metadata": "{x"}).encode(), {"metadata"}),
        (
            "/device-metadata",
            json.dumps({"id": VALID_ID, "ipAddresses": [], "metadata": {"updated_at": "later"}}).encode(),
            {"metadata.updated_at"},
        ),
        ("/device-userdata", b"nope", {"body"}),
        ("/device-userdata", json.dumps({"id": VALID_ID, "ipAddresses": []}).encode(), {"userdata"}),
        (
            "/device-userdata",
            json.dumps({"id": VALID_ID, "ipAddresses": [], "userdata": "!", "userdata_encoding": "base64"}).encode(),
            {"userdata"},
        ),
        (
            "/device-userdata",
            json.dumps({"id": VALID_ID, "ipAddresses": [], "userdata": "x", "userdata_encoding": "utf8"}).encode(),
            {"userdata_encoding"},
        ),
    ],
)
async def test_bad_input_is_400_naming_each_offending_field(path, raw, expected):
    """Every malformed body is a 400 with ``message`` and one ``errors`` entry per offending field."""
    await _assert_each_field_named(path, raw, expected)


async def test_a_missing_address_list_is_400_with_strict_records():
    """--strict-records: no ``ipAddresses`` is a 400 naming it (by default it is hollow's empty list)."""
    raw = json.dumps({"id": VALID_ID, "metadata": {}}).encode()
    await _assert_each_field_named("/device-metadata", raw, {"ipAddresses"}, strict_records=True)


async def _assert_each_field_named(path: str, raw: bytes, expected: set[str], **overrides: Any) -> None:
    async with admin_app(**overrides) as (_app, admin):
        for prefix in PREFIXES:
            answer = await admin.post(prefix + path, content=raw, headers={"content-type": "application/json"})
            assert answer.status_code == 400
            assert answer.headers["content-type"] == "application/json"
            assert answer.json()["message"] == "invalid request"
            found = errors_of(answer)
            assert set(found) == expected
            assert all(isinstance(m, str) and m for m in found.values())


async def test_every_problem_in_one_body_is_reported_together():
    """A body with several problems lists each field, with messages that say what is wrong."""
    async with admin_app() as (_app, admin):
        body = {"id": "i-1", "ipAddresses": ["10.0.0.1", 5, "nonsense", "10.0.0.0/40"], "metadata": "[not json"}
        answer = await admin.post("/device-metadata", json=body)
        assert answer.status_code == 400
        assert [e["field"] for e in answer.json()["errors"]] == [
            "id",
            "ipAddresses[1]",
            "ipAddresses[2]",
            "ipAddresses[3]",
            "metadata",
        ]
        found = errors_of(answer)
        assert "UUID" in found["id"]
        assert found["ipAddresses[1]"] == "must be a string"
        assert found["ipAddresses[2]"] == "'nonsense' is not an IP address or CIDR"
        assert found["ipAddresses[3]"] == "'10.0.0.0/40' is not an IP address or CIDR"
        assert found["metadata"].startswith("is a string but not valid JSON")


@pytest.mark.parametrize("method", ["GET", "HEAD", "DELETE"])
@pytest.mark.parametrize("kind", ["metadata", "userdata"])
async def test_a_malformed_id_in_the_path_is_400(method, kind):
    """GET, HEAD and DELETE by an id that is not a UUID name the ``id`` field."""
    async with admin_app() as (_app, admin):
        answer = await admin.request(method, f"/device-{kind}/not-a-uuid")
        assert answer.status_code == 400
        if method != "HEAD":
            assert errors_of(answer) == {"id": "must be a UUID such as 3f2504e0-4f89-11d3-9a0c-0305e82c3301"}


# --- size limit -----------------------------------------------------------------------------------------------

LIMIT = 512
JSON_TYPE = "application/json"
TOO_LARGE = f"request body is larger than {LIMIT} bytes (--max-body-bytes / IMDS_MAX_BODY_BYTES)"


def big_metadata_body() -> dict[str, Any]:
    body = metadata_body(ips=[next_ipv4()], padding="x" * (LIMIT * 2))
    assert len(json.dumps(body)) > LIMIT
    return body


@pytest.mark.parametrize("prefix", PREFIXES)
async def test_a_body_over_the_limit_with_content_length_is_413(prefix):
    """A declared Content-Length over max_body_bytes is refused with 413 and a JSON body."""
    async with admin_app(max_body_bytes=LIMIT) as (app, admin):
        body = big_metadata_body()
        answer = await admin.post(f"{prefix}/device-metadata", json=body)
        assert int(answer.request.headers["content-length"]) > LIMIT
        assert answer.status_code == 413
        assert answer.json() == {
            "message": "request body too large",
            "errors": [{"field": "body", "message": TOO_LARGE}],
        }
        assert (await admin.get(f"/device-metadata/{body['id']}")).status_code == 404
        assert (await guest_get(app, body["ipAddresses"][0], "/metadata")).status_code == 404


async def test_a_declared_length_over_the_limit_is_refused_before_the_body_is_read():
    """The Content-Length check alone decides: the body stream is never consumed."""
    consumed = []

    async def tiny() -> AsyncIterator[bytes]:
        consumed.append(True)
        yield b"{}"

    async with admin_app(max_body_bytes=LIMIT) as (_app, admin):
        answer = await admin.post(
            "/device-metadata", content=tiny(), headers={"content-length": str(LIMIT + 1), "content-type": JSON_TYPE}
        )
        assert answer.status_code == 413
        assert answer.json()["message"] == "request body too large"
        assert consumed == []


@pytest.mark.parametrize("path", ["/device-metadata", "/device-userdata"])
async def test_a_chunked_body_over_the_limit_is_413(path):
    """Without Content-Length, the body is counted as it streams and refused once over the limit."""
    body = big_metadata_body() if path == "/device-metadata" else userdata_body(new_id(), [next_ipv4()], "x" * 2000)
    raw = json.dumps(body).encode()

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(raw), 100):
            yield raw[start : start + 100]

    async with admin_app(max_body_bytes=LIMIT) as (app, admin):
        answer = await admin.post(path, content=chunks(), headers={"content-type": JSON_TYPE})
        assert "content-length" not in answer.request.headers
        assert answer.request.headers["transfer-encoding"] == "chunked"
        assert answer.status_code == 413
        assert errors_of(answer) == {"body": TOO_LARGE}
        kind = path.removeprefix("/device-")
        assert (await admin.get(f"/device-{kind}/{body['id']}")).status_code == 404
        assert (await guest_get(app, body["ipAddresses"][0], f"/{kind}")).status_code == 404


async def test_a_chunked_body_within_the_limit_is_accepted():
    """Streaming by itself is fine: a small chunked body is written."""
    body = metadata_body(ips=[next_ipv4()])
    raw = json.dumps(body).encode()

    async def chunks() -> AsyncIterator[bytes]:
        yield raw[:10]
        yield raw[10:]

    async with admin_app(max_body_bytes=LIMIT) as (_app, admin):
        answer = await admin.post("/device-metadata", content=chunks(), headers={"content-type": JSON_TYPE})
        assert answer.json()["applied"] is True


async def test_a_body_exactly_at_the_limit_is_accepted():
    """The limit is inclusive."""
    body = metadata_body(ips=[next_ipv4()], pad="")
    size = len(json.dumps(body).encode())
    body["metadata"]["pad"] = "p" * (LIMIT - size)
    raw = json.dumps(body).encode()
    assert len(raw) == LIMIT
    async with admin_app(max_body_bytes=LIMIT) as (_app, admin):
        answer = await admin.post("/device-metadata", content=raw, headers={"content-type": JSON_TYPE})
        assert answer.json()["applied"] is True


# --- nothing is written on any error --------------------------------------------------------------------------


def failing_requests(instance_id: str, ip: str) -> list[tuple[str, dict[str, Any], int]]:
    """(path, httpx request kwargs, expected status) for writes that must change nothing."""
    good_meta = {"id": instance_id, "ipAddresses": [ip], "metadata": {"id": instance_id, "v": "bad"}}
    good_user = {"id": instance_id, "ipAddresses": [ip], "userdata": "bad"}
    return [
        ("/device-metadata", {"json": {**good_meta, "ipAddresses": [ip, "10.0.0.999"]}}, 400),
        ("/device-metadata", {"json": {**good_meta, "metadata": "{"}}, 400),
        ("/device-metadata", {"json": {**good_meta, "metadata": {"updated_at": "?"}}}, 400),
        ("/device-metadata", {"content": json.dumps(good_meta).encode()[:-1]}, 400),
        ("/device-metadata", {"json": {**good_meta, "metadata": {"pad": "x" * LIMIT}}}, 413),
        ("/device-metadata", {"json": good_meta, "headers": {"authorization": "Bearer wrong"}}, 401),
        ("/device-userdata", {"json": {**good_user, "ipAddresses": "10.0.0.1"}}, 400),
        ("/device-userdata", {"json": {**good_user, "userdata": "!!", "userdata_encoding": "base64"}}, 400),
        ("/device-userdata", {"json": {**good_user, "userdata_encoding": "rot13"}}, 400),
        ("/device-userdata", {"json": {**good_user, "userdata": "x" * LIMIT}}, 413),
        ("/device-userdata", {"json": good_user, "headers": {"authorization": "Bearer wrong"}}, 401),
    ]


async def test_nothing_is_written_for_a_new_instance_on_any_error():
    """A failed write leaves no record and binds no address."""
    async with admin_app(max_body_bytes=LIMIT) as (app, admin):
        for index in range(len(failing_requests(new_id(), "192.0.2.1"))):
            instance_id, ip = new_id(), next_ipv4()
            path, kwargs, status = failing_requests(instance_id, ip)[index]
            answer = await admin.post(path, **kwargs)
            assert answer.status_code == status, (path, kwargs)
            assert "message" in answer.json()
            for kind in ("metadata", "userdata"):
                assert (await admin.get(f"/device-{kind}/{instance_id}")).status_code == 404
                assert (await guest_get(app, ip, f"/{kind}")).status_code == 404


async def test_nothing_changes_for_an_existing_instance_on_any_error():
    """A failed write leaves the stored records and every address binding as they were."""
    async with admin_app(max_body_bytes=LIMIT) as (app, admin):
        old_ip, new_ip = next_ipv4(), next_ipv4()
        other = metadata_body(ips=[new_ip], name="other")
        await admin.post("/device-metadata", json=other)
        body = metadata_body(ips=[old_ip], v="good")
        instance_id = body["id"]
        await admin.post("/device-metadata", json=body)
        await admin.post("/device-userdata", json=userdata_body(instance_id, [old_ip], "#!good"))
        for path, kwargs, status in failing_requests(instance_id, new_ip):
            answer = await admin.post(path, **kwargs)
            assert answer.status_code == status, (path, kwargs)
            assert (await admin.get(f"/device-metadata/{instance_id}")).json() == body["metadata"]
            assert (await admin.get(f"/device-userdata/{instance_id}")).content == b"#!good"
            assert (await guest_get(app, old_ip, "/metadata")).json() == body["metadata"]
            assert (await guest_get(app, new_ip, "/metadata")).json() == other["metadata"]


# --- /api/v1 equivalence, routing, OpenAPI ------------------------------------------------------------------------


async def test_api_v1_and_root_are_the_same_api():
    """A write under one prefix is read, replaced and deleted under the other."""
    async with admin_app() as (app, admin):
        body = metadata_body(ips=[ip := next_ipv4()])
        await admin.post("/api/v1/device-metadata", json=body)
        assert (await admin.get(f"/device-metadata/{body['id']}")).json() == body["metadata"]
        await admin.post("/device-userdata", json=userdata_body(body["id"], [ip], "u1"))
        assert (await admin.get(f"/api/v1/device-userdata/{body['id']}")).content == b"u1"
        assert (await admin.delete(f"/api/v1/device-metadata/{body['id']}")).json()["deleted"] == "metadata"
        assert (await admin.get(f"/device-metadata/{body['id']}")).status_code == 404
        assert (await admin.delete(f"/device-userdata/{body['id']}")).status_code == 200
        assert (await guest_get(app, ip, "/api/v1/userdata")).status_code == 404


async def test_errors_are_the_same_under_both_prefixes():
    """Validation answers are byte-for-byte equal at / and /api/v1."""
    async with admin_app() as (_app, admin):
        bad = {"id": "x", "ipAddresses": ["y"], "metadata": 1}
        root = await admin.post("/device-metadata", json=bad)
        v1 = await admin.post("/api/v1/device-metadata", json=bad)
        assert root.status_code == v1.status_code == 400
        assert root.content == v1.content


@pytest.mark.parametrize(
    ("method", "path", "status", "message"),
    [
        ("GET", "/device-metadata", 405, "method not allowed"),
        ("PUT", "/device-metadata", 405, "method not allowed"),
        ("POST", "/device-metadata/3f2504e0-4f89-11d3-9a0c-0305e82c3301", 405, "method not allowed"),
        ("GET", "/device-metadatas", 404, "not found"),
        ("GET", "/api/v1/device-nothing/x", 404, "not found"),
        ("GET", "/api/v2/device-metadata/3f2504e0-4f89-11d3-9a0c-0305e82c3301", 404, "not found"),
    ],
)
async def test_wrong_methods_and_unknown_admin_paths_answer_json(method, path, status, message):
    """The framework's own errors use the same JSON shape, never HTML or a 500."""
    async with admin_app() as (_app, admin):
        answer = await admin.request(method, path)
        assert answer.status_code == status
        assert answer.headers["content-type"] == "application/json"
        assert answer.json() == {"message": message}


async def test_openapi_lists_the_admin_routes_with_request_schemas():
    """/openapi.json documents both POST bodies and the read/delete routes, without a duplicate /api/v1 copy."""
    async with admin_app() as (_app, admin):
        answer = await admin.get("/openapi.json")
        assert answer.status_code == 200
        spec = answer.json()
        paths = spec["paths"]
        assert {
            "/device-metadata",
            "/device-userdata",
            "/device-metadata/{instance_id}",
            "/device-userdata/{instance_id}",
        } <= set(paths)
        assert not [path for path in paths if path.startswith("/api/v1")]
        meta = paths["/device-metadata"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert meta["required"] == ["id", "ipAddresses", "metadata"]
        assert meta["properties"]["id"] == {"type": "string", "format": "uuid"}
        assert meta["properties"]["ipAddresses"]["type"] == "array"
        assert {v["type"] for v in meta["properties"]["metadata"]["oneOf"]} == {"object", "string"}
        user = paths["/device-userdata"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert user["required"] == ["id", "ipAddresses", "userdata"]
        assert user["properties"]["userdata_encoding"]["enum"] == ["text", "base64"]
        for path in ("/device-metadata/{instance_id}", "/device-userdata/{instance_id}"):
            assert {"get", "head", "delete"} <= set(paths[path])
        operation_ids = [op["operationId"] for item in paths.values() for op in item.values()]
        assert len(operation_ids) == len(set(operation_ids))
