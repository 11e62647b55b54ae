"""The OpenStack flavor over HTTP (in-process, chosen source IP): listings, every file of each version, gating, 404s."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator

from factories import new_id
from helpers import admin_client, client_from, push_record, running_app
from imds.services.render.network import derived_network_data
from imds.services.render.openstack import VERSIONS
from imds.web.instance import InstanceFront
from openstack_data import (
    DEVICE_EXAMPLES,
    SEED_ID,
    USERDATA,
    VENDOR_DATA,
    device_schema,
    devices,
    openstack_document,
    seed_document,
)

pytestmark = pytest.mark.anyio

GUEST = "10.70.17.9"
PLAIN = "10.80.0.2"  # an Equinix-only document: no OpenStack parts, no userdata
PLAIN_ID = "6f1d1f52-3c4e-4e6e-8a53-51b1bb0f2a10"
STRANGER = "10.99.99.99"
TEXT = "text/plain; charset=utf-8"
NOT_FOUND = (404, "404 - Not Found")
NIC = {"type": "nic", "bus": "pci", "address": "0000:00:05.0", "mac": "fa:16:3e:00:00:07", "tags": ["uplink"],
       "vlan": 1000, "vf_trusted": True}


@asynccontextmanager
async def seeded() -> AsyncIterator[InstanceFront]:
    """The seed document with device tags, vendor data and userdata at GUEST; a plain document at PLAIN."""
    async with running_app() as app, admin_client(app) as admin:
        await push_record(admin, [GUEST], openstack_document(), USERDATA, userdata_encoding="text")
        await push_record(admin, [PLAIN], {"id": PLAIN_ID, "hostname": "plain", "facility": "ny5"})
        yield app


async def get(app: InstanceFront, path: str, ip: str = GUEST, method: str = "GET", **kwargs: Any) -> httpx.Response:
    async with client_from(app, ip) as guest:
        return await guest.request(method, path, **kwargs)


def without_seed(body: bytes) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(body)
    document.pop("random_seed", None)
    return document


async def test_openstack_lists_the_versions_without_identifying_the_caller():
    """/openstack and /openstack/ list the versions, one per line, latest last; any caller may ask, HEAD works."""
    async with seeded() as app:
        for path, ip in (("/openstack", GUEST), ("/openstack/", STRANGER)):
            answer = await get(app, path, ip)
            assert (answer.status_code, answer.headers["content-type"]) == (200, TEXT)
            assert answer.text.split("\n") == list(VERSIONS)
        head = await get(app, "/openstack", method="HEAD")
        assert (head.status_code, head.content, head.headers["content-length"]) == (200, b"", str(len(answer.content)))


async def test_every_listed_file_of_every_version_answers():
    """Each version's listing names only files that answer 200 (JSON files as JSON); a trailing slash is accepted."""
    async with seeded() as app, client_from(app, GUEST) as guest:
        for version in VERSIONS:
            listing = await guest.get(f"/openstack/{version}")
            assert listing.status_code == 200
            assert listing.text == (await guest.get(f"/openstack/{version}/")).text
            for name in listing.text.split("\n"):
                for path in (f"/openstack/{version}/{name}", f"/openstack/{version}/{name}/"):
                    answer = await guest.get(path)
                    assert answer.status_code == 200, path
                    if name.endswith(".json"):
                        assert answer.headers["content-type"] == "application/json"
                        assert isinstance(answer.json(), dict)
        assert (await guest.get("/openstack/2012-08-10")).text == "meta_data.json\nuser_data"
        assert (await guest.get("/openstack/latest")).text == (
            "meta_data.json\nuser_data\npassword\nvendor_data.json\nnetwork_data.json\nvendor_data2.json"
        )


async def test_meta_data_json_carries_the_record():
    """latest/meta_data.json: uuid, hostname, name, zone, keys, project_id, the device tags; userdata byte for byte."""
    async with seeded() as app:
        answer = await get(app, "/openstack/latest/meta_data.json")
        document = answer.json()
        keys = seed_document()["ssh_keys"]
        assert document["uuid"] == SEED_ID
        assert (document["hostname"], document["name"], document["availability_zone"]) == (
            "metadata-example-01", "metadata-example-01", "da11")
        assert document["launch_index"] == 0
        assert document["public_keys"] == {"test@testmachine.local": keys[0], "test@testmachine.local-1": keys[1]}
        assert [k["data"] for k in document["keys"]] == keys
        assert document["project_id"] == ""
        assert document["devices"] == devices("example")
        user_data = await get(app, "/openstack/latest/user_data")
        assert (user_data.content, user_data.headers["content-type"]) == (USERDATA.encode(), TEXT)


async def test_random_seed_is_fresh_per_request_and_the_rest_is_identical():
    """Two reads of meta_data.json differ only in random_seed (512 bytes, base64); 2012-08-10 has no seed."""
    async with seeded() as app:
        first = await get(app, "/openstack/latest/meta_data.json")
        second = await get(app, "/openstack/latest/meta_data.json")
        seeds = [base64.b64decode(a.json()["random_seed"]) for a in (first, second)]
        assert [len(s) for s in seeds] == [512, 512]
        assert seeds[0] != seeds[1]
        assert without_seed(first.content) == without_seed(second.content)
        assert "random_seed" not in (await get(app, "/openstack/2012-08-10/meta_data.json")).json()
        assert "random_seed" in (await get(app, "/openstack/2013-04-04/meta_data.json")).json()


async def test_meta_data_json_is_remembered_with_a_fresh_seed_in_each_answer():
    """After one read the memo answers meta_data.json (the front's path): a new seed each time, the rest kept.

    Nova draws a seed per request too, so the memo keeps the document and splices one in per answer
    (also to a read the front recognises by its bytes); its kept Content-Length fits every answer, its
    ETag is the handler's; a new version of the record is read afresh.
    """
    path = "/openstack/latest/meta_data.json"
    async with seeded() as app:
        assert app.remembered((GUEST, 40000), path, "GET", [(b"host", b"169.254.169.254")]) is None  # not read yet
        first = await get(app, path)
        answers = [app.remembered((GUEST, 40000), path, "GET", [(b"host", b"169.254.169.254")]) for _ in range(3)]
        assert all(answer is not None for answer in answers)
        bodies = [answer.body for answer in answers if answer is not None]
        seeds = {base64.b64decode(json.loads(body)["random_seed"]) for body in [first.content, *bodies]}
        assert len(seeds) == 4
        assert {len(seed) for seed in seeds} == {512}
        assert all(without_seed(body) == without_seed(first.content) for body in bodies)
        for answer in answers:
            assert answer is not None
            headers = dict(answer.headers)
            assert headers[b"content-length"] == str(len(answer.body)).encode()
            assert headers[b"etag"].decode() == first.headers["etag"]
            assert headers[b"content-type"] == b"application/json"
            said, answer.wire = answer.body, "the bytes a server wrote"
            assert app.again((GUEST, 40000), path, answer)  # asked again by its bytes: a new body, the old wire gone
            assert answer.wire is None
            assert len(answer.body) == len(said)
            assert json.loads(answer.body)["random_seed"] != json.loads(said)["random_seed"]
            assert without_seed(answer.body) == without_seed(said)
        again = await get(app, path)  # through the ASGI entry: the memo's answer, a new seed
        assert json.loads(again.content)["random_seed"] not in {json.loads(b)["random_seed"] for b in bodies}
        head = await get(app, path, method="HEAD")
        assert (head.status_code, head.headers["content-length"]) == (200, str(len(first.content)))
        assert (await get(app, path, headers={"If-None-Match": first.headers["etag"]})).status_code == 304
        async with admin_client(app) as admin:
            await push_record(admin, [GUEST], {**openstack_document(), "hostname": "renamed"}, USERDATA,
                              userdata_encoding="text")
        assert not app.again((GUEST, 40000), path, answers[0])  # type: ignore[arg-type]
        assert app.remembered((GUEST, 40000), path, "GET", [(b"host", b"169.254.169.254")]) is None
        assert (await get(app, path)).json()["hostname"] == "renamed"


@pytest.mark.parametrize(
    ("version", "present", "nic_fields"),
    [
        ("2012-08-10", set(), None),
        ("2015-10-15", {"project_id"}, None),
        ("2016-06-30", {"project_id", "devices"}, {"type", "bus", "address", "mac", "tags"}),
        ("2017-02-22", {"project_id", "devices"}, {"type", "bus", "address", "mac", "tags", "vlan"}),
        ("2018-08-27", {"project_id", "devices"}, {"type", "bus", "address", "mac", "tags", "vlan", "vf_trusted"}),
        ("latest", {"project_id", "devices", "dedicated_cpus"},
         {"type", "bus", "address", "mac", "tags", "vlan", "vf_trusted"}),
    ],
)
async def test_fields_appear_only_from_the_version_that_introduced_them(version, present, nic_fields):
    """project_id (2015-10-15), devices (2016-06-30), vlan (2017-02-22), vf_trusted (2018-08-27) over HTTP."""
    async with running_app() as app, admin_client(app) as admin:
        await push_record(admin, [GUEST], openstack_document(devices=[NIC]))
        document = (await get(app, f"/openstack/{version}/meta_data.json")).json()
        newer = {"project_id", "devices", "dedicated_cpus"}
        assert newer & set(document) == present
        if nic_fields is not None:
            assert set(document["devices"][0]) == nic_fields


async def test_network_and_vendor_data():
    """network_data.json is derived from the Equinix network section; vendor data as given, and wrapped as static."""
    async with seeded() as app:
        assert (await get(app, "/openstack/latest/network_data.json")).json() == derived_network_data(seed_document())
        assert (await get(app, "/openstack/latest/vendor_data.json")).json() == VENDOR_DATA
        assert (await get(app, "/openstack/latest/vendor_data2.json")).json() == {"static": VENDOR_DATA}
        given = {"links": [{"id": "tap0", "type": "ovs", "ethernet_mac_address": "fa:16:3e:00:00:01"}],
                 "networks": [{"id": "n0", "type": "ipv4_dhcp", "link": "tap0"}], "services": []}
        async with admin_client(app) as admin:
            await push_record(admin, [GUEST], openstack_document(network_data=given))
        assert (await get(app, "/openstack/2015-10-15/network_data.json")).json() == given


async def test_an_equinix_only_instance_gets_valid_openstack_documents():
    """A document without devices, network_data or vendor_data still serves meta_data.json and the rest."""
    async with seeded() as app:
        document = (await get(app, "/openstack/latest/meta_data.json", PLAIN)).json()
        assert without_seed(json.dumps(document).encode()) == {
            "uuid": PLAIN_ID, "hostname": "plain", "name": "plain", "launch_index": 0, "availability_zone": "ny5",
            "project_id": "", "devices": [], "dedicated_cpus": [],
        }
        assert (await get(app, "/openstack/latest", PLAIN)).text == (
            "meta_data.json\npassword\nvendor_data.json\nnetwork_data.json\nvendor_data2.json"
        )
        assert (await get(app, "/openstack/latest/network_data.json", PLAIN)).json() == {
            "links": [], "networks": [], "services": []}
        assert (await get(app, "/openstack/latest/vendor_data.json", PLAIN)).json() == {}


@pytest.mark.parametrize(
    ("path", "ip"),
    [
        ("/openstack/2011-01-01/meta_data.json", GUEST),
        ("/openstack/2011-01-01", GUEST),
        ("/openstack/latest/nope.json", GUEST),
        ("/openstack/latest/meta_data.json/uuid", GUEST),
        ("/openstack/2012-08-10/password", GUEST),
        ("/openstack/2013-04-04/vendor_data.json", GUEST),
        ("/openstack/2013-10-17/network_data.json", GUEST),
        ("/openstack/2016-06-30/vendor_data2.json", GUEST),
        ("/openstack/latest/user_data", PLAIN),
        ("/openstack/latest/meta_data.json", STRANGER),
        ("/openstack/latest", STRANGER),
    ],
)
async def test_unknown_versions_keys_and_callers_are_404(path, ip):
    """Unknown versions, files a version lacks, absent userdata and unknown callers: plain-text 404, never 500."""
    async with seeded() as app:
        answer = await get(app, path, ip)
        assert (answer.status_code, answer.text) == NOT_FOUND
        assert answer.headers["content-type"] == TEXT


async def test_writes_other_than_the_password_are_405():
    """PUT/DELETE anywhere and POST to anything but password answer 405 and change nothing."""
    async with seeded() as app:
        for method, path in (("PUT", "/openstack/latest/meta_data.json"), ("DELETE", "/openstack/latest/password"),
                             ("POST", "/openstack/latest/meta_data.json"), ("POST", "/openstack")):
            answer = await get(app, path, method=method)
            assert (answer.status_code, answer.text) == (405, "405 - Method Not Allowed"), (method, path)
        assert (await get(app, "/openstack/latest/password")).content == b""


async def test_binary_userdata_is_served_as_octet_stream():
    """Userdata that is not UTF-8 comes back byte for byte as application/octet-stream."""
    async with running_app() as app, admin_client(app) as admin:
        await push_record(admin, [GUEST], openstack_document())
        blob = base64.b64encode(b"\x1f\x8b\x08\x00\xff\xfe").decode()
        answer = await admin.post("/device-userdata", json={"id": SEED_ID, "ipAddresses": [GUEST], "userdata": blob})
        assert answer.status_code == 200
        user_data = await get(app, "/openstack/2012-08-10/user_data")
        assert (user_data.content, user_data.headers["content-type"]) == (
            b"\x1f\x8b\x08\x00\xff\xfe", "application/octet-stream")


# --- devices: validation on write, round trip into meta_data.json -----------------------------------------------


async def test_device_errors_name_the_field_and_rule_and_write_nothing():
    """A bad MAC and a shared NIC tag → 400 naming metadata.devices[N](.mac) and the rule; neither write happens."""
    async with seeded() as app, admin_client(app) as admin:
        bad = devices("example")
        bad[0]["mac"] = "not-a-mac"
        bad[1]["tags"] = ["nfvfunc1", "shared"]
        bad.append({**bad[1], "mac": "01:22:22:42:22:99", "tags": ["shared"]})
        for instance_id in (SEED_ID, new_id()):  # an existing instance keeps its record; a new one gets none
            document = {**openstack_document(), "id": instance_id, "devices": bad}
            answer = await admin.post("/device-metadata",
                                      json={"id": instance_id, "ipAddresses": ["10.1.2.3"], "metadata": document})
            assert answer.status_code == 400
            errors = answer.json()["errors"]
            assert [e["field"] for e in errors] == ["metadata.devices[0].mac", "metadata.devices[1]",
                                                    "metadata.devices[4]"]
            assert errors[0]["message"].endswith("(schema: pattern)")
            assert "tag 'nfvfunc1' already names nic metadata.devices[0]" in errors[1]["message"]
            assert "tag 'shared' already names nic metadata.devices[1]" in errors[2]["message"]
            assert all("one logical device per device type" in e["message"] for e in errors[1:])
        assert (await admin.get(f"/device-metadata/{SEED_ID}")).json()["devices"] == devices("example")
        assert (await get(app, "/openstack/latest/meta_data.json", "10.1.2.3")).status_code == 404


@pytest.mark.parametrize("example", DEVICE_EXAMPLES)
async def test_seed_device_examples_round_trip_into_meta_data_json(example):
    """Each seed device example is accepted, served unchanged in meta_data.json and valid against the design schema."""
    async with running_app() as app, admin_client(app) as admin:
        await push_record(admin, [GUEST], openstack_document(example))
        served = (await get(app, "/openstack/latest/meta_data.json")).json()["devices"]
        assert served == devices(example)
        assert list(Draft202012Validator(device_schema()).iter_errors({"devices": served})) == []
