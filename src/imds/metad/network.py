"""Ganeti's NICs → the record's ``network``, so every flavor describes the guest's network as Ganeti knows it.

The metadata document's ``network`` section (the Equinix shape the renderers derive from:
OpenStack ``network_data.json``, NoCloud ``network-config``, EC2 ``network/interfaces/macs``)
is built from the pushed NICs, in Ganeti's order (``NIC_<n>``):

- ``interfaces``: one per NIC with a MAC: ``name`` ``eth<n>`` (Ganeti's NIC names are
  labels such as ``ganeti:communication:…``, not device names), ``mac``, and what Ganeti
  says of it: ``mode`` and ``link`` (its ``nicparams``), ``network`` (the Ganeti network's
  UUID) and ``ganeti_name``;
- ``addresses``: one per NIC with an IP: ``address``, ``address_family``, ``interface``
  (the NIC's ``eth<n>``), ``public`` (a globally routable address), and from the Ganeti
  network the NIC is on (``netinfo``: ``network``/``gateway``, ``network6``/``gateway6``)
  ``cidr``, ``netmask``, ``network`` and ``gateway`` when the address is inside it: a
  static address, as Ganeti's own OS scripts configure it. Without that network (Ganeti's
  ``UpdateMetadata`` pushes ``Instance.ToDict()``, whose NICs carry no ``netinfo`` unless the
  caller added it) the subnet is unknown, so the address says ``dhcp: true``: the guest keeps
  asking DHCP on that NIC, as it did when the record described no network, rather than
  being given a /32 with no route.

A NIC without a MAC is left out (nothing in the guest could match it), and so is an IP
that is not an address. Pure: no I/O, nothing but the pushed dict.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

MAC = re.compile(r"[0-9a-fA-F]{2}(?::[0-9a-fA-F]{2}){5}")
_SUBNET_KEYS = {4: ("network", "gateway"), 6: ("network6", "gateway6")}


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def nic_network(nics: Any) -> dict[str, Any]:
    """``{"interfaces": [...], "addresses": [...]}`` from the pushed ``nics`` list (see the module docstring)."""
    interfaces: list[dict[str, Any]] = []
    addresses: list[dict[str, Any]] = []
    for index, nic in enumerate(nics if isinstance(nics, list) else []):
        if not isinstance(nic, dict) or not isinstance(nic.get("mac"), str) or not MAC.fullmatch(nic["mac"]):
            continue
        name = f"eth{index}"
        interfaces.append(_interface(name, nic))
        address = _address(name, nic)
        if address is not None:
            addresses.append(address)
    return {"interfaces": interfaces, "addresses": addresses}


def _interface(name: str, nic: dict[str, Any]) -> dict[str, Any]:
    params = _object(nic.get("nicparams"))
    facts = {"mode": params.get("mode"), "link": params.get("link"), "network": nic.get("network"),
             "ganeti_name": nic.get("name")}
    return {"name": name, "mac": nic["mac"].lower(), **{k: v for k, v in facts.items() if isinstance(v, str) and v}}


def _address(name: str, nic: dict[str, Any]) -> dict[str, Any] | None:
    text = nic.get("ip")
    try:
        address = ipaddress.ip_address(text) if isinstance(text, str) else None
    except ValueError:
        return None
    if address is None:
        return None
    entry: dict[str, Any] = {"address": str(address), "address_family": address.version, "interface": name,
                             "public": address.is_global}
    subnet_key, gateway_key = _SUBNET_KEYS[address.version]
    netinfo = _object(nic.get("netinfo"))
    given = netinfo.get(subnet_key)
    try:
        subnet = ipaddress.ip_network(given, strict=False) if isinstance(given, str) else None
    except ValueError:
        subnet = None
    if subnet is None or address not in subnet:
        entry["dhcp"] = True
        return entry
    entry.update(cidr=subnet.prefixlen, netmask=str(subnet.netmask), network=str(subnet.network_address))
    gateway = netinfo.get(gateway_key)
    if isinstance(gateway, str) and gateway:
        entry["gateway"] = gateway
    return entry
