"""GCE project attributes in-process: the admin routes, their audit and scopes, and what instances read.

``PUT``/``GET``/``DELETE /projects/{id}/attributes``; every instance whose record has that
``project_id`` reads the attributes under ``/computeMetadata/v1/project/attributes/`` (the
record wins per key over the document's ``project_attributes``); the ETag covers them and a
write wakes the project's watches. Also the front's own 429 and 503 answers on GCE's paths
(``Metadata-Flavor: Google``) and the key set answered on an ``--admin-listen`` listener.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from factories import new_id
from helpers import ADMIN_TOKEN, admin_client, client_from, make_settings, push_record, running_app, wait_for_async
from imds.app import build_app, build_served_app
from imds.web.instance import InstanceFront

pytestmark = pytest.mark.anyio

V1 = "/computeMetadata/v1"
GOOGLE = {"Metadata-Flavor": "Google"}
GUEST, NEIGHBOUR, STRANGER, NO_PROJECT = "10.83.1.7", "10.83.1.8", "10.83.2.7", "10.83.3.7"
PROJECT = "/projects/acme-prod/attributes"
WAIT_BOUND = 10.0


def document(instance_id: str, project: str | None) -> dict[str, Any]:
    doc: dict[str, Any] = {"id": instance_id, "hostname": f"h-{instance_id[:8]}.example",
                           "project_attributes": {"team": "from-document", "only-in-document": "kept"}}
    if project is not None:
        doc["project_id"] = project
    return doc


@pytest.fixture
async def app() -> AsyncIterator[InstanceFront]:
    async with running_app() as running:
        for ip, project in ((GUEST, "acme-prod"), (NEIGHBOUR, "acme-prod"), (STRANGER, "other-proj"),
                            (NO_PROJECT, None)):
            instance_id = new_id()
            await push_record(running, [ip], document(instance_id, project))
        yield running


async def get(app: InstanceFront, path: str, ip: str = GUEST, **params: str) -> httpx.Response:
    async with client_from(app, ip, timeout=WAIT_BOUND * 3) as guest:
        return await guest.get(path, params=params, headers=GOOGLE)


async def admin(app: InstanceFront, method: str, path: str, token: str = ADMIN_TOKEN, **kwargs: Any) -> httpx.Response:
    async with admin_client(app, token) as client:
        return await client.request(method, path, **kwargs)


async def test_put_get_delete_with_revisions(app):
    """PUT answers the stored record (revision 1, then 2); GET reads it; DELETE removes it; then 404s."""
    assert (await admin(app, "GET", PROJECT)).status_code == 404
    first = await admin(app, "PUT", PROJECT, json={"ssh-keys": "alice:ssh-ed25519 AAAA alice", "team": "infra"})
    assert first.status_code == 200, first.text
    assert first.json()["revision"] == 1
    assert first.json()["attributes"] == {"ssh-keys": "alice:ssh-ed25519 AAAA alice", "team": "infra"}
    second = await admin(app, "PUT", f"/api/v1{PROJECT}", json={"team": "platform"})
    assert (second.status_code, second.json()["revision"]) == (200, 2)
    read = await admin(app, "GET", PROJECT)
    assert (read.status_code, read.json()["attributes"], read.json()["project_id"]) == (
        200, {"team": "platform"}, "acme-prod")
    head = await admin(app, "HEAD", PROJECT)
    assert (head.status_code, head.content, int(head.headers["content-length"])) == (200, b"", len(read.content))
    deleted = await admin(app, "DELETE", PROJECT)
    assert (deleted.status_code, deleted.json()) == (200, {"project_id": "acme-prod", "deleted": "project"})
    assert (await admin(app, "GET", PROJECT)).status_code == 404
    assert (await admin(app, "DELETE", PROJECT)).status_code == 404
    again = await admin(app, "PUT", PROJECT, json={})
    assert (again.status_code, again.json()["revision"]) == (200, 1)  # a new record after a delete


@pytest.mark.parametrize(("path", "body", "field"), [
    (PROJECT, {"team": 1}, "team"),
    (PROJECT, {"ok": "yes", "nested": {"a": "b"}}, "nested"),
    (PROJECT, {"list": ["a"]}, "list"),
    (PROJECT, {"no spaces": "x"}, "no spaces"),
    (PROJECT, {"": "x"}, ""),
    (PROJECT, {"bad": "\ud800"}, "body.bad"),
    (PROJECT, ["team", "infra"], "body"),
    (PROJECT, "text", "body"),
    ("/projects/Upper-Case/attributes", {"a": "b"}, "project_id"),
    ("/projects/-leading-dash/attributes", {"a": "b"}, "project_id"),
    (f"/projects/{'x' * 29}/attributes", {"a": "b"}, "project_id"),
])
async def test_a_bad_write_is_a_400_naming_the_field(app, path, body, field):
    """Values must be strings, names GCE's charset, the body an object, the project id its charset: 400 names it."""
    answer = await admin(app, "PUT", path, content=json.dumps(body), headers={"content-type": "application/json"})
    assert answer.status_code == 400, answer.text
    assert field in [problem["field"] for problem in answer.json()["errors"]], answer.text
    assert (await admin(app, "GET", PROJECT)).status_code == 404  # nothing was written


async def test_the_body_is_bounded_like_other_writes():
    """A body over --max-body-bytes is a 413 before anything is written."""
    async with running_app(make_settings(max_body_bytes=1024)) as app:
        answer = await admin(app, "PUT", PROJECT, json={"big": "x" * 2000})
        assert answer.status_code == 413
        assert (await admin(app, "GET", PROJECT)).status_code == 404


async def test_writes_and_deletes_are_audited_without_values(app):
    """Each PUT and DELETE has its audit entry: who, project:<id>, kind project, key count, revision; no value."""
    await admin(app, "PUT", PROJECT, json={"ssh-keys": "secret-looking-value"})
    await admin(app, "DELETE", PROJECT)
    entries = (await admin(app, "GET", "/audit")).json()["entries"]
    mine = [e for e in entries if e["kind"] == "project"]
    assert [(e["action"], e["instance_id"], e["subject"]) for e in mine] == [
        ("write", "project:acme-prod", "admin-token"), ("delete", "project:acme-prod", "admin-token")]
    assert mine[0]["detail"] == {"project_id": "acme-prod", "keys": 1, "revision": 1}
    await admin(app, "PUT", "/projects/other-proj/attributes", json={})
    only = (await admin(app, "GET", "/audit", params={"instance": "project:acme-prod"})).json()["entries"]
    assert [(e["action"], e["instance_id"]) for e in only] == [("write", "project:acme-prod"),
                                                              ("delete", "project:acme-prod")]
    bad = await admin(app, "GET", "/audit", params={"instance": "project:Bad Name"})
    assert (bad.status_code, bad.json()["errors"][0]["field"]) == (400, "project_id")
    assert "secret-looking-value" not in json.dumps(entries)


async def test_the_change_feed_page_names_the_project(app):
    """/device-changes lists a project write as project:<id>, present while the project has a record."""
    await admin(app, "PUT", PROJECT, json={"a": "b"})
    rows = (await admin(app, "GET", "/device-changes")).json()["changes"]
    assert (rows[0]["instance_id"], rows[0]["present"]) == ("project:acme-prod", True)
    await admin(app, "DELETE", PROJECT)
    rows = (await admin(app, "GET", "/device-changes")).json()["changes"]
    assert [(r["instance_id"], r["present"]) for r in rows[:2]] == [("project:acme-prod", False)] * 2


async def test_scopes_of_kind_project(tmp_path: Path):
    """A metadata-only token is refused (403); metadata:*:project scopes and read/write/delete are allowed."""
    tokens = {"tokens": [{"subject": s, "token": f"tok-{s}-0123456789", "scopes": [s]} for s in (
        "metadata:update:metadata", "metadata:create:project", "metadata:read:project", "metadata:delete:project",
        "read", "metadata:read:metadata")]}
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(tokens))
    async with running_app(make_settings(admin_tokens_file=path)) as app:
        def token(scope: str) -> str:
            return f"tok-{scope}-0123456789"

        assert (await admin(app, "PUT", PROJECT, token("metadata:update:metadata"), json={"a": "b"})).status_code == 403
        assert (await admin(app, "PUT", PROJECT, token("metadata:read:project"), json={"a": "b"})).status_code == 403
        assert (await admin(app, "PUT", PROJECT, token("metadata:create:project"), json={"a": "b"})).status_code == 200
        assert (await admin(app, "GET", PROJECT, token("metadata:read:metadata"))).status_code == 403
        assert (await admin(app, "GET", PROJECT, token("metadata:read:project"))).status_code == 200
        assert (await admin(app, "GET", PROJECT, token("read"))).status_code == 200
        assert (await admin(app, "DELETE", PROJECT, token("metadata:read:project"))).status_code == 403
        assert (await admin(app, "DELETE", PROJECT, token("metadata:delete:project"))).status_code == 200


async def test_instances_of_the_project_read_the_record_over_their_documents(app):
    """Listing, each key, recursive and alt=json|text; the record wins per key; a delete brings the document back."""
    before = await get(app, f"{V1}/project/attributes/team")
    assert before.text == "from-document"
    put = await admin(app, "PUT", PROJECT, json={"team": "infra", "ssh-keys": "alice:ssh-ed25519 AAAA alice"})
    assert put.status_code == 200
    for ip in (GUEST, NEIGHBOUR):
        assert (await get(app, f"{V1}/project/attributes/team", ip)).text == "infra"
        listing = await get(app, f"{V1}/project/attributes/", ip)
        assert listing.text == "only-in-document\nssh-keys\nteam\n"
        assert (await get(app, f"{V1}/project/attributes/", ip, alt="json")).json() == [
            "only-in-document", "ssh-keys", "team"]
    recursive = await get(app, f"{V1}/project/attributes/", recursive="true")
    assert recursive.json() == {"only-in-document": "kept", "ssh-keys": "alice:ssh-ed25519 AAAA alice", "team": "infra"}
    as_text = await get(app, f"{V1}/project/attributes/", recursive="true", alt="text")
    assert as_text.text.splitlines() == ["only-in-document kept", "ssh-keys alice:ssh-ed25519 AAAA alice",
                                         "team infra"]
    whole = await get(app, f"{V1}/", recursive="true")
    assert whole.json()["project"]["attributes"]["ssh-keys"] == "alice:ssh-ed25519 AAAA alice"
    assert (await get(app, f"{V1}/project/attributes/ssh-keys", alt="json")).json() == "alice:ssh-ed25519 AAAA alice"
    await admin(app, "DELETE", PROJECT)
    after = await get(app, f"{V1}/project/attributes/")
    assert after.text == "only-in-document\nteam\n"
    assert (await get(app, f"{V1}/project/attributes/team")).text == "from-document"


async def test_another_projects_instances_never_read_them(app):
    """other-proj's instance and an instance without project_id (project default) see none of acme-prod's."""
    await admin(app, "PUT", PROJECT, json={"team": "infra", "acme-only": "x"})
    for ip in (STRANGER, NO_PROJECT):
        assert (await get(app, f"{V1}/project/attributes/acme-only", ip)).status_code == 404
        assert (await get(app, f"{V1}/project/attributes/team", ip)).text == "from-document"
    await admin(app, "PUT", "/projects/default/attributes", json={"fleet": "default-project"})
    assert (await get(app, f"{V1}/project/attributes/fleet", NO_PROJECT)).text == "default-project"
    assert (await get(app, f"{V1}/project/project-id", NO_PROJECT)).text == "default"
    for ip in (GUEST, STRANGER):
        assert (await get(app, f"{V1}/project/attributes/fleet", ip)).status_code == 404


async def test_the_etag_changes_and_a_watch_wakes_on_a_project_write(app):
    """A held wait_for_change of the project's instance answers when its project's attributes are written."""
    first = await get(app, f"{V1}/project/attributes/team")
    etag = first.headers["etag"]
    stranger_etag = (await get(app, f"{V1}/instance/id", STRANGER)).headers["etag"]
    held = asyncio.ensure_future(get(app, f"{V1}/project/attributes/team", wait_for_change="true", last_etag=etag,
                                     timeout_sec="30"))
    await wait_for_async(lambda: _held_on(app, GUEST), what="the read to be held", timeout=WAIT_BOUND)
    assert (await admin(app, "PUT", PROJECT, json={"team": "woken"})).status_code == 200
    changed = await asyncio.wait_for(held, WAIT_BOUND)
    assert changed.text == "woken"
    assert changed.headers["etag"] != etag
    second = (await get(app, f"{V1}/instance/id")).headers["etag"]
    assert second == changed.headers["etag"]
    assert (await admin(app, "PUT", PROJECT, json={"team": "woken"})).status_code == 200  # same values, revision 2
    assert (await get(app, f"{V1}/instance/id")).headers["etag"] != second
    assert (await get(app, f"{V1}/instance/id", STRANGER)).headers["etag"] == stranger_etag  # other projects: as is


def _held_on(app: InstanceFront, ip: str) -> bool:
    import ipaddress  # noqa: PLC0415 - only this helper needs it

    entry = app.services.catalog.lookup(ipaddress.ip_address(ip))
    return bool(entry is not None and entry.waiters)


async def test_the_fronts_own_503_and_429_on_gce_paths_say_metadata_flavor():
    """Catalog loading (503), rate limit, requests in flight (429): Metadata-Flavor: Google under /computeMetadata."""
    loading = build_app(make_settings())  # services not started: the catalog is not loaded
    async with client_from(loading, GUEST) as guest:
        answer = await guest.get(f"{V1}/instance/id", headers=GOOGLE)
        assert (answer.status_code, answer.headers["metadata-flavor"]) == (503, "Google")
        other = await guest.get("/latest/meta-data/instance-id")
        assert other.status_code == 503
        assert "metadata-flavor" not in other.headers
    async with running_app(make_settings(rate_limit=0.001, rate_burst=1)) as app:
        await push_record(app, [GUEST], document(new_id(), "acme-prod"))
        assert (await get(app, f"{V1}/instance/hostname")).status_code == 200
        limited = await get(app, f"{V1}/instance/hostname")
        assert (limited.status_code, limited.headers["metadata-flavor"]) == (429, "Google")
        assert "retry-after" in limited.headers
    async with running_app(make_settings(max_requests_per_source=1)) as app:
        await push_record(app, [GUEST], document(new_id(), "acme-prod"))
        etag = (await get(app, f"{V1}/instance/id")).headers["etag"]
        held = asyncio.ensure_future(get(app, f"{V1}/instance/id", wait_for_change="true", last_etag=etag,
                                         timeout_sec="30"))
        await wait_for_async(lambda: _held_on(app, GUEST), what="the read to be held", timeout=WAIT_BOUND)
        busy = await get(app, f"{V1}/instance/id")
        assert (busy.status_code, busy.headers["metadata-flavor"]) == (429, "Google")
        held.cancel()


async def test_listener_refusals_on_gce_paths_say_metadata_flavor():
    """A body over --max-body-bytes is refused (413) before the front: under /computeMetadata, with the header."""
    served = build_served_app(make_settings(max_body_bytes=16))
    async with served.services.running():
        transport = httpx.ASGITransport(app=served, client=(GUEST, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://imds.test") as guest:
            answer = await guest.post(f"{V1}/instance/id", content=b"x" * 64, headers=GOOGLE)
            assert (answer.status_code, answer.headers["metadata-flavor"]) == (413, "Google")
            other = await guest.post("/metadata", content=b"x" * 64)
            assert other.status_code == 413
            assert "metadata-flavor" not in other.headers


async def test_the_key_set_is_answered_on_the_admin_listener_too():
    """With --admin-listen: jwks.json and openid-configuration answer there; other instance paths stay 404."""
    async with running_app(make_settings(admin_listen=[("127.0.0.1", 18555)],
                                         identity_issuer="https://imds.example")) as app:
        transport = httpx.ASGITransport(app=app, client=("192.0.2.250", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:18555") as operator:
            jwks = await operator.get("/.well-known/jwks.json")
            assert jwks.status_code == 200, jwks.text
            assert jwks.json()["keys"]
            discovery = await operator.get("/.well-known/openid-configuration")
            assert discovery.json()["issuer"] == "https://imds.example"
            assert (await operator.get(f"{V1}/instance/id", headers=GOOGLE)).status_code == 404
            assert (await operator.get("/metadata")).status_code == 404
