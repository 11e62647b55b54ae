"""Network configuration views: OpenStack ``network_data.json`` and cloud-init network config v2.

``network_data`` is the document's own ``network_data`` part when it has one; otherwise it
is derived from the Equinix ``network`` section:

- ``links``: one ``phy`` link per ``network.interfaces`` entry (``id`` and ``name``: the
  interface's ``name``; ``ethernet_mac_address``: its ``mac``), and one ``bond`` link per
  bond the interfaces name (``bond_links``: its members; ``bond_mode`` from
  ``network.bonding.mode`` 0-6 as the Linux name, ``802.3ad`` for 4; MAC: ``bonding.mac``).
- ``networks``: one static ``ipv4``/``ipv6`` network per ``network.addresses`` entry
  (``enabled: false`` skipped), on the interface its ``interface`` names (a NIC of its own),
  else on the bond, else the bonding MAC's or the first interface;
  ``netmask`` from ``cidr`` (else ``netmask``). ``routes``: a default route via the
  ``gateway`` for a public (or IPv6) address; for a private one, one route per
  ``private_subnets`` entry (default ``10.0.0.0/8``); and the route to the metadata
  address, or ``ipv4_dhcp``/``ipv6_dhcp`` for a subnet with DHCP: the rule in
  ``imds.services.render.metadata_way``.
- ``services``: ``{"type": "dns", "address": …}`` per ``network.dns`` (or
  ``network.nameservers``) entry.

``network_config_v2`` turns either form into what NoCloud's ``network-config`` carries.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from imds.models import JsonObject
from imds.services.render.fields import as_list, as_object
from imds.services.render.metadata_way import metadata_route, names_way, subnet_has_dhcp

BOND_MODES = {0: "balance-rr", 1: "active-backup", 2: "balance-xor", 3: "broadcast", 4: "802.3ad",
              5: "balance-tlb", 6: "balance-alb"}
_HASHED_MODES = frozenset({"802.3ad", "balance-xor"})
_DEFAULT_PRIVATE = ("10.0.0.0/8",)


def network_data(doc: JsonObject) -> JsonObject:
    """``network_data.json``: the document's own part, else derived from ``network``."""
    given = doc.get("network_data")
    if isinstance(given, dict):
        return given
    return derived_network_data(doc)


def derived_network_data(doc: JsonObject) -> JsonObject:
    """``network_data.json`` built from the Equinix ``network`` section (empty lists when there is none)."""
    network = as_object(doc.get("network"))
    nics = [n for n in as_list(network.get("interfaces")) if isinstance(n, dict) and isinstance(n.get("mac"), str)]
    links: list[JsonObject] = []
    bonds: dict[str, list[str]] = {}
    for index, nic in enumerate(nics):
        name = str(nic.get("name") or f"eth{index}")
        link: JsonObject = {"id": name, "name": name, "type": "phy", "ethernet_mac_address": nic["mac"].lower()}
        if isinstance(nic.get("mtu"), int):
            link["mtu"] = nic["mtu"]
        links.append(link)
        if isinstance(nic.get("bond"), str) and nic["bond"]:
            bonds.setdefault(nic["bond"], []).append(name)
    bonding = as_object(network.get("bonding"))
    for bond, members in bonds.items():
        links.append(_bond_link(bond, members, bonding, links))
    carrier = _carrier(links, bonds, bonding)
    networks = [] if carrier is None else _networks(doc, network, carrier, {str(link["id"]) for link in links})
    dns = as_list(network.get("dns")) or as_list(network.get("nameservers"))
    services = [{"type": "dns", "address": a} for a in dns if isinstance(a, str) and a]
    return {"links": links, "networks": networks, "services": services}


def _bond_link(bond: str, members: list[str], bonding: JsonObject, links: list[JsonObject]) -> JsonObject:
    mode = bonding.get("mode")
    mode_name = BOND_MODES.get(mode, str(mode)) if isinstance(mode, int) else str(mode or "802.3ad")
    member_macs = [link["ethernet_mac_address"] for link in links if link["id"] in members]
    mac = bonding.get("mac") if isinstance(bonding.get("mac"), str) else member_macs[0]
    link: JsonObject = {
        "id": bond, "name": bond, "type": "bond", "bond_links": members, "bond_mode": mode_name,
        "bond_miimon": 100, "ethernet_mac_address": str(mac).lower(),
    }
    if mode_name in _HASHED_MODES:
        link["bond_xmit_hash_policy"] = "layer3+4"
    return link


def _carrier(links: list[JsonObject], bonds: dict[str, list[str]], bonding: JsonObject) -> str | None:
    """The link the addresses live on: the first bond, else the bonding MAC's interface, else the first."""
    if bonds:
        return next(iter(bonds))
    mac = str(bonding.get("mac") or "").lower()
    for link in links:
        if link["ethernet_mac_address"] == mac:
            return str(link["id"])
    return str(links[0]["id"]) if links else None


def _networks(doc: JsonObject, network: JsonObject, carrier: str, link_ids: set[str]) -> list[JsonObject]:
    private = [s for s in as_list(doc.get("private_subnets")) if isinstance(s, str)] or list(_DEFAULT_PRIVATE)
    networks: list[JsonObject] = []
    dhcp: set[tuple[str, int]] = set()  # (link, family) already said to use DHCP (one network each, as Nova's)
    statics: dict[int, list[tuple[JsonObject, JsonObject]]] = {4: [], 6: []}  # family -> (address, network)
    for item in as_list(network.get("addresses")):
        if not isinstance(item, dict) or not isinstance(item.get("address"), str) or item.get("enabled") is False:
            continue
        try:
            address = ipaddress.ip_address(item["address"])
        except ValueError:
            continue
        v6 = address.version == 6
        link = item["interface"] if item.get("interface") in link_ids else carrier  # a NIC of its own
        if subnet_has_dhcp(item):
            if (link, address.version) not in dhcp:
                dhcp.add((link, address.version))
                networks.append(_network_id(item, {"id": f"network{len(networks)}",
                                                   "type": f"ipv{address.version}_dhcp", "link": link}))
            continue
        entry: JsonObject = {
            "id": f"network{len(networks)}",
            "type": "ipv6" if v6 else "ipv4",
            "link": link,
            "ip_address": item["address"],
            "netmask": _netmask(item, v6),
            "routes": _routes(item, v6, private),
        }
        networks.append(_network_id(item, entry))
        statics[address.version].append((item, entry))
    for version, found in statics.items():
        if found and not any(family == version for _, family in dhcp):  # on the address naming it, else the first
            item, entry = next(((i, e) for i, e in found if names_way(i)), found[0])
            entry["routes"].append(metadata_route(item, network, v6=version == 6))
    return networks


def _network_id(item: JsonObject, entry: JsonObject) -> JsonObject:
    if isinstance(item.get("id"), str):
        entry["network_id"] = item["id"]
    return entry


def _netmask(item: JsonObject, v6: bool) -> str:
    cidr = item.get("cidr")
    if isinstance(cidr, int) and not isinstance(cidr, bool) and 0 <= cidr <= (128 if v6 else 32):
        return str(ipaddress.ip_network(f"{'::' if v6 else '0.0.0.0'}/{cidr}").netmask)  # noqa: S104
    return str(item.get("netmask") or ("ffff:ffff:ffff:ffff::" if v6 else "255.255.255.255"))


def _routes(item: JsonObject, v6: bool, private: list[str]) -> list[JsonObject]:
    gateway = item.get("gateway")
    if not isinstance(gateway, str) or not gateway:
        return []
    if item.get("public") is True or v6:
        anywhere = "::" if v6 else "0.0.0.0"  # noqa: S104 - a route destination, not a bind address
        return [{"network": anywhere, "netmask": anywhere, "gateway": gateway}]
    routes = []
    for subnet in private:
        try:
            net = ipaddress.ip_network(subnet, strict=False)
        except ValueError:
            continue
        if net.version == 4:
            routes.append({"network": str(net.network_address), "netmask": str(net.netmask), "gateway": gateway})
    return routes


# ----------------------------------------------------------------------------------------
# cloud-init network config v2 (NoCloud's network-config).


def network_config_v2(data: JsonObject) -> JsonObject | None:
    """Network config v2 from ``network_data.json``, or None when it describes no link."""
    links = [link for link in as_list(data.get("links")) if isinstance(link, dict) and isinstance(link.get("id"), str)]
    if not links:
        return None
    names = {link["id"]: str(link.get("name") or link["id"]) for link in links}
    sections: dict[str, dict[str, JsonObject]] = {"ethernets": {}, "bonds": {}, "vlans": {}}
    device: dict[str, JsonObject] = {}
    for link in links:
        section, entry = _device(link, names)
        sections[section][names[link["id"]]] = device[link["id"]] = entry
    for network in as_list(data.get("networks")):
        if isinstance(network, dict) and isinstance(network.get("link"), str) and network["link"] in device:
            _add_network(device[network["link"]], network)
    dns = [s["address"] for s in as_list(data.get("services"))
           if isinstance(s, dict) and s.get("type") == "dns" and isinstance(s.get("address"), str)]
    for entry in device.values():
        if dns and entry.get("addresses"):
            entry["nameservers"] = {"addresses": dns}
    return {"version": 2, **{key: value for key, value in sections.items() if value}}


def _device(link: JsonObject, names: dict[str, str]) -> tuple[str, JsonObject]:
    """(section, entry) of one link: ``ethernets``, ``bonds`` or ``vlans``."""
    mac = link.get("ethernet_mac_address") or link.get("vlan_mac_address")
    if link.get("type") == "bond":
        members = [m for m in as_list(link.get("bond_links")) if isinstance(m, str)]
        entry: JsonObject = {"interfaces": [names.get(m, m) for m in members],
                             "parameters": _bond_parameters(link)}
        section = "bonds"
    elif link.get("type") == "vlan":
        parent = str(link.get("vlan_link"))
        entry = {"id": link.get("vlan_id"), "link": names.get(parent, parent)}
        section = "vlans"
    else:
        entry = {"match": {"macaddress": str(mac).lower()}, "set-name": names[link["id"]]} if mac else {}
        section = "ethernets"
    if mac and section != "ethernets":
        entry["macaddress"] = str(mac).lower()
    if isinstance(link.get("mtu"), int):
        entry["mtu"] = link["mtu"]
    return section, entry


def _bond_parameters(link: JsonObject) -> JsonObject:
    parameters: JsonObject = {"mode": link.get("bond_mode", "802.3ad")}
    if isinstance(link.get("bond_miimon"), int):
        parameters["mii-monitor-interval"] = link["bond_miimon"]
    if isinstance(link.get("bond_xmit_hash_policy"), str):
        parameters["transmit-hash-policy"] = link["bond_xmit_hash_policy"]
    return parameters


def _add_network(entry: JsonObject, network: JsonObject) -> None:
    kind = network.get("type")
    if kind in ("ipv4_dhcp", "dhcp4"):
        entry["dhcp4"] = True
    elif kind in ("ipv6_dhcp", "ipv6_slaac", "ipv6_dhcpv6-stateless", "ipv6_dhcpv6-stateful", "dhcp6"):
        entry["dhcp6"] = True
    elif isinstance(network.get("ip_address"), str):
        prefix = _prefix(network.get("netmask"), network["ip_address"])
        entry.setdefault("addresses", []).append(f"{network['ip_address']}/{prefix}")
        for route in as_list(network.get("routes")):
            if isinstance(route, dict) and route.get("gateway"):
                to = f"{route.get('network')}/{_prefix(route.get('netmask'), str(route.get('network')))}"
                entry.setdefault("routes", []).append({"to": to, "via": route["gateway"]})


def _prefix(netmask: Any, address: str) -> int:
    """The prefix length of a netmask (``255.255.255.254`` → 31); a host prefix when it is missing."""
    v6 = ":" in address
    if isinstance(netmask, int) and not isinstance(netmask, bool):
        return netmask
    if isinstance(netmask, str) and netmask:
        if netmask.isascii() and netmask.isdigit() and len(netmask) <= 3:  # "²".isdigit() is True
            return int(netmask)
        try:
            return int(ipaddress.ip_address(netmask)).bit_count()  # masks are contiguous ones
        except ValueError:
            pass
    return 128 if v6 else 32
