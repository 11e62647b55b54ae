"""Real EC2 clients against a real ``imds serve``: cloud-init, botocore and ec2-metadata, IMDSv2 optional and required.

Each mode gets its own server (SQLite in a temporary data dir, a free loopback port). The seed's
example document is bound to 127.0.0.3 and every client connects *from* 127.0.0.3, so the server
identifies it by its real socket peer. cloud-init runs in the system interpreter (Debian's package),
never through its boot stages, with temporary paths and only the test server's URL.
"""

from __future__ import annotations

import base64
import copy
import importlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cloudinit_guard import GUEST_GUARD, run_cloud_init
from helpers import fixture_json
from serve_process import Server, serving

GUEST = "127.0.0.3"  # holds the seed document
AWS_GUEST = "127.0.0.5"  # holds a document with AWS-style placement
STRANGER = "127.0.0.9"  # holds nothing
AWS_ID = "7f1d2c3b-4a5e-4f60-8a7b-9c0d1e2f3a4b"
SEED_ID = "cc40301c-4038-4011-af55-6eae3ba60246"
USERDATA = "#cloud-config\n# héllo — ünïcødé ✓\nruncmd: [echo hi]\n"
TOKEN = "X-aws-ec2-metadata-token"
TTL = "X-aws-ec2-metadata-token-ttl-seconds"
CLIENT_TIMEOUT = 60


def seed() -> dict[str, Any]:
    return fixture_json("metadata-example.json")


def aws_style() -> dict[str, Any]:
    """The seed document re-homed with AWS-style placement (explicit region and zone keys)."""
    doc = copy.deepcopy(seed())
    doc.update(id=AWS_ID, hostname="ip-10-0-0-5", region="us-west-2", availability_zone="us-west-2a",
               tags=["role=web", "env=prod", "untagged"])
    return doc


def need(module: str) -> Any:
    """Import a client library from the test virtualenv, failing (never skipping) when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        pytest.fail(f"{module} is not importable in the test virtualenv ({exc}); install the test extra: "
                    "pip install -e '.[test]'")


@pytest.fixture(scope="module", params=["optional", "required"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``imds serve --imdsv2 MODE`` with the seed document at 127.0.0.3 and an AWS-style one at 127.0.0.5.

    Required mode also runs the strictest anti-SSRF policy (``--instance-auth all``): EC2 clients are unaffected.
    """
    tmp = tmp_path_factory.mktemp(f"ec2-{request.param}")
    strict = ("--instance-auth", "all") if request.param == "required" else ()
    with serving(tmp, "--data-dir", str(tmp / "data"), "--imdsv2", request.param, *strict) as running:
        for doc, ip in ((seed(), GUEST), (aws_style(), AWS_GUEST)):
            running.post("/device-metadata", {"id": doc["id"], "ipAddresses": [ip], "metadata": doc})
            running.post("/device-userdata", {"id": doc["id"], "ipAddresses": [ip], "userdata": USERDATA,
                                              "userdata_encoding": "text"})
        running.mode = request.param  # type: ignore[attr-defined]
        yield running


def required(server: Server) -> bool:
    return server.mode == "required"  # type: ignore[attr-defined]


# --- cloud-init (Debian's package, system interpreter) -------------------------------------------------------------

CLOUD_INIT_SCRIPT = r"""
import base64, json, sys, time

cfg = json.loads(sys.argv[1])

""" + GUEST_GUARD + r"""

from cloudinit import url_helper, util
from cloudinit.sources.helpers import ec2

util._DNS_REDIRECT_IP = set()  # no DNS probes for "bad" names: the only URL is an IP address

url = cfg["url"]
out = {}
if cfg["mode"] == "helpers":
    headers_cb = None
    if cfg["token"]:
        token = url_helper.readurl(url + "/latest/api/token", headers={cfg["ttl_header"]: "21600"},
                                   request_method="PUT", timeout=10).contents.decode()
        headers_cb = lambda _url: {cfg["token_header"]: token}
    for version in cfg["versions"]:
        kwargs = dict(api_version=version, metadata_address=url, headers_cb=headers_cb, timeout=10, retries=0)
        md = ec2.get_instance_metadata(**kwargs)
        ud = ec2.get_instance_userdata(**kwargs)
        identity = ec2.get_instance_identity(**kwargs)
        out[version] = {
            "meta-data": md,
            "user-data": base64.b64encode(ud).decode() if isinstance(ud, bytes) else None,
            "document": identity.get("document"),
        }
else:
    from cloudinit import distros, helpers
    from cloudinit.sources import DataSourceEc2

    tmp = cfg["tmp"]
    paths = helpers.Paths({"cloud_dir": tmp + "/cloud", "run_dir": tmp + "/run", "docs_dir": tmp + "/docs",
                           "templates_dir": tmp + "/templates"})
    distro = distros.fetch("debian")("debian", {}, paths)
    sys_cfg = {"datasource": {"Ec2": {"metadata_urls": [url], "timeout": 2, "max_wait": cfg["max_wait"]}}}
    ds = DataSourceEc2.DataSourceEc2(sys_cfg, distro, paths)
    # DMI cannot identify a container: say which platform to behave as ("aws" crawls with IMDSv2 tokens).
    ds._get_cloud_name = lambda: cfg["cloud"]
    started = time.monotonic()
    ok = ds._get_data()  # _maybe_fetch_api_token, then crawl_metadata; no boot stage runs
    out = {"ok": ok, "seconds": time.monotonic() - started, "cloud_name": ds.cloud_name,
           "had_token": bool(ds._api_token)}
    if ok:
        out.update(
            instance_id=ds.get_instance_id(),
            hostname=ds.get_hostname().hostname,
            public_keys=ds.get_public_ssh_keys(),
            availability_zone=ds.availability_zone,
            region=ds.region,
            local_ipv4=ds.metadata.get("local-ipv4"),
            userdata=base64.b64encode(ds.userdata_raw).decode(),
            api_version=ds._crawled_metadata.get("_metadata_api_version"),
            identity_instance=ds.identity.get("instanceId"),
            classic=ds.is_classic_instance(),
        )
print(json.dumps(out))
"""


def cloud_init(server: Server, tmp_path: Path, **cfg: Any) -> dict[str, Any]:
    """Run the cloud-init script in the system interpreter; returns what it printed."""
    cfg.update(url=server.url, source=GUEST, tmp=str(tmp_path), token_header=TOKEN, ttl_header=TTL)
    return run_cloud_init(CLOUD_INIT_SCRIPT, cfg, tmp_path, CLIENT_TIMEOUT)


def test_cloud_init_helpers_read_the_tree_and_userdata_with_a_token(server, tmp_path):
    """cloud-init's ec2 helpers crawl 2021-03-23 and latest with a token: ids, keys, addresses, exact userdata."""
    got = cloud_init(server, tmp_path, mode="helpers", token=True, versions=["2021-03-23", "latest"])
    keys = seed()["ssh_keys"]
    for version in ("2021-03-23", "latest"):
        md = got[version]["meta-data"]
        assert md["instance-id"] == SEED_ID
        assert md["local-hostname"] == "metadata-example-01"
        assert md["public-keys"] == {"test@testmachine.local": keys[0], "test@testmachine.local-1": keys[1]}
        assert md["local-ipv4"] == "10.70.17.9"
        assert md["public-ipv4"] == "40.91.78.229"
        assert md["placement"] == {"availability-zone": "da11", "region": "da1"}
        assert md["network"]["interfaces"]["macs"]["40:a6:b7:74:9f:10"]["local-ipv4s"] == "10.70.17.9"
        assert md["block-device-mapping"] == {"ami": "/dev/sda", "root": "/dev/sda"}
        assert base64.b64decode(got[version]["user-data"]) == USERDATA.encode()
        assert got[version]["document"]["instanceId"] == SEED_ID


def test_cloud_init_helpers_without_a_token(server, tmp_path):
    """Tokenless helpers read everything in optional mode and get nothing (empty results) in required mode."""
    got = cloud_init(server, tmp_path, mode="helpers", token=False, versions=["latest"])["latest"]
    if required(server):
        assert got == {"meta-data": {}, "user-data": None, "document": None}
    else:
        assert got["meta-data"]["instance-id"] == SEED_ID
        assert base64.b64decode(got["user-data"]) == USERDATA.encode()


def test_cloud_init_ec2_datasource_crawls_over_imdsv2(server, tmp_path):
    """DataSourceEc2 as on AWS: fetches a token, crawls 2021-03-23, and reports the seed's facts and exact userdata."""
    got = cloud_init(server, tmp_path, mode="datasource", cloud="aws", max_wait=5)
    assert got["ok"] is True
    assert got["had_token"] is True
    assert got["api_version"] == "2021-03-23"
    assert got["instance_id"] == SEED_ID
    assert got["identity_instance"] == SEED_ID
    assert got["hostname"] == "metadata-example-01"
    assert sorted(got["public_keys"]) == sorted(seed()["ssh_keys"])
    assert got["local_ipv4"] == "10.70.17.9"
    assert got["availability_zone"] == "da11"
    assert got["region"] == "da1"  # on AWS cloud-init takes it from the identity document: the same region
    # A MAC without vpc-id is EC2 Classic to cloud-init: network config re-applied (and re-crawled) every boot.
    assert got["classic"] is False
    assert base64.b64decode(got["userdata"]) == USERDATA.encode()


def test_cloud_init_ec2_datasource_without_tokens(server, tmp_path):
    """Off AWS cloud-init reads tokenless (IMDSv1): it works in optional mode and finds nothing in required mode."""
    got = cloud_init(server, tmp_path, mode="datasource", cloud="unknown", max_wait=2)
    assert got["had_token"] is False
    if required(server):
        assert got["ok"] is False
        assert got["seconds"] < 10
    else:
        assert got["ok"] is True
        assert got["instance_id"] == SEED_ID
        assert sorted(got["public_keys"]) == sorted(seed()["ssh_keys"])
        assert got["availability_zone"] == "da11"
        assert got["region"] == "da1"  # off AWS cloud-init trims the zone's last character (see render/ec2.py)
        assert base64.b64decode(got["userdata"]) == USERDATA.encode()


# --- botocore ---------------------------------------------------------------------------------------------------------


def botocore_fetcher(kind: str, server: Server, source: str) -> Any:
    """A botocore IMDS fetcher pointed at the test server, connecting from ``source``."""
    utils = need("botocore.utils")
    fetcher = getattr(utils, kind)(timeout=10, num_attempts=1, env={},
                                   config={"ec2_metadata_service_endpoint": server.url})
    assert fetcher.get_base_url() == server.url
    # botocore has no source-address option; its urllib3 pool manager does.
    fetcher._session._manager.connection_pool_kw["source_address"] = (source, 0)
    return fetcher


def test_botocore_fetches_a_token_then_metadata_and_userdata(server):
    """InstanceMetadataFetcher: token PUT, then instance id, public keys and the exact userdata with the token."""
    fetcher = botocore_fetcher("InstanceMetadataFetcher", server, GUEST)
    try:
        token = fetcher._fetch_metadata_token()
        assert token
        paths = ("latest/meta-data/instance-id", "latest/meta-data/public-keys/",
                 "latest/meta-data/public-keys/0/openssh-key", "latest/meta-data/public-keys/1/openssh-key",
                 "latest/user-data")
        reads = {path: fetcher._get_request(path, None, token=token) for path in paths}
        assert reads["latest/meta-data/instance-id"].text == SEED_ID
        assert reads["latest/meta-data/public-keys/"].text == "0=test@testmachine.local\n1=test@testmachine.local-1"
        assert reads["latest/meta-data/public-keys/0/openssh-key"].text == seed()["ssh_keys"][0]
        assert reads["latest/meta-data/public-keys/1/openssh-key"].text == seed()["ssh_keys"][1]
        assert reads["latest/user-data"].content == USERDATA.encode()
        assert all(0 < int(r.headers[TTL]) <= 21600 for r in reads.values())
        # No IAM role is served: botocore gets no credentials, and no error.
        assert fetcher.retrieve_iam_role_credentials() == {}
    finally:
        fetcher._session.close()


def test_botocore_region_is_the_zone_minus_its_last_letter(server):
    """retrieve_region() gives us-west-2 for zone us-west-2a, and 'da1' for the seed's facility da11 (documented)."""
    for source, region in ((AWS_GUEST, "us-west-2"), (GUEST, "da1")):
        fetcher = botocore_fetcher("InstanceMetadataRegionFetcher", server, source)
        try:
            assert fetcher.retrieve_region() == region
        finally:
            fetcher._session.close()


def test_botocore_without_a_token(server):
    """A tokenless botocore read works in optional mode and exhausts its attempts on 401 in required mode."""
    utils = need("botocore.utils")
    fetcher = botocore_fetcher("InstanceMetadataFetcher", server, GUEST)
    try:
        if required(server):
            with pytest.raises(utils._RetriesExceededError):
                fetcher._get_request("latest/meta-data/instance-id", None, token=None)
        else:
            assert fetcher._get_request("latest/meta-data/instance-id", None, token=None).text == SEED_ID
    finally:
        fetcher._session.close()


# --- ec2-metadata ---------------------------------------------------------------------------------------------------


def ec2_metadata_client(server: Server, source: str) -> tuple[Any, Any]:
    """An EC2Metadata (always IMDSv2) pointed at the test server, with a pool manager bound to ``source``."""
    ec2_metadata = need("ec2_metadata")
    urllib3 = need("urllib3")
    pool = urllib3.PoolManager(source_address=(source, 0))
    client = ec2_metadata.EC2Metadata(pool_manager=pool)
    client.service_url = f"{server.url}/latest/"
    client.metadata_url = f"{client.service_url}meta-data/"
    client.dynamic_url = f"{client.service_url}dynamic/"
    client.userdata_url = f"{client.service_url}user-data/"
    return client, pool


def test_ec2_metadata_reads_everything_it_knows(server):
    """ec2-metadata: ids, placement, keys, interfaces, addresses, identity document and the exact userdata."""
    client, pool = ec2_metadata_client(server, GUEST)
    try:
        assert client.instance_id == SEED_ID
        assert client.instance_type == "c3.medium.x86"
        assert client.ami_id == "31853a2b0b2fcc4ee7fd5da5e53611303b60aafa"
        assert client.availability_zone == "da11"
        assert client.region == "da1"  # from the identity document: what botocore derives from the zone
        assert client.private_hostname == "metadata-example-01"
        assert client.private_ipv4 == "10.70.17.9"
        assert client.public_ipv4 == "40.91.78.229"
        assert client.mac == "40:a6:b7:74:9f:10"
        keys = client.public_keys
        assert sorted(keys) == ["test@testmachine.local", "test@testmachine.local-1"]
        assert [keys[name].openssh_key for name in sorted(keys)] == seed()["ssh_keys"]
        assert sorted(client.network_interfaces) == ["40:a6:b7:74:9f:10", "40:a6:b7:74:9f:11"]
        primary = client.network_interfaces["40:a6:b7:74:9f:10"]
        assert (primary.device_number, primary.private_ipv4s, primary.public_ipv4s, primary.ipv6s) == (
            0, ["10.70.17.9"], ["40.91.78.229"], ["2001:0db8:8583:0000::9"])
        assert primary.subnet_ipv4_cidr_block == "10.70.17.8/31"
        assert client.network_interfaces["40:a6:b7:74:9f:11"].public_ipv4s == []
        document = client.instance_identity_document
        assert (document["instanceId"], document["privateIp"], document["availabilityZone"]) == (
            SEED_ID, "10.70.17.9", "da11")
        assert client.user_data == USERDATA.encode()
    finally:
        pool.clear()


def test_ec2_metadata_with_aws_style_placement(server):
    """Explicit region/availability_zone keys and key=value tags reach ec2-metadata as AWS would serve them."""
    client, pool = ec2_metadata_client(server, AWS_GUEST)
    try:
        assert (client.instance_id, client.region, client.availability_zone) == (AWS_ID, "us-west-2", "us-west-2a")
        assert dict(client.tags) == {"role": "web", "env": "prod"}
    finally:
        pool.clear()


def test_ec2_metadata_from_an_unknown_address_gets_404(server):
    """A caller no instance holds gets nothing: the token PUT itself is 404."""
    urllib3 = need("urllib3")
    client, pool = ec2_metadata_client(server, STRANGER)
    try:
        with pytest.raises(urllib3.exceptions.HTTPError, match="Failed to fetch token: 404"):
            _ = client.instance_id
    finally:
        pool.clear()


# --- IMDSv2 required vs optional, on the wire ------------------------------------------------------------------


def test_required_mode_refuses_tokenless_gets_and_serves_token_gets(server):
    """A plain tokenless GET is 401 in required mode (200 in optional); with a token it is 200 plus the TTL header."""
    transport = httpx.HTTPTransport(local_address=GUEST)
    with httpx.Client(transport=transport, base_url=server.url, timeout=5.0) as guest:
        tokenless = guest.get("/latest/meta-data/instance-id")
        if required(server):
            assert (tokenless.status_code, tokenless.text) == (401, "401 - Unauthorized")
        else:
            assert (tokenless.status_code, tokenless.text) == (200, SEED_ID)
        started = time.monotonic()
        token = guest.put("/latest/api/token", headers={TTL: "120"})
        assert (token.status_code, token.headers[TTL]) == (200, "120")
        with_token = guest.get("/latest/meta-data/instance-id", headers={TOKEN: token.text})
        assert (with_token.status_code, with_token.text) == (200, SEED_ID)
        assert 120 - (time.monotonic() - started) - 2 <= int(with_token.headers[TTL]) <= 120
        proxied = guest.put("/latest/api/token", headers={TTL: "120", "X-Forwarded-For": GUEST})
        assert (proxied.status_code, proxied.text) == (403, "403 - Forbidden")
