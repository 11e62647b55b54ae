"""The /ganeti flavor through HTTP: metad's parameters.json, scripts, install package, gating, replicas."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from factories import next_ipv4
from ganeti_data import os_body, put_os, two_replicas
from helpers import admin_client, client_from, guest_get, make_settings, push_record, running_app

pytestmark = [pytest.mark.anyio, pytest.mark.stores("memory", "sqlite")]

EXAMPLES = Path(__file__).parents[2] / "examples" / "ganeti-os"
TINY = EXAMPLES / "tiny"


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[Any]:
    """The app with the example OS definitions, on memory:// and on migrated SQLite."""
    async with running_app(make_settings(db=db_url, os_definitions_dir=EXAMPLES)) as running:
        yield running


async def test_parameters_json_is_metads_format(app):
    """{name: [value, visibility]}, public then private then secret, install parameters merged while installing."""
    ip = next_ipv4()
    async with admin_client(app) as admin:
        instance_id = await push_record(admin, [ip])
        await put_os(admin, os_body(instance_id))
    answer = await guest_get(app, ip, "/ganeti/latest/os/parameters.json")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    assert answer.content == (
        b'{"hostname":["web-1","public"],"disk":["/dev/vda","public"],'
        b'"root-hash":["private-value","private"],"root-password":["secret-value","secret"]}'
    )
    assert json.loads((await guest_get(app, ip, "/ganeti/latest/os/parameters.json/")).content)["disk"] == [
        "/dev/vda", "public",
    ]


async def test_install_parameter_overrides_and_run_mode_drops_them(app):
    """Same name in both sections: the install value wins while installing; in run mode only parameters count."""
    ip = next_ipv4()
    body = os_body("", install_parameters={"hostname": {"value": "installer", "visibility": "private"}})
    async with admin_client(app) as admin:
        body["id"] = await push_record(admin, [ip])
        await put_os(admin, body)
        served = json.loads((await guest_get(app, ip, "/ganeti/latest/os/parameters.json")).content)
        assert served["hostname"] == ["installer", "private"]
        await put_os(admin, {**body, "mode": "run", "communication": True})
        served = json.loads((await guest_get(app, ip, "/ganeti/latest/os/parameters.json")).content)
        assert served == {"hostname": ["web-1", "public"], "root-hash": ["private-value", "private"],
                          "root-password": ["secret-value", "secret"]}


async def test_served_only_while_installing_or_communicating(app):
    """Mode run without communication: every /ganeti path is 404 (plain text); install or communication: 200."""
    ip, stranger = next_ipv4(), next_ipv4()
    async with admin_client(app) as admin:
        instance_id = await push_record(admin, [ip])
        assert (await guest_get(app, ip, "/ganeti/latest/os/parameters.json")).status_code == 404  # no OS record
        for mode, communication, status in [("run", False, 404), ("run", True, 200), ("self_install", False, 200),
                                            ("install", False, 200)]:
            await put_os(admin, os_body(instance_id, mode=mode, communication=communication))
            for path in ("/ganeti", "/ganeti/latest", "/ganeti/latest/os/", "/ganeti/latest/os/parameters.json",
                         "/ganeti/latest/os/scripts/create", "/ganeti/latest/os/os-install-package"):
                answer = await guest_get(app, ip, path)
                assert answer.status_code == status, (mode, communication, path)
                if status == 404:
                    assert answer.text == "404 - Not Found"
        await admin.delete(f"/device-os/{instance_id}")
    assert (await guest_get(app, ip, "/ganeti/latest/os/parameters.json")).status_code == 404
    assert (await guest_get(app, stranger, "/ganeti/latest/os/parameters.json")).text == "404 - Not Found"


async def test_listings_scripts_and_install_package(app):
    """Listings name only what answers; scripts are the definition's bytes; the install package is its tar.gz."""
    ip = next_ipv4()
    async with admin_client(app) as admin:
        instance_id = await push_record(admin, [ip])
        await put_os(admin, os_body(instance_id, os_type="tiny+default"))
    assert (await guest_get(app, ip, "/ganeti")).text == "latest"
    assert (await guest_get(app, ip, "/ganeti/latest/")).text == "os/"
    listing = (await guest_get(app, ip, "/ganeti/latest/os")).text
    assert listing == "environment\nos-install-package\nparameters.json\nscripts/"
    scripts = (await guest_get(app, ip, "/ganeti/latest/os/scripts/")).text.splitlines()
    assert scripts == ["create", "export", "import", "rename", "verify"]
    for name in scripts:
        answer = await guest_get(app, ip, f"/ganeti/latest/os/scripts/{name}")
        assert answer.status_code == 200
        assert answer.content == (TINY / name).read_bytes()
    for missing in ("/ganeti/latest/os/scripts/parameters.list", "/ganeti/latest/os/package", "/ganeti/2009/os",
                    "/ganeti/latest/meta_data.json", "/ganeti/latest/os/scripts/../create"):
        assert (await guest_get(app, ip, missing)).text == "404 - Not Found", missing
    package = await guest_get(app, ip, "/ganeti/latest/os/os-install-package")
    assert package.headers["content-type"] == "application/gzip"
    with tarfile.open(fileobj=io.BytesIO(package.content), mode="r:gz") as archive:
        members = {m.name: m for m in archive.getmembers()}
        assert set(members) == {"tiny", *(f"tiny/{p.name}" for p in TINY.iterdir())}
        create = archive.extractfile("tiny/create")
        assert create is not None
        assert create.read() == (TINY / "create").read_bytes()
        assert members["tiny/create"].mode == 0o755
    again = await guest_get(app, ip, "/ganeti/latest/os/os-install-package")
    assert again.content == package.content  # built once, reproducible


async def test_channel_paths_are_wired_and_other_writes_405(app):
    """Read and write are the channel's (a queued message, an event); a POST elsewhere is 405."""
    ip = next_ipv4()
    async with admin_client(app) as admin:
        instance_id = await push_record(admin, [ip])
        await put_os(admin, os_body(instance_id))
    async with client_from(app, ip) as guest:
        empty = await guest.get("/ganeti/latest/read")
        assert empty.status_code == 404
        assert "no message is queued" in empty.json()["message"]
        wrote = await guest.post("/ganeti/latest/write", json={"state": "installing", "message": "disk 1/2"})
        assert wrote.status_code == 200
        assert wrote.json()["state"] == "installing"
        assert (await guest.post("/ganeti/latest/os/parameters.json")).text == "405 - Method Not Allowed"
        head = await guest.head("/ganeti/latest/os/parameters.json")
        assert head.status_code == 200
        assert int(head.headers["content-length"]) > 0
    async with admin_client(app) as admin:
        events = (await admin.get(f"/device-events/{instance_id}?after=0")).json()
    assert [(e["state"], e["message"]) for e in events["events"]] == [("installing", "disk 1/2")]
    assert set(app.ganeti.channel) == {"read", "write"}


async def test_unknown_os_type_is_refused_and_undeclared_parameters_too(app):
    """With definitions loaded, os_type must name one and parameter names must be in its parameters.list."""
    async with admin_client(app) as admin:
        instance_id = await push_record(admin, [next_ipv4()])
        unknown = await admin.post("/device-os", json=os_body(instance_id, os_type="debian"))
        assert unknown.status_code == 400
        assert unknown.json()["errors"] == [{"field": "os_type", "message": "no such OS definition; known: tiny"}]
        undeclared = await admin.post("/device-os", json=os_body(instance_id, parameters={"colour": {"value": "x"}}))
        assert undeclared.json()["errors"] == [
            {"field": "parameters.colour", "message": "is not declared in tiny/parameters.list"}
        ]
        listed = (await admin.get("/os-definitions")).json()["os_definitions"]
        assert [d["name"] for d in listed] == ["tiny"]
        one = (await admin.get("/os-definitions/tiny")).json()
        assert one["scripts"] == ["create", "export", "import", "rename", "verify"]
        assert one["api_versions"] == [20, 15]
        assert set(one["parameters"]) == {"hostname", "root-hash", "root-password", "disk"}
        assert (await admin.get("/os-definitions/nope")).status_code == 404


async def test_two_replicas_on_one_database(sqlite_url: str):
    """The replica that took the write serves the secret; the other serves it absent and reports it lost."""
    async with two_replicas(sqlite_url) as (a, b, _admin_a, admin_b, ip, instance_id):
        on_a = json.loads((await guest_get(a, ip, "/ganeti/latest/os/parameters.json")).content)
        on_b = json.loads((await guest_get(b, ip, "/ganeti/latest/os/parameters.json")).content)
        assert on_a["root-password"] == ["secret-value", "secret"]
        assert "root-password" not in on_b
        assert on_b["root-hash"] == ["private-value", "private"]
        assert (await admin_b.get(f"/device-os/{instance_id}")).json()["parameters"]["root-password"] == {
            "visibility": "secret", "secret_state": "lost",
        }
        # A later write through B carries the secret again: now B holds it and A, whose copy is of an older
        # write, serves it absent rather than stale.
        again = {"root-password": {"value": "new", "visibility": "secret"}}
        await put_os(admin_b, os_body(instance_id, parameters=again))
        await a.services.catalog.catch_up()
        assert json.loads((await guest_get(b, ip, "/ganeti/latest/os/parameters.json")).content)["root-password"] == [
            "new", "secret",
        ]
        assert "root-password" not in json.loads((await guest_get(a, ip, "/ganeti/latest/os/parameters.json")).content)
