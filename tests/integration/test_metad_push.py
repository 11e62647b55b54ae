"""A Ganeti push through ``--ganeti-metad-socket``: one transaction, visibilities pinned, the NICs as the network.

- The instance and its OS record are stored together or not at all: with OS definitions
  loaded a refused OS record leaves no instance record, and a database that refuses the OS
  row half-way (a trigger) leaves neither, nor the new secrets in the vault.
- A parameter name given in two sections keeps the most protected visibility.
- The NICs (MAC, IP, mode, link, network) become the record's network: OpenStack
  ``network_data.json``, NoCloud ``network-config`` and EC2's ``macs`` describe them.
"""

from __future__ import annotations

import copy
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from helpers import admin_client, client_from, make_settings, running_app
from imds.metad.convert import convert
from imds.metad.luxi import serving
from imds.web.instance import InstanceFront
from luxi_client import IP, instance, update

pytestmark = pytest.mark.anyio
EXAMPLES = Path(__file__).parents[2] / "examples" / "ganeti-os"  # one OS, "tiny", declaring four parameters


@pytest.fixture
async def metad(tmp_path: Path, sqlite_url: str) -> AsyncIterator[tuple[InstanceFront, Path, str]]:
    """The app on SQLite with the example OS definitions loaded, serving the Luxi socket."""
    path = tmp_path / "metad.sock"
    settings = make_settings(db=sqlite_url, ganeti_metad_socket=path, os_definitions_dir=EXAMPLES)
    async with running_app(settings) as app, serving(app.services):
        yield app, path, sqlite_url


def tiny(**changes: Any) -> dict[str, Any]:
    """A push of the example OS with parameters it declares."""
    base = instance(os="tiny", osparams={"hostname": "vm1"}, osparams_private={"root-hash": "private-hash"},
                    osparams_secret={"root-password": "first-secret"})
    return {**base, **changes}


def rows(url: str, table: str) -> int:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        count = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # noqa: S608 - the test's own names
    conn.close()
    return int(count)


async def parameters(app: InstanceFront) -> Any:
    async with client_from(app, IP) as guest:
        answer = await guest.get("/ganeti/latest/os/parameters.json")
    return answer.json() if answer.status_code == 200 else answer.status_code


@pytest.mark.parametrize(("changes", "problem"), [
    ({"os": "no-such-os"}, "os_type"),
    ({"osparams": {"hostname": "vm1", "undeclared": "x"}}, "undeclared"),
])
async def test_with_definitions_loaded_a_refused_os_record_leaves_no_instance_record(metad, changes, problem):
    """The OS record is checked against the definitions before anything is written: no instance either."""
    app, path, url = metad
    answer = await update(path, tiny(**changes))
    assert answer["success"] is False
    assert problem in answer["result"][1][0]
    assert (rows(url, "instances"), rows(url, "instance_metadata"), rows(url, "audit_log")) == (0, 0, 0)
    assert len(app.services.catalog) == 0


async def test_a_database_that_refuses_the_os_record_leaves_no_instance_record(metad):
    """One transaction: the OS row fails after the instance's were written, so neither stays (nor the audit)."""
    app, path, url = metad
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON instance_os BEGIN "
                     "SELECT RAISE(ABORT, 'refused by the test'); END")
    conn.close()
    answer = await update(path, tiny())
    assert answer["success"] is False
    assert "refused by the test" in answer["result"][1][0]
    assert (rows(url, "instances"), rows(url, "instance_metadata"), rows(url, "instance_ip_addresses"),
            rows(url, "changes"), rows(url, "audit_log")) == (0, 0, 0, 0, 0)
    assert len(app.services.catalog) == 0
    async with client_from(app, IP) as guest:
        assert (await guest.get("/metadata")).status_code == 404


async def test_a_failed_push_keeps_the_secrets_of_the_record_that_stays(metad):
    """A second push that the database refuses leaves the first record and the secret it came with."""
    app, path, url = metad
    first = tiny()
    assert await update(path, first) == {"success": True, "result": []}
    assert (await parameters(app))["root-password"] == ["first-secret", "secret"]
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        conn.execute("CREATE TRIGGER refuse BEFORE UPDATE ON instance_os BEGIN "
                     "SELECT RAISE(ABORT, 'refused by the test'); END")
    conn.close()
    second = {**first, "name": "vm1-renamed", "osparams_secret": {"root-password": "second-secret"}}
    answer = await update(path, second)
    assert answer["success"] is False
    assert (await parameters(app))["root-password"] == ["first-secret", "secret"]
    async with admin_client(app) as admin:
        record = (await admin.get(f"/device-records/{first['uuid']}")).json()
    assert record["metadata"]["hostname"] == first["name"]  # the instance record did not move on alone


@pytest.mark.parametrize(("sections", "expected"), [
    (("osparams", "osparams_private", "osparams_secret"), "secret"),
    (("osparams", "osparams_private"), "private"),
    (("osparams_private", "osparams_secret"), "secret"),
    (("osparams", "osparams_secret"), "secret"),
    (("osparams",), "public"),
])
def test_a_name_in_two_sections_keeps_the_most_protected_visibility(sections, expected):
    """Secret beats private beats public, whatever order the push lists the sections in."""
    for order in (sections, tuple(reversed(sections))):
        pushed = {"name": "vm1", "uuid": "9b1deb4d-3b7d-4bad-9bdd-2b0d7b3dcb6d", "os": "tiny",
                  "nics": [{"name": "ganeti:communication:x", "ip": IP}]}
        pushed.update({section: {"shared": f"from-{section}"} for section in order})
        converted = convert(pushed)
        assert converted.os is not None
        assert converted.os["parameters"]["shared"]["visibility"] == expected, order
        source = {"public": "osparams", "private": "osparams_private", "secret": "osparams_secret"}[expected]
        assert converted.os["parameters"]["shared"]["value"] == f"from-{source}"


NICS = [
    {"name": "eth-data", "mac": "AA:00:00:11:22:33", "ip": "192.0.2.10", "network": "net-uuid-1",
     "nicparams": {"mode": "bridged", "link": "br0"},
     "netinfo": {"name": "data", "network": "192.0.2.0/24", "gateway": "192.0.2.1",
                 "network6": "2001:db8:10::/64", "gateway6": "2001:db8:10::1"}},
    {"name": "ganeti:communication:x", "mac": "aa:00:00:11:22:44", "ip": IP,
     "nicparams": {"mode": "routed", "link": "gnt-com"}},
    {"name": "eth-spare", "mac": "aa:00:00:11:22:55"},
]


def test_the_nics_become_the_record_network():
    """Each NIC with a MAC is an interface (eth<n>); each IP an address on it, static in its Ganeti network."""
    document = convert(instance(nics=copy.deepcopy(NICS))).metadata
    assert document is not None
    network = document["metadata"]["network"]
    assert network["interfaces"] == [
        {"name": "eth0", "mac": "aa:00:00:11:22:33", "mode": "bridged", "link": "br0", "network": "net-uuid-1",
         "ganeti_name": "eth-data"},
        {"name": "eth1", "mac": "aa:00:00:11:22:44", "mode": "routed", "link": "gnt-com",
         "ganeti_name": "ganeti:communication:x"},
        {"name": "eth2", "mac": "aa:00:00:11:22:55", "ganeti_name": "eth-spare"},
    ]
    assert network["addresses"] == [
        {"address": "192.0.2.10", "address_family": 4, "interface": "eth0", "public": False, "cidr": 24,
         "netmask": "255.255.255.0", "network": "192.0.2.0", "gateway": "192.0.2.1"},
        {"address": IP, "address_family": 4, "interface": "eth1", "public": False, "dhcp": True},
    ]


async def test_every_flavor_describes_the_pushed_nics(metad):
    """network_data.json, NoCloud's network-config and EC2's macs name each NIC by its MAC, with its address."""
    app, path, _ = metad
    assert await update(path, tiny(nics=copy.deepcopy(NICS))) == {"success": True, "result": []}
    async with client_from(app, IP) as guest:
        data = (await guest.get("/openstack/latest/network_data.json")).json()
        config = yaml.safe_load((await guest.get("/nocloud/network-config")).text)
        macs = (await guest.get("/latest/meta-data/network/interfaces/macs/")).text.split()
        local = (await guest.get("/latest/meta-data/network/interfaces/macs/aa:00:00:11:22:33/local-ipv4s")).text
    assert [(link["id"], link["ethernet_mac_address"]) for link in data["links"]] == [
        ("eth0", "aa:00:00:11:22:33"), ("eth1", "aa:00:00:11:22:44"), ("eth2", "aa:00:00:11:22:55")]
    static = [n for n in data["networks"] if n.get("ip_address") == "192.0.2.10"]
    assert [(n["link"], n["netmask"]) for n in static] == [("eth0", "255.255.255.0")]
    assert [n["type"] for n in data["networks"] if n["link"] == "eth1"] == ["ipv4_dhcp"]
    ethernets = config["ethernets"]
    assert ethernets["eth0"]["match"] == {"macaddress": "aa:00:00:11:22:33"}
    assert ethernets["eth0"]["addresses"] == ["192.0.2.10/24"]
    assert ethernets["eth1"].get("dhcp4") is True
    assert macs == ["aa:00:00:11:22:33/", "aa:00:00:11:22:44/", "aa:00:00:11:22:55/"]
    assert "192.0.2.10" in local.split()  # EC2's macs give every address to the first MAC (render/ec2.py)
