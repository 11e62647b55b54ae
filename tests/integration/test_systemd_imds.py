"""What systemd-imds (systemd 261+, ``src/imds/imdsd.c``) asks of imds, against a real ``imds serve``.

systemd's EC2 entry (``hwdb.d/40-imds.hwdb``): one ``PUT /latest/api/token`` with
``X-aws-ec2-metadata-token-ttl-seconds`` (its refresh time, 900 s), then GETs of the
well-known keys under ``/latest`` from privileged source ports: hostname, region, zone,
public IPv4, ``/meta-data/ipv6``, the SSH key and ``/user-data``. A 401 makes it ask for a new
token; a 403 makes it give IMDS up for the boot ("IMDS is not available"), so a bad token must
never be a 403; a 404 is "key not found". Its GCE entry reads ``/computeMetadata/v1`` keys
with ``Metadata-Flavor: Google`` and looks for its userdata at
``instance/attributes/systemd-userdata``. Requests here leave from the instance's own
loopback address and a port below 1024, as imdsd's do (the tests run as root).
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from factories import new_id
from serve_process import Server, serving

GUEST, OTHER = "127.0.91.7", "127.0.91.8"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
EC2_KEYS = {  # systemd's hwdb.d/40-imds.hwdb, dmi:bvnAmazonEC2:*
    "hostname": "/meta-data/hostname", "region": "/meta-data/placement/region",
    "zone": "/meta-data/placement/availability-zone", "ipv4-public": "/meta-data/public-ipv4",
    "ipv6-public": "/meta-data/ipv6", "ssh-key": "/meta-data/public-keys/0/openssh-key", "userdata": "/user-data",
}
GCE_KEYS = {"hostname": "/instance/hostname", "zone": "/instance/zone",
            "ipv4-public": "/instance/network-interfaces/0/access-configs/0/external-ip",
            "userdata-base": "/instance/attributes/systemd-userdata"}
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGm4lmVbnEdFHXi8Ak9zfDkmw2W8HzqQvGvR7DZFfjIs guest@lab"
CREDENTIALS = {"systemd.credentials": [{"name": "demo.greeting", "text": "hello from imds"}]}


def privileged_port(source: str) -> int:
    """A free source port below 1024 on ``source`` (imdsd's requests leave from one: only root may bind them)."""
    for port in range(600, 1024):
        with socket.socket() as probe:
            try:
                probe.bind((source, port))
            except OSError:
                continue
            return port
    pytest.fail("no free port below 1024 on the guest's address")


def request(server: Server, method: str, path: str, headers: dict[str, str] | None = None,
            source: str = GUEST) -> tuple[int, bytes, dict[str, str]]:
    """One request as imdsd makes it (a new connection from a privileged port)."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10, source_address=(source, privileged_port(source)))
    try:
        conn.request(method, path, headers=headers or {})
        answer = conn.getresponse()
        return answer.status, answer.read(), {k.lower(): v for k, v in answer.getheaders()}
    finally:
        conn.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp: Path = tmp_path_factory.mktemp("systemd-imds")
    with serving(tmp, "--imdsv2", "required", "--db", f"sqlite:///{tmp / 'imds.db'}") as running:
        for ip, v6 in ((GUEST, "2001:db8:91::7"), (OTHER, None)):
            instance_id = new_id()
            addresses = [{"address": ip, "address_family": 4, "public": False},
                         {"address": "198.51.100.7", "address_family": 4, "public": True}]
            if v6:
                addresses.append({"address": v6, "address_family": 6, "public": True})
            document = {"id": instance_id, "hostname": "sd-guest.example", "facility": "da11", "ssh_keys": [KEY],
                        "network": {"addresses": addresses},
                        "attributes": {"systemd-userdata": json.dumps(CREDENTIALS)}}
            running.post("/device-metadata", {"id": instance_id, "ipAddresses": [ip], "metadata": document})
            running.post("/device-userdata", {"id": instance_id, "ipAddresses": [ip], "userdata": json.dumps(
                CREDENTIALS), "userdata_encoding": "text"})
        yield running


def token(server: Server, source: str = GUEST) -> str:
    status, body, headers = request(server, "PUT", "/latest/api/token", {TTL_HEADER: "900"}, source)
    assert (status, headers[TTL_HEADER.lower()]) == (200, "900")
    return body.decode()


def test_every_ec2_key_systemd_reads_answers(server):
    """A 900 s token, then each well-known key: 200 with the value (ipv6 included), no trailing newline."""
    v2 = token(server)
    found = {}
    for name, key in EC2_KEYS.items():
        status, body, headers = request(server, "GET", f"/latest{key}", {TOKEN_HEADER: v2})
        assert status == 200, (name, status, body)
        assert 0 < int(headers[TTL_HEADER.lower()]) <= 900
        found[name] = body.decode()
    assert found == {"hostname": "sd-guest.example", "region": "da1", "zone": "da11", "ipv4-public": "198.51.100.7",
                     "ipv6-public": "2001:db8:91::7", "ssh-key": KEY, "userdata": json.dumps(CREDENTIALS)}
    listing = request(server, "GET", "/latest/meta-data/", {TOKEN_HEADER: v2})[1].decode().splitlines()
    assert "ipv6" in listing


def test_a_key_the_instance_lacks_is_a_404_not_an_error_systemd_gives_up_on(server):
    """No IPv6 address: /meta-data/ipv6 is 404 (systemd: key not found) and is not listed."""
    v2 = token(server, OTHER)
    assert request(server, "GET", "/latest/meta-data/ipv6", {TOKEN_HEADER: v2}, OTHER)[0] == 404
    assert "ipv6" not in request(server, "GET", "/latest/meta-data/", {TOKEN_HEADER: v2}, OTHER)[1].decode()


@pytest.mark.parametrize("bad", ["", "garbage", "a.b", "eyJ4IjoxfQ.AAAA"])
def test_a_bad_token_is_401_never_403(server, bad):
    """Malformed, forged or empty: 401 (systemd asks for a new token); a 403 would end IMDS for the boot."""
    for key in EC2_KEYS.values():
        status, _body, headers = request(server, "GET", f"/latest{key}", {TOKEN_HEADER: bad})
        assert status == 401, (key, status)
        assert TTL_HEADER.lower() not in headers


def test_another_instances_token_is_401_and_a_new_token_reads_again(server):
    """A token minted for another instance is 401; imdsd then asks again, and the new token reads."""
    theirs = token(server, OTHER)
    assert request(server, "GET", "/latest/meta-data/hostname", {TOKEN_HEADER: theirs})[0] == 401
    mine = token(server)
    assert request(server, "GET", "/latest/meta-data/hostname", {TOKEN_HEADER: mine})[0] == 200


def test_every_gce_key_systemd_reads_answers(server):
    """GCE's entry: Metadata-Flavor: Google, no token; its userdata under attributes/systemd-userdata."""
    google = {"Metadata-Flavor": "Google"}
    found = {}
    for name, key in GCE_KEYS.items():
        status, body, _headers = request(server, "GET", f"/computeMetadata/v1{key}", google)
        assert status == 200, (name, status, body)
        found[name] = body.decode()
    assert found["hostname"] == "sd-guest.example"
    assert found["zone"].endswith("/zones/da11")
    assert found["ipv4-public"] == "198.51.100.7"
    assert json.loads(found["userdata-base"]) == CREDENTIALS
    assert request(server, "GET", "/computeMetadata/v1/instance/hostname")[0] == 403  # GCE's own rule: no header
