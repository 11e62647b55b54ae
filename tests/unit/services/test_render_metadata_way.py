"""The one rule for the way to metadata in every derived network: DHCP when the subnet has it, else a host route."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from imds.models import Instance
from imds.services.records.shape import check_shape
from imds.services.render.metadata_way import metadata_route, way_problem
from imds.services.render.network import derived_network_data, network_config_v2, network_data
from imds.services.render.nocloud import nocloud_tree
from imds.services.render.openstack import version_dir

MAC = "52:54:00:12:34:56"
V4 = {"network": "169.254.169.254", "netmask": "255.255.255.255"}
V6 = {"network": "fd00:ec2::254", "netmask": "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}


def record(*addresses: dict[str, Any], **network: Any) -> dict[str, Any]:
    return {"id": "i-1", "hostname": "h",
            "network": {"interfaces": [{"name": "eth0", "mac": MAC}], "addresses": list(addresses), **network}}


def lab(**extra: Any) -> dict[str, Any]:
    """The lab's guest: one private address on a /24, no gateway."""
    return {"address": "10.231.0.10", "cidr": 24, "address_family": 4, "public": False, **extra}


def routes(doc: dict[str, Any]) -> list[list[dict[str, str]]]:
    return [n.get("routes") for n in derived_network_data(doc)["networks"]]


def test_a_static_address_without_gateway_keeps_metadata_on_link():
    """Nothing said, no gateway: a host route to 169.254.169.254 with no next hop (0.0.0.0, as option 121 writes)."""
    assert routes(record(lab())) == [[{**V4, "gateway": "0.0.0.0"}]]  # noqa: S104 - a route's next hop


def test_an_address_with_a_gateway_reaches_metadata_through_it():
    """Nothing said, a gateway: the route goes via the gateway (where the boot's default route sent it)."""
    got = routes(record(lab(gateway="10.231.0.254")))
    assert got == [[{"network": "10.0.0.0", "netmask": "255.0.0.0", "gateway": "10.231.0.254"},
                    {**V4, "gateway": "10.231.0.254"}]]


@pytest.mark.parametrize(("way", "hop"), [("onlink", "0.0.0.0"), ("gateway", "10.231.0.254"),  # noqa: S104
                                          ("10.231.0.1", "10.231.0.1")])
def test_what_the_record_says_wins(way, hop):
    """metadata_route on the address: on-link, via its gateway, or via a named hop (the DHCP port)."""
    got = routes(record(lab(gateway="10.231.0.254", metadata_route=way)))
    assert got[0][-1] == {**V4, "gateway": hop}
    assert sum(r["network"] == V4["network"] for r in got[0]) == 1


def test_the_network_level_way_applies_to_every_address_that_says_none():
    """network.metadata_route is the default; an address's own wins over it."""
    assert routes(record(lab(), metadata_route="10.231.0.1"))[0] == [{**V4, "gateway": "10.231.0.1"}]
    own = record(lab(metadata_route="onlink"), metadata_route="10.231.0.1")
    assert routes(own)[0] == [{**V4, "gateway": "0.0.0.0"}]  # noqa: S104


def test_one_route_per_family_on_the_address_that_names_the_way():
    """Two IPv4 addresses: the route goes once, on the one naming metadata_route (else on the first)."""
    first, second = lab(), {"address": "10.231.1.10", "cidr": 24, "metadata_route": "10.231.1.1"}
    got = routes(record(first, second))
    assert got == [[], [{**V4, "gateway": "10.231.1.1"}]]
    assert routes(record(lab(), {"address": "10.231.1.10", "cidr": 24})) == [[{**V4, "gateway": "0.0.0.0"}], []]  # noqa: S104


def test_ipv6_static_addresses_keep_the_ipv6_metadata_address():
    """fd00:ec2::254 on-link, via the IPv6 gateway, or a named hop; once for the family; IPv4 untouched."""
    slaac = {"address": "fd00:231::5054:ff:fe12:3456", "cidr": 64, "address_family": 6}
    dhcpv6 = {"address": "fd00:231::10", "cidr": 64, "address_family": 6}
    assert routes(record(slaac, dhcpv6)) == [[{**V6, "gateway": "::"}], []]
    assert routes(record({**slaac, "gateway": "fd00:231::1"}))[0][-1] == {**V6, "gateway": "fd00:231::1"}
    assert routes(record(slaac, {**dhcpv6, "metadata_route": "fd00:231::1"}))[1] == [{**V6, "gateway": "fd00:231::1"}]


def test_a_subnet_with_dhcp_says_dhcp_as_nova_does():
    """dhcp: true → ipv4_dhcp / ipv6_dhcp (one per family), no address and no route: DHCP gives the way again."""
    doc = record(lab(dhcp=True, id="net-1"), {"address": "fd00:231::10", "cidr": 64, "dhcp": True},
                 {"address": "fd00:231::11", "cidr": 64, "dhcp": True})
    assert derived_network_data(doc)["networks"] == [
        {"id": "network0", "type": "ipv4_dhcp", "link": "eth0", "network_id": "net-1"},
        {"id": "network1", "type": "ipv6_dhcp", "link": "eth0"},
    ]
    v2 = network_config_v2(network_data(doc))
    assert v2 is not None
    assert v2["ethernets"]["eth0"] == {"match": {"macaddress": MAC}, "set-name": "eth0", "dhcp4": True, "dhcp6": True}


def test_dhcp_on_one_family_leaves_the_other_its_static_route():
    """IPv4 by DHCP, IPv6 static: the IPv6 network still gets fd00:ec2::254."""
    doc = record(lab(dhcp=True), {"address": "fd00:231::10", "cidr": 64})
    assert routes(doc) == [None, [{**V6, "gateway": "::"}]]


def test_a_records_own_network_data_is_served_as_given():
    """No route is added to network_data the record carries itself."""
    given = {"links": [{"id": "eth0", "type": "phy", "ethernet_mac_address": MAC}],
             "networks": [{"id": "n0", "type": "ipv4", "link": "eth0", "ip_address": "10.231.0.10",
                           "netmask": "255.255.255.0", "routes": []}], "services": []}
    assert network_data({**record(lab()), "network_data": given}) == given


def test_every_view_carries_the_same_route():
    """network_data.json (metadata service and config drive) and NoCloud's network-config say the same way."""
    instance = Instance(id="i-1", metadata=record(lab(metadata_route="10.231.0.1")))
    served = version_dir(instance, "latest")
    assert b'"network":"169.254.169.254","netmask":"255.255.255.255","gateway":"10.231.0.1"' in bytes(
        served.get("network_data.json"))  # type: ignore[arg-type]
    config = yaml.safe_load(bytes(nocloud_tree(instance).get("network-config")))  # type: ignore[arg-type]
    assert config["ethernets"]["eth0"]["routes"] == [{"to": "169.254.169.254/32", "via": "10.231.0.1"}]
    assert config["ethernets"]["eth0"]["addresses"] == ["10.231.0.10/24"]


def test_a_way_the_render_cannot_use_falls_back_to_the_default():
    """A record stored before the checks (a wrong family, a word): the default way, never an error."""
    assert metadata_route(lab(metadata_route="fd00::1"), {}, v6=False) == {**V4, "gateway": "0.0.0.0"}  # noqa: S104
    assert metadata_route(lab(metadata_route=7, gateway="10.231.0.254"), {}, v6=False)["gateway"] == "10.231.0.254"
    assert metadata_route(lab(metadata_route="gateway"), {}, v6=False)["gateway"] == "0.0.0.0"  # noqa: S104


def test_the_write_checks_name_each_wrong_field():
    """check_shape: dhcp must be a boolean, metadata_route a known way or an address of the family."""
    doc = record(lab(dhcp="yes"), lab(metadata_route="gateway"), lab(metadata_route="fd00::1"),
                 lab(metadata_route="10.231.0.1", dhcp=False), metadata_route="nowhere")
    found = {p.field: p.message for p in check_shape(doc)}
    assert set(found) == {"metadata.network.metadata_route", "metadata.network.addresses[0].dhcp",
                          "metadata.network.addresses[1].metadata_route",
                          "metadata.network.addresses[2].metadata_route"}
    assert "has no gateway" in found["metadata.network.addresses[1].metadata_route"]
    assert way_problem("onlink", v6=True, gateway=None) is None


def test_an_address_naming_its_interface_lives_on_that_nic():
    """A second NIC (added while the guest runs) carries its own address; the metadata route stays on the first."""
    doc = record(lab(metadata_route="10.231.0.1"), {"address": "10.231.1.10", "cidr": 24, "interface": "eth1"})
    doc["network"]["interfaces"].append({"name": "eth1", "mac": "52:54:00:12:34:57"})
    networks = derived_network_data(doc)["networks"]
    assert [(n["link"], n["ip_address"], n["routes"]) for n in networks] == [
        ("eth0", "10.231.0.10", [{**V4, "gateway": "10.231.0.1"}]), ("eth1", "10.231.1.10", [])]
    unknown = record({"address": "10.231.1.10", "cidr": 24, "interface": "eth9"})
    assert derived_network_data(unknown)["networks"][0]["link"] == "eth0"  # no such NIC: the carrier
