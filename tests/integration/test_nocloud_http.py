"""The NoCloud flavor over HTTP (in-process, chosen source IP): the four files, the listing, 404s and 405s."""

from __future__ import annotations

import pytest
import yaml

from helpers import admin_client, client_from, push_record, running_app
from imds.services.render.network import derived_network_data, network_config_v2
from openstack_data import SEED_ID, USERDATA, VENDOR_DATA, openstack_document, seed_document

pytestmark = pytest.mark.anyio

GUEST = "10.70.17.9"
BARE = "10.80.0.3"
BARE_ID = "0c8d7d4e-2b1a-4c55-9e0f-2d7f5a9b8c61"
TEXT = "text/plain; charset=utf-8"


async def test_the_four_files_and_the_listing():
    """meta-data YAML (id, hostname, keys), exact user-data, vendor-data, network-config v2, and the listing."""
    async with running_app() as app, admin_client(app) as admin, client_from(app, GUEST) as guest:
        await push_record(admin, [GUEST], openstack_document(), USERDATA, userdata_encoding="text")
        for path in ("/nocloud", "/nocloud/"):
            listing = await guest.get(path)
            assert (listing.status_code, listing.text) == (200, "meta-data\nuser-data\nvendor-data\nnetwork-config")
        meta = await guest.get("/nocloud/meta-data")
        assert (meta.status_code, meta.headers["content-type"]) == (200, TEXT)
        assert yaml.safe_load(meta.text) == {"instance-id": SEED_ID, "local-hostname": "metadata-example-01",
                                             "public-keys": seed_document()["ssh_keys"]}
        user = await guest.get("/nocloud/user-data")
        assert (user.status_code, user.content) == (200, USERDATA.encode())
        assert (await guest.get("/nocloud/vendor-data")).text == VENDOR_DATA["cloud-init"]
        network = yaml.safe_load((await guest.get("/nocloud/network-config/")).text)
        assert network == network_config_v2(derived_network_data(seed_document()))
        assert network["bonds"]["bond0"]["addresses"] == ["40.91.78.229/31", "2001:0db8:8583:0000::9/127",
                                                          "10.70.17.9/31"]
        head = await guest.head("/nocloud/meta-data")
        assert (head.status_code, head.content, int(head.headers["content-length"])) == (200, b"", len(meta.content))


async def test_user_data_is_always_there_and_network_config_only_with_a_network():
    """Without userdata, user-data is 200 and empty; vendor-data empty; no network section → network-config 404."""
    async with running_app() as app, admin_client(app) as admin, client_from(app, BARE) as guest:
        await push_record(admin, [BARE], {"id": BARE_ID, "hostname": "bare"})
        user = await guest.get("/nocloud/user-data")
        assert (user.status_code, user.content) == (200, b"")
        assert (await guest.get("/nocloud/vendor-data")).content == b""
        assert (await guest.get("/nocloud/")).text == "meta-data\nuser-data\nvendor-data"
        missing = await guest.get("/nocloud/network-config")
        assert (missing.status_code, missing.text) == (404, "404 - Not Found")
        assert yaml.safe_load((await guest.get("/nocloud/meta-data")).text) == {
            "instance-id": BARE_ID, "local-hostname": "bare", "public-keys": []}


async def test_unknown_files_callers_and_methods():
    """Unknown file or caller → plain 404; POST/PUT → 405; an instance with userdata only has no meta-data."""
    async with running_app() as app, admin_client(app) as admin:
        await push_record(admin, [GUEST], openstack_document(), USERDATA, userdata_encoding="text")
        body = {"id": BARE_ID, "ipAddresses": [BARE], "userdata": "#!/bin/sh\n", "userdata_encoding": "text"}
        assert (await admin.post("/device-userdata", json=body)).status_code == 200
        async with client_from(app, GUEST) as guest:
            assert (await guest.get("/nocloud/seed")).status_code == 404
            assert (await guest.get("/nocloud/meta-data/instance-id")).status_code == 404
            for method in ("POST", "PUT", "DELETE"):
                answer = await guest.request(method, "/nocloud/user-data")
                assert (answer.status_code, answer.text) == (405, "405 - Method Not Allowed")
        async with client_from(app, "10.99.0.9") as stranger:
            for path in ("/nocloud/meta-data", "/nocloud/user-data", "/nocloud/"):
                answer = await stranger.get(path)
                assert (answer.status_code, answer.text) == (404, "404 - Not Found")
        async with client_from(app, BARE) as userdata_only:
            assert (await userdata_only.get("/nocloud/meta-data")).status_code == 404
            assert (await userdata_only.get("/nocloud/user-data")).content == b"#!/bin/sh\n"
