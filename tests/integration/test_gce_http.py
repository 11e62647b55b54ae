"""The GCE flavor in-process: GCE's header rules, the tree, recursive/alt, the change watch, identity tokens."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import jwt
import pytest

from factories import new_id
from helpers import admin_client, client_from, make_settings, running_app, wait_for_async
from imds.services.render.gce import project_number
from imds.web.instance import InstanceFront

pytestmark = pytest.mark.anyio

GUEST = "10.82.1.7"
OTHER = "10.82.1.8"
GOOGLE = {"Metadata-Flavor": "Google"}
V1 = "/computeMetadata/v1"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGQ3 alice@example"
WAIT_BOUND = 10.0


def document(instance_id: str, hostname: str, project: str = "acme-prod") -> dict[str, Any]:
    return {
        "id": instance_id, "hostname": hostname, "facility": "da11", "plan": "c3.small.x86", "project_id": project,
        "tags": ["web", "blue"], "ssh_keys": [KEY, "bob:ssh-rsa AAAAB3Nza bob@example"],
        "attributes": {"enable-oslogin": "FALSE", "role": {"tier": 1}},
        "project_attributes": {"team": "infra"},
        "network": {"addresses": [{"address": "10.82.1.7", "public": False, "address_family": 4},
                                  {"address": "203.0.113.7", "public": True, "address_family": 4}],
                    "interfaces": [{"mac": "40:A6:B7:00:00:01", "name": "eth0"}]},
    }


async def push(app: InstanceFront, instance_id: str, ip: str, hostname: str, project: str = "acme-prod") -> None:
    async with admin_client(app) as admin:
        meta = await admin.post("/device-metadata", json={
            "id": instance_id, "ipAddresses": [ip], "metadata": document(instance_id, hostname, project)})
        user = await admin.post("/device-userdata", json={
            "id": instance_id, "ipAddresses": [ip], "userdata": "#cloud-config\nruncmd: [true]\n",
            "userdata_encoding": "text"})
    assert (meta.status_code, user.status_code) == (200, 200), (meta.text, user.text)


@pytest.fixture
async def app() -> AsyncIterator[InstanceFront]:
    async with running_app(make_settings(identity_issuer="https://imds.example")) as running:
        running.ids = (new_id(), new_id())  # type: ignore[attr-defined]
        await push(running, running.ids[0], GUEST, "web-1.acme.internal")  # type: ignore[attr-defined]
        await push(running, running.ids[1], OTHER, "db-9.other.internal", "other-proj")  # type: ignore[attr-defined]
        yield running


async def get(app: InstanceFront, path: str, ip: str = GUEST, headers: dict[str, str] | None = None,
              **params: Any) -> httpx.Response:
    async with client_from(app, ip, timeout=WAIT_BOUND * 3) as guest:
        return await guest.get(path, params=params, headers=GOOGLE if headers is None else headers)


async def test_the_flavor_header_is_required_and_forwarded_requests_are_refused(app):
    """No Metadata-Flavor: Google → 403; any X-Forwarded-For → 403; every answer says Metadata-Flavor: Google."""
    for headers in ({}, {"Metadata-Flavor": "google"}, {"Metadata-Flavor": "Other"}):
        answer = await get(app, f"{V1}/instance/id", headers=headers)
        assert answer.status_code == 403, headers
        assert answer.headers["metadata-flavor"] == "Google"
        assert b"Metadata-Flavor" in answer.content
    answer = await get(app, f"{V1}/instance/id", headers={**GOOGLE, "X-Forwarded-For": GUEST})
    assert answer.status_code == 403
    assert answer.headers["metadata-flavor"] == "Google"
    missing = await get(app, f"{V1}/instance/nothing-here")
    assert (missing.status_code, missing.headers["metadata-flavor"]) == (404, "Google")
    assert (await get(app, "/computeMetadata/v0.1/instance/id")).status_code == 404
    for params in ({"wait_for_change": "true", "timeout_sec": "0"}, {"wait_for_change": ""}):
        refused = await get(app, f"{V1}/instance/id", headers={}, **params)  # GCE's 403 first, even so
        assert (refused.status_code, refused.headers["metadata-flavor"]) == (403, "Google"), params
        bad = await get(app, f"{V1}/instance/id", **params)
        assert (bad.status_code, bad.headers["metadata-flavor"]) == (400, "Google"), params


async def test_instance_and_project_leaves(app):
    """The instance's id, name, hostname, zone, machine type, tags, interfaces, project id and number."""
    instance_id = app.ids[0]
    number = project_number("acme-prod")
    expected = {
        "instance/id": instance_id, "instance/name": "web-1", "instance/hostname": "web-1.acme.internal",
        "instance/zone": f"projects/{number}/zones/da11",
        "instance/machine-type": f"projects/{number}/machineTypes/c3.small.x86",
        "instance/network-interfaces/0/ip": "10.82.1.7", "instance/network-interfaces/0/mac": "40:a6:b7:00:00:01",
        "instance/network-interfaces/0/access-configs/0/external-ip": "203.0.113.7",
        "instance/attributes/enable-oslogin": "FALSE", "instance/attributes/role": '{"tier":1}',
        "project/project-id": "acme-prod", "project/numeric-project-id": number, "project/attributes/team": "infra",
    }
    for path, value in expected.items():
        answer = await get(app, f"{V1}/{path}")
        assert (answer.status_code, answer.text) == (200, value), path
        assert answer.headers["content-type"] == "application/text"
    tags = await get(app, f"{V1}/instance/tags")
    assert (tags.headers["content-type"], tags.json()) == ("application/json", ["web", "blue"])
    assert len(number) == 12
    assert number == project_number("acme-prod") != project_number("other-proj")


async def test_ssh_keys_and_user_data_follow_cloud_inits_conventions(app):
    """ssh-keys: one ``user:key`` per line (cloudinit: for a key without a user); user-data as an attribute."""
    keys = await get(app, f"{V1}/instance/attributes/ssh-keys")
    assert keys.text.splitlines() == [f"cloudinit:{KEY}", "bob:ssh-rsa AAAAB3Nza bob@example"]
    userdata = await get(app, f"{V1}/instance/attributes/user-data")
    assert userdata.text == "#cloud-config\nruncmd: [true]\n"


async def test_directory_listings_recursive_and_alt(app):
    """Listings end each entry in a newline (dirs with /); recursive is camelCase JSON; alt switches shape."""
    root = await get(app, f"{V1}/")
    assert root.text == "instance/\nproject/\n"
    instance = (await get(app, f"{V1}/instance/")).text.splitlines()
    assert {"attributes/", "hostname", "id", "network-interfaces/", "service-accounts/", "tags", "zone"} <= set(
        instance)
    assert (await get(app, f"{V1}/instance")).text == (await get(app, f"{V1}/instance/")).text
    whole = (await get(app, f"{V1}/instance/", recursive="true")).json()
    assert whole["machineType"].endswith("/c3.small.x86")
    assert whole["networkInterfaces"][0]["accessConfigs"][0]["externalIp"] == "203.0.113.7"
    assert whole["attributes"]["enable-oslogin"] == "FALSE"  # attribute names are kept as written
    assert "identity" not in whole["serviceAccounts"]["default"]
    attributes = await get(app, f"{V1}/instance/attributes/", recursive="True", alt="text")
    assert "enable-oslogin FALSE" in attributes.text.splitlines()
    attributes = await get(app, f"{V1}/instance/attributes/", recursive="true")
    assert attributes.json()["enable-oslogin"] == "FALSE"
    assert attributes.json()["ssh-keys"].startswith("cloudinit:")
    assert (await get(app, f"{V1}/instance/hostname", alt="json")).json() == "web-1.acme.internal"
    assert (await get(app, f"{V1}/instance/tags", alt="text")).text == '["web","blue"]'
    assert (await get(app, f"{V1}/instance/id", alt="yaml")).status_code == 400
    accounts = await get(app, f"{V1}/instance/service-accounts/default/")
    assert accounts.text.splitlines() == ["aliases", "email", "identity", "scopes", "token"]
    info = (await get(app, f"{V1}/instance/service-accounts/default/", recursive="true")).json()
    assert set(info) == {"aliases", "email", "scopes"}
    assert info["aliases"] == ["default"]


async def test_token_is_refused_with_a_reason(app):
    """No OAuth access tokens: 404 that says so."""
    answer = await get(app, f"{V1}/instance/service-accounts/default/token")
    assert answer.status_code == 404
    assert "no OAuth access tokens" in answer.text


async def test_identity_token_claims_and_key_set(app):
    """aud, iss, sub, iat, exp (≤ 1 h), the compute_engine claims with format=full; verified by the JWKS."""
    path = f"{V1}/instance/service-accounts/default/identity"
    assert (await get(app, path)).status_code == 400  # an audience is required
    token = (await get(app, path, audience="https://svc.example", format="full")).text
    async with client_from(app, OTHER) as anyone:
        jwks = (await anyone.get("/.well-known/jwks.json")).json()
        discovery = (await anyone.get("/.well-known/openid-configuration")).json()
    assert discovery["issuer"] == "https://imds.example"
    assert discovery["jwks_uri"] == "https://imds.example/.well-known/jwks.json"
    header = jwt.get_unverified_header(token)
    key = next(k for k in jwks["keys"] if k["kid"] == header["kid"])
    claims = jwt.decode(token, jwt.PyJWK(key).key, algorithms=[header["alg"]], audience="https://svc.example",
                        issuer="https://imds.example")
    assert claims["sub"] == app.ids[0]
    assert 0 < claims["exp"] - claims["iat"] <= 3600
    engine = claims["google"]["compute_engine"]
    assert engine == {"instance_id": app.ids[0], "instance_name": "web-1", "project_id": "acme-prod",
                      "project_number": int(project_number("acme-prod")), "zone": "da11"}
    plain = jwt.decode((await get(app, path, audience="a")).text, options={"verify_signature": False})
    assert "google" not in plain
    assert plain["aud"] == "a"


async def test_wait_for_change_with_the_etag_passed_back_verbatim(app):
    """The unquoted ETag goes back as last_etag; the held read answers once the instance changes."""
    first = await get(app, f"{V1}/instance/hostname")
    etag = first.headers["etag"]
    assert '"' not in etag
    assert len(first.headers.get_list("etag")) == 1
    same = await get(app, f"{V1}/instance/hostname", wait_for_change="true", last_etag="0" * 32)
    assert same.text == "web-1.acme.internal"  # a stale ETag answers at once
    held = asyncio.ensure_future(get(app, f"{V1}/instance/hostname", wait_for_change="true", last_etag=etag,
                                     timeout_sec="30"))
    await wait_for_async(lambda: app.services.catalog.get(app.ids[0]).waiters, what="the read to be held",
                         timeout=WAIT_BOUND)
    await push(app, app.ids[0], GUEST, "web-2.acme.internal")
    changed = await asyncio.wait_for(held, WAIT_BOUND)
    assert changed.text == "web-2.acme.internal"
    assert changed.headers["etag"] != etag


async def test_google_root_and_no_leak_between_instances(app):
    """GET / with the header answers as GCE's root; each caller sees only its own instance."""
    root = await get(app, "/")
    assert (root.text, root.headers["metadata-flavor"]) == ("computeMetadata/\n", "Google")
    assert "latest" in (await get(app, "/", headers={})).text  # EC2's versions listing without it
    mine = (await get(app, f"{V1}/", recursive="true")).text
    theirs = (await get(app, f"{V1}/", ip=OTHER, recursive="true")).text
    assert app.ids[1] not in mine
    assert app.ids[0] not in theirs
    assert json.loads(theirs)["project"]["projectId"] == "other-proj"
    stranger = await get(app, f"{V1}/instance/id", ip="10.82.9.9")
    assert stranger.status_code == 404
