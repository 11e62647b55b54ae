"""The fields of the Equinix document that renderers compute with, checked at the write.

The document is free-form, and renderers skip what they cannot use (a non-string
``address``, an unknown key). Two fields are arithmetic rather than text, so a wrong
value cannot be skipped silently: it would describe a different network. They are
refused, each under its path:

- ``network.addresses[N].address_family``: 4 or 6 when present;
- ``network.addresses[N].cidr``: a whole number from 0 to 32 (IPv4) or 128 (IPv6) when present.

Two more say how the guest reaches metadata, which every derived network keeps
(``imds.services.render.metadata_way``): a wrong one would cut the guest off after boot.

- ``network.addresses[N].dhcp``: true or false (true: the subnet has DHCP);
- ``network.metadata_route`` and ``network.addresses[N].metadata_route``: ``onlink``,
  ``gateway`` (on an address, it must have a ``gateway``) or a next-hop address (on an
  address, of its family).
"""

from __future__ import annotations

from typing import Any

from imds.errors import Problem
from imds.models import JsonObject
from imds.services.render.metadata_way import DHCP, WAY, way_problem

FAMILIES = (4, 6)
PREFIX_BITS = {4: 32, 6: 128}


def whole(value: Any) -> bool:
    """A JSON whole number (``true`` is not one, although Python says ``bool`` is an ``int``)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_shape(document: JsonObject) -> list[Problem]:
    """Every problem with the computed-with fields of ``network.addresses``."""
    network = document.get("network")
    addresses = network.get("addresses") if isinstance(network, dict) else None
    problems: list[Problem] = []
    if isinstance(network, dict) and WAY in network and (why := way_problem(network[WAY], v6=None, gateway="any")):
        problems.append(Problem(f"metadata.network.{WAY}", why))
    if not isinstance(addresses, list):
        return problems
    for index, item in enumerate(addresses):
        if not isinstance(item, dict):
            continue
        path = f"metadata.network.addresses[{index}]"
        family = item.get("address_family")
        if family is not None and (not whole(family) or family not in FAMILIES):
            problems.append(Problem(f"{path}.address_family", "must be 4 or 6"))
            family = None
        cidr = item.get("cidr")
        bits = PREFIX_BITS.get(family, 128) if family is not None else _bits_of(item.get("address"))
        if cidr is not None and (not whole(cidr) or not 0 <= cidr <= bits):
            problems.append(Problem(f"{path}.cidr", f"must be a whole number from 0 to {bits}"))
        problems += _way(path, item)
    return problems


def _way(path: str, item: JsonObject) -> list[Problem]:
    """``dhcp`` and ``metadata_route`` of one address."""
    problems = []
    if DHCP in item and not isinstance(item[DHCP], bool):
        problems.append(Problem(f"{path}.{DHCP}", "must be true or false"))
    if WAY in item:
        v6 = ":" in item["address"] if isinstance(item.get("address"), str) else None
        if why := way_problem(item[WAY], v6=v6, gateway=item.get("gateway")):
            problems.append(Problem(f"{path}.{WAY}", why))
    return problems


def _bits_of(address: Any) -> int:
    return 128 if not isinstance(address, str) or ":" in address else 32
