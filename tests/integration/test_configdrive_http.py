"""Config drive images from the admin API, compared file by file with what the instance-facing HTTP flavors answer."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from factories import new_id
from helpers import admin_client, client_from, push_record, running_app
from iso_reader import read_iso, volume_label
from openstack_data import DEVICE_EXAMPLES, SEED_ID, USERDATA, device_schema, devices, openstack_document

pytestmark = pytest.mark.anyio

GUEST = "10.70.17.9"
ISO = "application/x-iso9660-image"
_SEED = re.compile(rb',"random_seed":"[A-Za-z0-9+/=]+"}$')


def unseeded(body: bytes) -> bytes:
    """meta_data.json with its random_seed member cut out, byte for byte (the seed is the last member)."""
    return _SEED.sub(b"}", body)


def leaves(tree: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """(path, value) of every leaf of a nested EC2 meta-data.json."""
    found = []
    for key, value in tree.items():
        if isinstance(value, dict):
            found += leaves(value, f"{prefix}{key}/")
        else:
            found.append((f"{prefix}{key}", value))
    return found


async def test_every_file_on_the_drive_is_what_http_answers():
    """openstack/* equal the /openstack answers byte for byte (meta_data.json minus random_seed); ec2/* equal /<v>/…."""
    async with running_app() as app, admin_client(app) as admin, client_from(app, GUEST) as guest:
        await push_record(admin, [GUEST], openstack_document(), USERDATA, userdata_encoding="text")
        assert (await guest.post("/openstack/latest/password", content=b"pw")).status_code == 200
        answer = await admin.get(f"/device-configdrive/{SEED_ID}")
        assert (answer.status_code, answer.headers["content-type"]) == (200, ISO)
        assert answer.headers["content-disposition"] == f'attachment; filename="{SEED_ID}-config-2.iso"'
        assert volume_label(answer.content) == "config-2"
        files = read_iso(answer.content)
        assert {p.split("/")[0] for p in files} == {"openstack", "ec2"}
        compared = 0
        for path, content in files.items():
            if path.startswith("openstack/"):
                served = (await guest.get(f"/{path}")).content
                if path.endswith("/meta_data.json"):
                    assert unseeded(content) == unseeded(served), path
                    assert json.loads(content).keys() == json.loads(served).keys()
                else:
                    assert content == served, path
            elif path.endswith("/user-data"):
                assert content == (await guest.get(f"/{path.removeprefix('ec2/')}")).content == USERDATA.encode()
            else:
                version = path.split("/")[1]
                for leaf, value in leaves(json.loads(content)):
                    assert (await guest.get(f"/{version}/meta-data/{leaf}")).text == value, leaf
            compared += 1
        assert compared == len(files) == 45 + 4
        assert not any(p.endswith("password") for p in files)


async def test_every_listed_openstack_file_is_on_the_drive():
    """Every entry of every /openstack/<version> listing except password is a file on the drive."""
    async with running_app() as app, admin_client(app) as admin, client_from(app, GUEST) as guest:
        await push_record(admin, [GUEST], openstack_document(), USERDATA, userdata_encoding="text")
        files = read_iso((await admin.get(f"/device-configdrive/{SEED_ID}")).content)
        versions = (await guest.get("/openstack")).text.split("\n")
        for version in versions:
            for name in (await guest.get(f"/openstack/{version}")).text.split("\n"):
                assert (name == "password") != (f"openstack/{version}/{name}" in files), (version, name)


@pytest.mark.parametrize("example", DEVICE_EXAMPLES)
async def test_seed_device_examples_reach_the_drive(example):
    """Each seed device example pushed via the API is every meta_data.json's devices from 2016-06-30, schema-valid."""
    async with running_app() as app, admin_client(app) as admin:
        await push_record(admin, [GUEST], openstack_document(example))
        files = read_iso((await admin.get(f"/device-configdrive/{SEED_ID}")).content)
        for version in ("2016-06-30", "2018-08-27", "2025-04-04", "latest"):
            served = json.loads(files[f"openstack/{version}/meta_data.json"])["devices"]
            assert served == devices(example)
            assert list(Draft202012Validator(device_schema()).iter_errors({"devices": served})) == []
        assert "devices" not in json.loads(files["openstack/2015-10-15/meta_data.json"])


async def test_the_nocloud_seed_matches_the_nocloud_flavor():
    """?format=nocloud is a cidata image whose four files equal /nocloud/<file> byte for byte."""
    async with running_app() as app, admin_client(app) as admin, client_from(app, GUEST) as guest:
        await push_record(admin, [GUEST], openstack_document(), USERDATA, userdata_encoding="text")
        answer = await admin.get(f"/device-configdrive/{SEED_ID}", params={"format": "nocloud"})
        assert (answer.status_code, answer.headers["content-type"]) == (200, ISO)
        assert volume_label(answer.content) == "cidata"
        files = read_iso(answer.content)
        assert sorted(files) == ["meta-data", "network-config", "user-data", "vendor-data"]
        for name, content in files.items():
            assert content == (await guest.get(f"/nocloud/{name}")).content, name
        assert read_iso(answer.content, names="joliet") == files


async def test_drive_errors():
    """Unknown format → 400 naming it; unknown or malformed id → 404 / 400; no token → 401; userdata only → 404."""
    async with running_app() as app, admin_client(app) as admin:
        await push_record(admin, [GUEST], openstack_document())
        bad = await admin.get(f"/device-configdrive/{SEED_ID}", params={"format": "vfat"})
        assert bad.status_code == 400
        assert bad.json()["errors"] == [{"field": "format", "message": "must be one of config-2, nocloud"}]
        assert (await admin.get(f"/device-configdrive/{new_id()}")).status_code == 404
        assert (await admin.get("/device-configdrive/nope")).status_code == 400
        async with client_from(app) as anonymous:
            assert (await anonymous.get(f"/device-configdrive/{SEED_ID}")).status_code == 401
        userdata_only = new_id()
        body = {"id": userdata_only, "ipAddresses": ["10.9.9.9"], "userdata": "x", "userdata_encoding": "text"}
        assert (await admin.post("/device-userdata", json=body)).status_code == 200
        assert (await admin.get(f"/api/v1/device-configdrive/{userdata_only}")).status_code == 404


async def test_the_admin_api_documents_the_openstack_parts():
    """The OpenAPI request schema of POST /device-metadata names devices, network_data and vendor_data."""
    async with running_app() as app, admin_client(app) as admin:
        spec = (await admin.get("/openapi.json")).json()
        schema = spec["paths"]["/device-metadata"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        document = schema["properties"]["metadata"]["oneOf"][0]
        assert set(document["properties"]) == {"devices", "network_data", "vendor_data"}
        assert "/device-configdrive/{instance_id}" in spec["paths"]
        assert "delete" in spec["paths"]["/device-password/{instance_id}"]
