"""The Ganeti OS record through the admin API: visibility, secrets in memory only, staleness, scopes, encryption."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet

from factories import new_id, next_ipv4
from ganeti_data import os_body, put_os
from helpers import admin_client, client_from, make_settings, push_record, running_app
from imds.config import Settings

pytestmark = pytest.mark.anyio


@pytest.fixture
async def admin(db_url: str) -> AsyncIterator[Any]:
    async with running_app(make_settings(db=db_url)) as app, admin_client(app) as client:
        yield client


async def test_write_then_read_shows_public_hides_private_and_reports_secrets(admin):
    """GET shows public values, "<private>" for private ones and secret_state "held" for secrets; HEAD has no body."""
    instance_id = await push_record(admin, [next_ipv4()])
    answer = await admin.post("/device-os", json=os_body(instance_id))
    assert answer.json() == {"id": instance_id, "applied": True}
    assert answer.headers["x-imds-write"] == "applied"
    got = await admin.get(f"/device-os/{instance_id}")
    assert got.status_code == 200
    assert got.json() == {
        "id": instance_id,
        "os_type": "tiny",
        "mode": "install",
        "communication": False,
        "served": True,
        "parameters": {
            "hostname": {"visibility": "public", "value": "web-1"},
            "root-hash": {"visibility": "private", "value": "<private>"},
            "root-password": {"visibility": "secret", "secret_state": "held"},
        },
        "install_parameters": {"disk": {"visibility": "public", "value": "/dev/vda"}},
    }
    assert "private-value" not in got.text
    assert "secret-value" not in got.text
    head = await admin.head(f"/device-os/{instance_id}")
    assert (head.status_code, head.content) == (200, b"")
    assert int(head.headers["content-length"]) == len(got.content)
    also = await admin.get(f"/api/v1/device-os/{instance_id}")
    assert also.json() == got.json()


async def test_an_update_that_omits_a_secret_drops_it(admin):
    """Full replacement: the second write has no secret, so none is listed (Ganeti's rule)."""
    instance_id = await push_record(admin, [next_ipv4()])
    await put_os(admin, os_body(instance_id))
    body = os_body(instance_id, mode="run", communication=True)
    del body["parameters"]["root-password"]
    await put_os(admin, body)
    shown = (await admin.get(f"/device-os/{instance_id}")).json()
    assert set(shown["parameters"]) == {"hostname", "root-hash"}
    assert (shown["mode"], shown["communication"], shown["served"]) == ("run", True, True)


async def test_package_credentials_are_reported_not_shown(admin):
    """The package URL is shown; its credentials are only reported held."""
    instance_id = await push_record(admin, [next_ipv4()])
    package = {"url": "http://192.0.2.7/pkg/site.tgz", "username": "pkg-user-x", "password": "pkg-pass-y"}
    await put_os(admin, os_body(instance_id, package=package))
    got = await admin.get(f"/device-os/{instance_id}")
    assert got.json()["package"] == {"url": "http://192.0.2.7/pkg/site.tgz", "credentials_state": "held"}
    assert "pkg-user-x" not in got.text
    assert "pkg-pass-y" not in got.text


async def test_staleness_rule(admin):
    """A body updated_at older than the stored one changes nothing and says so; newer or equal applies."""
    instance_id = await push_record(admin, [next_ipv4()])
    await put_os(admin, os_body(instance_id, updated_at="2026-11-23T12:00:00Z"))
    stale = await admin.post("/device-os", json=os_body(instance_id, mode="run", updated_at="2026-11-23T11:00:00Z"))
    assert stale.status_code == 200
    assert stale.headers["x-imds-write"] == "stale"
    assert stale.json()["applied"] is False
    assert "older than the stored" in stale.json()["reason"]
    shown = (await admin.get(f"/device-os/{instance_id}")).json()
    assert shown["mode"] == "install"
    assert shown["parameters"]["root-password"]["secret_state"] == "held"  # the stale write's secrets were not kept
    await put_os(admin, os_body(instance_id, mode="run", communication=True, updated_at="2026-11-23T13:00:00+00:00"))
    assert (await admin.get(f"/device-os/{instance_id}")).json()["mode"] == "run"


async def test_needs_an_existing_instance_and_delete(admin):
    """404 for an unknown instance; DELETE removes the record (404 after); the metadata stays."""
    unknown = new_id()
    answer = await admin.post("/device-os", json=os_body(unknown))
    assert answer.status_code == 404
    assert "post /device-metadata first" in answer.json()["message"]
    instance_id = await push_record(admin, [next_ipv4()])
    await put_os(admin, os_body(instance_id))
    deleted = await admin.delete(f"/device-os/{instance_id}")
    assert deleted.json() == {"id": instance_id, "deleted": "os"}
    assert (await admin.get(f"/device-os/{instance_id}")).status_code == 404
    assert (await admin.delete(f"/device-os/{instance_id}")).status_code == 404
    assert (await admin.get(f"/device-metadata/{instance_id}")).status_code == 200


BAD_FIELDS = [
    ({"parameters": {"Bad.Name": {"value": "v"}}}, "parameters.Bad.Name"),
    ({"parameters": {"x" * 65: {"value": "v"}}}, "parameters." + "x" * 40),
    ({"parameters": {"long": {"value": "v" * 4097, "visibility": "secret"}}}, "parameters.long.value"),
    ({"install_parameters": {"p": {"value": 3}}}, "install_parameters.p.value"),
    ({"parameters": {"p": {"value": "v", "visibility": "hidden"}}}, "parameters.p.visibility"),
    ({"package": {"url": "http://192.0.2.1/p.zip"}}, "package.url"),
    ({"package": {"url": "http://user:pw@192.0.2.1/p.tgz"}}, "package.url"),
    ({"package": {"url": "http://192.0.2.1/p.tgz", "username": "u"}}, "package"),
    ({"mode": "reinstall"}, "mode"),
    ({"os_type": ""}, "os_type"),
    ({"communication": "yes"}, "communication"),
    ({"updated_at": "yesterday"}, "updated_at"),
    ({"surprise": 1}, "surprise"),
]


@pytest.mark.parametrize(("change", "field"), BAD_FIELDS)
async def test_invalid_fields_are_400_naming_the_field_never_a_value(change, field):
    """Each invalid field is a 400 naming it; the body echoes no private or secret value; nothing is stored."""
    async with running_app() as app, admin_client(app) as admin:
        instance_id = await push_record(admin, [next_ipv4()])
        answer = await admin.post("/device-os", json=os_body(instance_id, **change))
        assert answer.status_code == 400, answer.text
        assert field in [problem["field"] for problem in answer.json()["errors"]]
        for value in ("private-value", "secret-value", "pw", "v" * 4097):
            assert value not in answer.text
        assert (await admin.get(f"/device-os/{instance_id}")).status_code == 404


async def test_value_size_is_an_option():
    """--os-param-max-bytes sets the limit: at the limit is accepted, one byte over is a 400."""
    async with running_app(make_settings(os_param_max_bytes=8)) as app, admin_client(app) as admin:
        instance_id = await push_record(admin, [next_ipv4()])
        ok = os_body(instance_id, parameters={"p": {"value": "é" * 4}})
        await put_os(admin, ok)
        over = await admin.post("/device-os", json=os_body(instance_id, parameters={"p": {"value": "123456789"}}))
        assert over.status_code == 400
        assert over.json()["errors"] == [{"field": "parameters.p.value",
                                          "message": "is longer than 8 bytes (--os-param-max-bytes)"}]


async def test_scopes_follow_the_other_record_types(tmp_path: Path):
    """metadata:read:os reads only; metadata:create:os writes; metadata:delete:os deletes; metadata scopes do not."""
    tokens = {"tokens": [
        {"subject": s, "token": f"tok-{s.replace(':', '-')}", "scopes": [s]}
        for s in ("metadata:read:os", "metadata:create:os", "metadata:delete:os", "metadata:create:metadata")
    ]}
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(tokens))
    async with running_app(make_settings(admin_tokens_file=path)) as app, admin_client(app) as admin:
        instance_id = await push_record(admin, [next_ipv4()])
        calls = {
            "POST": lambda c: c.post("/device-os", json=os_body(instance_id)),
            "GET": lambda c: c.get(f"/device-os/{instance_id}"),
            "DELETE": lambda c: c.delete(f"/device-os/{instance_id}"),
        }
        allowed = {"metadata:create:os": "POST", "metadata:read:os": "GET", "metadata:delete:os": "DELETE"}
        for scope in ("metadata:create:os", "metadata:read:os", "metadata:delete:os", "metadata:create:metadata"):
            async with client_from(app, token=f"tok-{scope.replace(':', '-')}") as client:
                for method, call in calls.items():
                    answer = await call(client)
                    if allowed.get(scope) == method:
                        assert answer.status_code == 200, (scope, method, answer.text)
                    else:
                        assert answer.status_code == 403, (scope, method, answer.text)
                        verb = {"GET": "read", "POST": "create", "DELETE": "delete"}[method]
                        assert f"metadata:{verb}:os" in answer.json()["message"]


async def test_restart_loses_secrets_and_says_so(sqlite_url: str):
    """After a restart the record is back from the database, each secret reported lost, the private value kept."""
    async with running_app(make_settings(db=sqlite_url)) as app, admin_client(app) as admin:
        instance_id = await push_record(admin, [next_ipv4()])
        await put_os(admin, os_body(instance_id, package={"url": "http://192.0.2.1/a.tar.gz", "username": "u",
                                                           "password": "p"}))
    async with running_app(make_settings(db=sqlite_url)) as app, admin_client(app) as admin:
        shown = (await admin.get(f"/device-os/{instance_id}")).json()
    assert shown["parameters"]["root-password"] == {"visibility": "secret", "secret_state": "lost"}
    assert shown["parameters"]["root-hash"] == {"visibility": "private", "value": "<private>"}
    assert shown["package"] == {"url": "http://192.0.2.1/a.tar.gz", "credentials_state": "lost"}


def stored_documents(sqlite_url: str) -> str:
    path = sqlite_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        return "\n".join(row[0] for row in conn.execute("SELECT document FROM instance_os"))


async def test_private_values_are_encrypted_at_rest_with_key_rotation(sqlite_url: str, tmp_path: Path):
    """With --private-key-file the database holds a Fernet token, never the value; a rotated file still opens it."""
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    key_file = tmp_path / "private.keys"
    key_file.write_text(f"# imds private keys\n{old}\n")
    settings = make_settings(db=sqlite_url, private_key_file=key_file)
    async with running_app(settings) as app, admin_client(app) as admin:
        instance_id = await push_record(admin, [next_ipv4()])
        await put_os(admin, os_body(instance_id))
    stored = json.loads(stored_documents(sqlite_url))
    token = stored["parameters"]["root-hash"]["value"]
    assert stored["parameters"]["root-hash"]["encrypted"] is True
    assert Fernet(old.encode()).decrypt(token.encode()) == b"private-value"
    assert "private-value" not in stored_documents(sqlite_url)
    assert "secret-value" not in stored_documents(sqlite_url)
    assert stored["parameters"]["root-password"] == {"visibility": "secret"}
    key_file.write_text(f"{new}\n{old}\n")  # rotation: the new key first, the old one still listed
    rotated: Settings = make_settings(db=sqlite_url, private_key_file=key_file)
    async with running_app(rotated) as app:
        instance = app.services.catalog.get(instance_id)
        assert instance is not None
        assert app.services.os is not None
        served = json.loads(app.services.os.parameters_json(instance.instance))
        assert served["root-hash"] == ["private-value", "private"]
        async with admin_client(app) as admin:
            await put_os(admin, os_body(instance_id))
    resealed = json.loads(stored_documents(sqlite_url))["parameters"]["root-hash"]["value"]
    assert Fernet(new.encode()).decrypt(resealed.encode()) == b"private-value"  # the first key encrypts


@pytest.mark.parametrize("text", ["", "# only a comment\n", "not-a-key\n"])
def test_a_bad_key_file_fails_at_startup(tmp_path: Path, text: str):
    """An empty key file or a line that is not a Fernet key stops the service from starting, naming the file."""
    from imds.app import build_services  # noqa: PLC0415
    from imds.errors import ConfigError  # noqa: PLC0415

    key_file = tmp_path / "k"
    key_file.write_text(text)
    with pytest.raises(ConfigError, match="--private-key-file"):
        build_services(make_settings(private_key_file=key_file))
