"""network_data.json derived from the Equinix network section, network config v2, and the NoCloud files."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from helpers import fixture_json
from imds.models import Instance
from imds.services.render.network import derived_network_data, network_config_v2, network_data
from imds.services.render.nocloud import nocloud_tree

SEED = fixture_json("metadata-example.json")


def seed(**changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(SEED)
    doc.update(changes)
    return doc


def test_the_seed_network_becomes_a_bond_with_static_networks_and_routes():
    """Two bonded NICs → two phy links + bond0 (802.3ad); three addresses on bond0 with netmasks and routes."""
    data = derived_network_data(SEED)
    assert data["links"] == [
        {"id": "eth0", "name": "eth0", "type": "phy", "ethernet_mac_address": "40:a6:b7:74:9f:10"},
        {"id": "eth1", "name": "eth1", "type": "phy", "ethernet_mac_address": "40:a6:b7:74:9f:11"},
        {"id": "bond0", "name": "bond0", "type": "bond", "bond_links": ["eth0", "eth1"], "bond_mode": "802.3ad",
         "bond_miimon": 100, "ethernet_mac_address": "40:a6:b7:74:9f:10", "bond_xmit_hash_policy": "layer3+4"},
    ]
    assert [(n["type"], n["ip_address"], n["netmask"], n["link"]) for n in data["networks"]] == [
        ("ipv4", "40.91.78.229", "255.255.255.254", "bond0"),
        ("ipv6", "2001:0db8:8583:0000::9", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe", "bond0"),
        ("ipv4", "10.70.17.9", "255.255.255.254", "bond0"),
    ]
    assert [n["routes"] for n in data["networks"]] == [
        [{"network": "0.0.0.0", "netmask": "0.0.0.0", "gateway": "40.91.78.228"},  # noqa: S104 - a route
         {"network": "169.254.169.254", "netmask": "255.255.255.255", "gateway": "40.91.78.228"}],  # metadata
        [{"network": "::", "netmask": "::", "gateway": "2001:0db8:8583:0000::8"},
         {"network": "fd00:ec2::254", "netmask": "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
          "gateway": "2001:0db8:8583:0000::8"}],
        [{"network": "10.0.0.0", "netmask": "255.0.0.0", "gateway": "10.70.17.8"}],  # private_subnets
    ]
    assert data["networks"][0]["network_id"] == "b9c60623-78e0-4010-91ee-f29b23579170"
    assert data["services"] == []


def test_without_bonds_addresses_go_on_the_bonding_mac_and_dns_becomes_services():
    """Unbonded NICs: addresses go on the bonding MAC's NIC; network.dns → dns services; disabled addresses skipped."""
    network = copy.deepcopy(SEED["network"])
    for nic in network["interfaces"]:
        del nic["bond"]
    network["bonding"]["mac"] = "40:a6:b7:74:9f:11"
    network["dns"] = ["147.75.207.207", "2001:4860:4860::8888"]
    network["addresses"][1]["enabled"] = False
    data = derived_network_data(seed(network=network, private_subnets=["10.0.0.0/8", "192.168.0.0/16"]))
    assert [link["type"] for link in data["links"]] == ["phy", "phy"]
    assert {n["link"] for n in data["networks"]} == {"eth1"}
    assert len(data["networks"]) == 2
    assert data["networks"][1]["routes"] == [
        {"network": "10.0.0.0", "netmask": "255.0.0.0", "gateway": "10.70.17.8"},
        {"network": "192.168.0.0", "netmask": "255.255.0.0", "gateway": "10.70.17.8"},
    ]
    assert data["services"] == [{"type": "dns", "address": "147.75.207.207"},
                                {"type": "dns", "address": "2001:4860:4860::8888"}]


def test_no_network_section_gives_empty_lists_and_explicit_network_data_wins():
    """No network → empty links/networks/services; a network_data part is served as given."""
    assert network_data({}) == {"links": [], "networks": [], "services": []}
    given = {"links": [{"id": "tap1", "type": "ovs", "ethernet_mac_address": "fa:16:3e:00:00:01"}],
             "networks": [{"id": "n", "type": "ipv4_dhcp", "link": "tap1"}], "services": []}
    assert network_data(seed(network_data=given)) is given


def test_network_config_v2_of_the_seed():
    """The derived bond becomes netplan-style v2: ethernets matched by MAC, bond0 with parameters, addresses, routes."""
    v2 = network_config_v2(network_data(SEED))
    assert v2 == {
        "version": 2,
        "ethernets": {
            "eth0": {"match": {"macaddress": "40:a6:b7:74:9f:10"}, "set-name": "eth0"},
            "eth1": {"match": {"macaddress": "40:a6:b7:74:9f:11"}, "set-name": "eth1"},
        },
        "bonds": {
            "bond0": {
                "interfaces": ["eth0", "eth1"],
                "parameters": {"mode": "802.3ad", "mii-monitor-interval": 100, "transmit-hash-policy": "layer3+4"},
                "macaddress": "40:a6:b7:74:9f:10",
                "addresses": ["40.91.78.229/31", "2001:0db8:8583:0000::9/127", "10.70.17.9/31"],
                "routes": [{"to": "0.0.0.0/0", "via": "40.91.78.228"},
                           {"to": "169.254.169.254/32", "via": "40.91.78.228"},
                           {"to": "::/0", "via": "2001:0db8:8583:0000::8"},
                           {"to": "fd00:ec2::254/128", "via": "2001:0db8:8583:0000::8"},
                           {"to": "10.0.0.0/8", "via": "10.70.17.8"}],
            },
        },
    }


def test_network_config_v2_of_explicit_network_data_with_dhcp_vlan_and_dns():
    """OpenStack links (phy + vlan), a DHCP network, a static one and DNS services map onto v2 sections."""
    data = {
        "links": [{"id": "tap1", "type": "ovs", "ethernet_mac_address": "FA:16:3E:00:00:01", "mtu": 9000},
                  {"id": "vlan5", "type": "vlan", "vlan_link": "tap1", "vlan_id": 5,
                   "vlan_mac_address": "fa:16:3e:00:00:02"}],
        "networks": [{"id": "n0", "type": "ipv4_dhcp", "link": "tap1"},
                     {"id": "n1", "type": "ipv4", "link": "vlan5", "ip_address": "10.5.0.4", "netmask": "255.255.255.0",
                      "routes": []}],
        "services": [{"type": "dns", "address": "10.5.0.1"}],
    }
    assert network_config_v2(data) == {
        "version": 2,
        "ethernets": {"tap1": {"match": {"macaddress": "fa:16:3e:00:00:01"}, "set-name": "tap1", "mtu": 9000,
                               "dhcp4": True}},
        "vlans": {"vlan5": {"id": 5, "link": "tap1", "macaddress": "fa:16:3e:00:00:02", "addresses": ["10.5.0.4/24"],
                            "nameservers": {"addresses": ["10.5.0.1"]}}},
    }
    assert network_config_v2({"links": []}) is None


def test_nocloud_files():
    """meta-data is YAML (id, hostname, keys); user-data always exists; vendor-data is vendor_data's cloud-init."""
    doc = seed(vendor_data={"cloud-init": "#cloud-config\npackages: [htop]\n", "other": 1})
    tree = nocloud_tree(Instance(id=SEED["id"], metadata=doc))
    assert list(tree) == ["meta-data", "user-data", "vendor-data", "network-config"]
    assert yaml.safe_load(tree["meta-data"]) == {
        "instance-id": SEED["id"], "local-hostname": "metadata-example-01", "public-keys": SEED["ssh_keys"],
    }
    assert tree["meta-data"].count(b"\n") == 5  # one line per key, no folding of long keys
    assert tree["user-data"] == b""
    assert tree["vendor-data"] == b"#cloud-config\npackages: [htop]\n"
    assert yaml.safe_load(tree["network-config"]) == network_config_v2(network_data(doc))
    bare = nocloud_tree(Instance(id=SEED["id"], metadata={"hostname": "h"}, userdata=b"#!/bin/sh\n"))
    assert list(bare) == ["meta-data", "user-data", "vendor-data"]
    assert (bare["user-data"], bare["vendor-data"]) == (b"#!/bin/sh\n", b"")


def test_network_config_v2_ignores_a_network_whose_link_is_not_a_string():
    """A list or object as a network's ``link`` (explicit network_data) is skipped, never a TypeError."""
    data = {"links": [{"id": "eth0", "type": "phy", "ethernet_mac_address": "fa:16:3e:00:00:01"}],
            "networks": [{"id": "n0", "link": ["eth0"], "type": "ipv4_dhcp"},
                         {"id": "n1", "link": {"id": "eth0"}, "type": "ipv4_dhcp"},
                         {"id": "n2", "link": "eth0", "type": "ipv4_dhcp"}]}
    config = network_config_v2(data)
    assert config is not None
    assert config["ethernets"]["eth0"]["dhcp4"] is True
