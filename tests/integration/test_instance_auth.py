"""The anti-SSRF policy per flavor (``--instance-auth``), over HTTP, for every flavor's path classes.

A forged request (SSRF) is a plain GET without extra headers: on a protected flavor it is a
401 in the flavor's own error style and carries none of the instance's data. ``Metadata:
true``, any ``Metadata-Flavor`` header or an IMDSv2 token of the calling instance open it.
"""

from __future__ import annotations

import pytest

from factories import metadata_body, next_ipv4, userdata_body
from helpers import admin_client, client_from, make_settings, running_app

pytestmark = pytest.mark.anyio

USERDATA = "#!/bin/sh\necho ssrf-canary-7f3a\n"
TOKEN, TTL = "x-aws-ec2-metadata-token", "x-aws-ec2-metadata-token-ttl-seconds"
# One path per class a flavor serves: documents, userdata, vendor data, passwords, OS parameters, listings.
PATHS = {
    "json": ("/metadata", "/userdata", "/api/v1/userdata", "/userdata/"),
    "openstack": ("/openstack", "/openstack/latest/user_data", "/openstack/latest/meta_data.json",
                  "/openstack/latest/vendor_data.json", "/openstack/latest/vendor_data2.json"),
    "nocloud": ("/nocloud/", "/nocloud/user-data", "/nocloud/meta-data", "/nocloud/vendor-data"),
}
GANETI = "/ganeti/latest/os/parameters.json"  # 404 without an OS record: the guard answers before it
ALL_PATHS = [(flavor, path) for flavor, paths in PATHS.items() for path in paths]


async def _instance(app) -> str:
    ip = next_ipv4()
    async with admin_client(app) as admin:
        body = metadata_body(ips=[ip])
        assert (await admin.post("/device-metadata", json=body)).status_code == 200
        answer = await admin.post("/device-userdata", json=userdata_body(body["id"], [ip], USERDATA,
                                                                           userdata_encoding="text"))
        assert answer.status_code == 200
    return ip


@pytest.mark.parametrize(("flavor", "path"), ALL_PATHS)
async def test_without_the_policy_every_flavor_answers_a_plain_get(flavor, path):
    """The default keeps cloud-init's OpenStack and NoCloud datasources (which send no header) working."""
    async with running_app() as app:
        ip = await _instance(app)
        async with client_from(app, ip) as guest:
            assert (await guest.get(path)).status_code == 200, (flavor, path)


@pytest.mark.parametrize(("flavor", "path"), ALL_PATHS)
async def test_a_protected_flavor_refuses_a_plain_get_and_opens_to_each_proof(flavor, path):
    """401 without proof (no data in the body); 200 with Metadata: true, Metadata-Flavor or the caller's token."""
    async with running_app(make_settings(instance_auth=frozenset({flavor}))) as app:
        ip = await _instance(app)
        async with client_from(app, ip) as guest:
            refused = await guest.get(path)
            assert refused.status_code == 401, path
            assert "ssrf-canary" not in refused.text
            assert "host-" not in refused.text
            if flavor == "json":
                assert "IMDSv2 token" in refused.json()["message"]
            else:
                assert refused.text == "401 - Unauthorized"
            assert (await guest.get(path, headers={"Metadata": "false"})).status_code == 401
            opened = [await guest.get(path, headers={"Metadata": "true"}),
                      await guest.get(path, headers={"Metadata-Flavor": "imds"})]
            token = await guest.put("/latest/api/token", headers={TTL: "60"})
            assert token.status_code == 200
            opened.append(await guest.get(path, headers={TOKEN: token.text}))
            assert [answer.status_code for answer in opened] == [200, 200, 200]
            if path.endswith(("userdata", "user_data", "user-data")):
                assert [answer.text for answer in opened] == [USERDATA] * 3


async def test_a_token_of_another_instance_or_a_forged_one_is_refused():
    """A token opens only its own instance's paths; a bad one is 401 even though a token was sent."""
    async with running_app(make_settings(instance_auth=frozenset({"json", "openstack", "nocloud", "ganeti"}))) as app:
        mine, other = await _instance(app), await _instance(app)
        async with client_from(app, other) as thief, client_from(app, mine) as guest:
            stolen = (await thief.put("/latest/api/token", headers={TTL: "60"})).text
            for path in ("/userdata", "/openstack/latest/user_data", "/nocloud/user-data", GANETI):
                assert (await guest.get(path, headers={TOKEN: stolen})).status_code == 401, path
                assert (await guest.get(path, headers={TOKEN: "forged.token"})).status_code == 401, path


async def test_the_ganeti_flavor_is_guarded_before_it_answers():
    """Ganeti paths (OS parameters, scripts, packages, the channel): 401 without proof, the flavor's own answer with."""
    async with running_app(make_settings(instance_auth=frozenset({"ganeti"}))) as app:
        ip = await _instance(app)
        async with client_from(app, ip) as guest:
            assert (await guest.get(GANETI)).text == "401 - Unauthorized"
            assert (await guest.get(GANETI, headers={"Metadata-Flavor": "ganeti"})).text == "404 - Not Found"
            assert (await guest.get("/userdata")).status_code == 200  # other flavors untouched


async def test_protecting_one_flavor_leaves_the_others_and_ec2_to_their_own_settings():
    """--instance-auth openstack: NoCloud and JSON stay open; EC2 follows --imdsv2 only."""
    async with running_app(make_settings(instance_auth=frozenset({"openstack"}))) as app:
        ip = await _instance(app)
        async with client_from(app, ip) as guest:
            assert (await guest.get("/openstack/latest/user_data")).status_code == 401
            assert (await guest.get("/nocloud/user-data")).text == USERDATA
            assert (await guest.get("/latest/user-data")).status_code == 200
    async with running_app(make_settings(imdsv2="required")) as app:
        ip = await _instance(app)
        async with client_from(app, ip) as guest:
            assert (await guest.get("/latest/user-data")).status_code == 401
            assert (await guest.get("/openstack/latest/user_data")).status_code == 200  # opt-in, not implied


@pytest.mark.parametrize(
    "proxy_header",
    [("Forwarded", "for=10.9.9.9"), ("X-Forwarded-For", "10.9.9.9"), ("X-Forwarded-Host", "evil.example"),
     ("X-Forwarded-Proto", "http"), ("X-Real-IP", "10.9.9.9")],
)
async def test_a_token_put_that_came_through_a_proxy_is_refused(proxy_header):
    """AWS refuses X-Forwarded-For on the PUT; imds also refuses Forwarded, other X-Forwarded-* and X-Real-IP."""
    async with running_app() as app:
        ip = await _instance(app)
        async with client_from(app, ip) as guest:
            refused = await guest.put("/latest/api/token", headers={TTL: "60", proxy_header[0]: proxy_header[1]})
            assert (refused.status_code, refused.text) == (403, "403 - Forbidden")
            assert (await guest.put("/latest/api/token", headers={TTL: "60"})).status_code == 200


async def test_instance_auth_is_a_setting_with_all_and_a_checked_list():
    """--instance-auth all protects every non-EC2 flavor; an unknown flavor is a ConfigError naming the flag."""
    from imds.config import load  # noqa: PLC0415 - the settings loader is what this test is about
    from imds.errors import ConfigError  # noqa: PLC0415

    env = {"HOME": "/nonexistent"}
    assert load({"instance_auth": ("all",)}, env).instance_auth == frozenset({"json", "openstack", "nocloud", "ganeti"})
    assert load({}, {**env, "IMDS_INSTANCE_AUTH": "json,nocloud"}).instance_auth == frozenset({"json", "nocloud"})
    with pytest.raises(ConfigError, match="--instance-auth"):
        load({"instance_auth": ("ec2",)}, env)


async def test_imdsv2_required_warns_about_flavors_left_open():
    """--imdsv2 required alone leaves JSON/OpenStack/NoCloud/Ganeti open to a plain GET: said once at startup."""
    from structlog.testing import capture_logs  # noqa: PLC0415 - only this test reads the log

    with capture_logs() as logs:
        async with running_app(make_settings(imdsv2="required", instance_auth=frozenset({"json"}))):
            pass
    warned = [e for e in logs if e["event"] == "instance_auth.partial"]
    assert len(warned) == 1
    assert warned[0]["open_flavors"] == ["openstack", "nocloud", "ganeti"]
    with capture_logs() as logs:
        async with running_app(make_settings(imdsv2="required", instance_auth=frozenset(
                {"json", "openstack", "nocloud", "ganeti"}))):
            pass
    assert not [e for e in logs if e["event"] == "instance_auth.partial"]
