"""The optional OpenStack parts of a metadata document, checked before anything is written.

They ride in the document pushed with ``POST /device-metadata`` as top-level keys:

| key | shape | served as |
|---|---|---|
| ``devices`` | device role tags (see ``imds.services.records.devices``) | ``meta_data.json`` ``devices`` |
| ``network_data`` | OpenStack ``network_data.json``: ``links``, ``networks``, ``services`` | ``network_data.json`` |
| ``vendor_data`` | a JSON object | ``vendor_data.json`` (and ``vendor_data2.json`` ``static``) |

``network_data`` is checked only as far as guest tools and our renderers depend on it:
cloud-init indexes ``link['id']``, ``link['type']`` and ``network['link']`` without a
default, so those must be there, and a network must point at a link that exists; a DNS
service needs its ``address`` and a bond's ``bond_links`` are link ids (strings).
"""

from __future__ import annotations

from typing import Any

from imds.errors import Problem
from imds.models import JsonObject
from imds.services.records.devices import check_devices

DEVICES = "devices"
NETWORK_DATA = "network_data"
VENDOR_DATA = "vendor_data"
_LISTS = ("links", "networks", "services")


def check_parts(document: JsonObject) -> list[Problem]:
    """Every problem with the document's OpenStack parts (absent parts are fine)."""
    problems: list[Problem] = []
    if DEVICES in document:
        problems += check_devices(document[DEVICES])
    if NETWORK_DATA in document:
        problems += _network_data(document[NETWORK_DATA])
    if VENDOR_DATA in document and not isinstance(document[VENDOR_DATA], dict):
        problems.append(Problem(f"metadata.{VENDOR_DATA}", "must be a JSON object"))
    return problems


def _network_data(value: Any) -> list[Problem]:
    where = f"metadata.{NETWORK_DATA}"
    if not isinstance(value, dict):
        return [Problem(where, "must be a JSON object with links, networks and services lists")]
    problems: list[Problem] = []
    items: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for name in _LISTS:
        entries = value.get(name, [])
        if not isinstance(entries, list):
            problems.append(Problem(f"{where}.{name}", "must be a list of objects"))
            entries = []
        items[name] = []
        for index, entry in enumerate(entries):
            path = f"{where}.{name}[{index}]"
            if isinstance(entry, dict):
                items[name].append((path, entry))
            else:
                problems.append(Problem(path, "must be an object"))
    for path, link in items["links"]:
        problems += _link(path, link)
    link_ids = {link["id"] for _, link in items["links"] if isinstance(link.get("id"), str)}  # a list id is unhashable
    for path, network in items["networks"]:
        problems += _strings(path, network, "link", "type")
        if isinstance(network.get("link"), str) and network["link"] not in link_ids:
            problems.append(Problem(f"{path}.link", f"names no link: {network['link']!r} is not a links[].id"))
    for path, service in items["services"]:
        problems += _strings(path, service, "type", *(("address",) if service.get("type") == "dns" else ()))
    return problems


def _link(path: str, link: dict[str, Any]) -> list[Problem]:
    problems = _strings(path, link, "id", "type")
    members = link.get("bond_links", [])
    if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
        problems.append(Problem(f"{path}.bond_links", "must be a list of link ids (strings)"))
    return problems


def _strings(path: str, entry: dict[str, Any], *keys: str) -> list[Problem]:
    return [
        Problem(f"{path}.{key}", "is required (a string)")
        for key in keys
        if not isinstance(entry.get(key), str) or not entry[key]
    ]
