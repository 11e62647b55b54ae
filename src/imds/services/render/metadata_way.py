"""The one rule for how a derived network keeps the guest's way to the metadata service.

A guest reaches imds at boot through whatever its DHCP lease said (an option-121 route to
169.254.169.254 on-link or via the DHCP port, or a default route through the gateway). When
cloud-init then applies a network description imds derived from the record (OpenStack
``network_data.json``, NoCloud ``network-config``, a config drive), that lease is gone: the
description must carry the way itself, or the guest can read its metadata at first boot and
never again. For each address in ``network.addresses``, in this order:

1. ``dhcp: true`` on the address: the subnet has DHCP. The network is ``ipv4_dhcp`` /
   ``ipv6_dhcp`` with no address of its own, as Nova writes it for a Neutron subnet with DHCP
   (``nova/virt/netutils.py``, ``_get_nets``): the guest keeps asking DHCP, which gives the
   route again.
2. Otherwise a static network, and the first static network of each family on a link gets a
   host route to the metadata address (``169.254.169.254``; IPv6: ``fd00:ec2::254``, the
   address AWS and imds's agent answer; ``fe80::a9fe:a9fe`` is link-local and needs none),
   by the address's ``metadata_route``, else ``network.metadata_route``, else the default:

   - ``"onlink"``: no next hop (gateway ``0.0.0.0`` / ``::``, as Neutron's host routes and DHCP
     option 121 write it);
   - ``"gateway"``: via the address's ``gateway``;
   - an address of the same family (the DHCP port's, a router's): via that address;
   - default: via the address's ``gateway`` when it has one, else on-link.

An address that names a ``metadata_route`` wins the route over the first of its family. A
record's own ``network_data`` is served as given: none of this applies to it.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from imds.models import JsonObject

METADATA_V4 = "169.254.169.254"
METADATA_V6 = "fd00:ec2::254"  # AWS's IPv6 metadata address; the agent answers it as it answers 169.254.169.254
LINK_LOCAL_V6 = "fe80::a9fe:a9fe"  # OpenStack's: link-local, reachable on every link without a route
ONLINK, GATEWAY = "onlink", "gateway"
WAY = "metadata_route"
DHCP = "dhcp"


def way_problem(value: Any, *, v6: bool | None, gateway: Any) -> str | None:
    """Why ``value`` is no ``metadata_route`` (for an address of that family and gateway), else None."""
    if value == ONLINK:
        return None
    if value == GATEWAY:
        return None if isinstance(gateway, str) and gateway else "is gateway, but the address has no gateway"
    if not isinstance(value, str):
        return 'must be "onlink", "gateway" or a next-hop address'
    try:
        hop = ipaddress.ip_address(value)
    except ValueError:
        return f'must be "onlink", "gateway" or a next-hop address, not {value!r}'
    if v6 is not None and (hop.version == 6) != v6:
        return f"{value} is not an IPv{6 if v6 else 4} address like the address it routes for"
    return None


def subnet_has_dhcp(item: JsonObject) -> bool:
    """Whether the record says the address's subnet has DHCP (``dhcp: true``)."""
    return item.get(DHCP) is True


def metadata_route(item: JsonObject, network: JsonObject, *, v6: bool) -> JsonObject:
    """The host route to the metadata address for a static ``item`` (network_data.json's route shape)."""
    way = item.get(WAY, network.get(WAY))
    gateway = item.get("gateway") if isinstance(item.get("gateway"), str) and item.get("gateway") else None
    if way_problem(way, v6=v6, gateway=gateway) is not None:
        way = GATEWAY if gateway else ONLINK
    if way == GATEWAY:
        hop = str(gateway)
    elif way == ONLINK:
        hop = "::" if v6 else "0.0.0.0"  # noqa: S104 - a route's next hop: none (on-link)
    else:
        hop = str(way)
    if v6:
        return {"network": METADATA_V6, "netmask": "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "gateway": hop}
    return {"network": METADATA_V4, "netmask": "255.255.255.255", "gateway": hop}


def names_way(item: JsonObject) -> bool:
    """Whether the address itself says how metadata is reached (it then carries the route)."""
    return WAY in item
