"""The ``devices`` list of ``meta_data.json`` (Nova device role tagging), checked by hand.

The checks follow ``device-role-tagging.schema.json`` with the standard library only: an
entry that breaks the schema is reported and skipped, the rest are used. Unknown properties
are ignored (the schema is append-only). Hexadecimal addresses and MACs are lower-cased
before they are checked, so ``0000:00:0A.0`` is accepted as ``0000:00:0a.0``.

Usage::

    entries = parse_devices(document)
    for problem in entries.problems: print(problem)
    for device in entries.devices: device.tags, device.mac, device.address
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from imds.guest.errors import SourceError

BUSES = ("pci", "usb", "ide", "scsi", "xen", "none")
TYPES = ("nic", "disk")

_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")
_ADDRESS = {
    "pci": re.compile(r"[a-f0-9]{4}:[a-f0-9]{2}:[a-f0-9]{2}\.[a-f0-9]"),
    "usb": re.compile(r"[a-f0-9]+:[a-f0-9]+"),
    "scsi": re.compile(r"[a-f0-9]+:[a-f0-9]+:[a-f0-9]+:[a-f0-9]+"),
    "ide": re.compile(r"[0-1]:[0-1]"),
}
_HEX_BUSES = ("pci", "usb", "scsi")


class _InvalidEntry(Exception):
    """One entry breaks the schema; the message says how."""


@dataclass(frozen=True)
class Device:
    """One tagged (or untagged) entry of ``devices``, as the metadata describes it."""

    index: int
    type: str
    bus: str
    tags: tuple[str, ...]
    address: str | None = None
    mac: str | None = None
    serial: str | None = None
    path: str | None = None
    devname: str | None = None

    def describe(self) -> str:
        """``nic #0 (bus pci, address 0000:00:02.0, mac 01:…)``: how reports name the entry."""
        facts = [f"bus {self.bus}"]
        facts += [
            f"{name} {value!r}" if name in ("serial", "path", "devname") else f"{name} {value}"
            for name, value in (
                ("address", self.address),
                ("mac", self.mac),
                ("serial", self.serial),
                ("path", self.path),
                ("devname", self.devname),
            )
            if value is not None
        ]
        tags = ", ".join(repr(tag) for tag in self.tags)
        return f"{self.type} #{self.index} ({', '.join(facts)}; tags {tags})"


@dataclass(frozen=True)
class Entries:
    """The usable entries and one message per skipped entry."""

    devices: tuple[Device, ...]
    problems: tuple[str, ...]


def devices_of(document: object, where: str) -> list[Any]:
    """The raw ``devices`` list of a ``meta_data.json`` document; SourceError if absent or not a list."""
    if not isinstance(document, dict):
        raise SourceError(f"{where}: expected a JSON object, got {type(document).__name__}")
    if "devices" not in document:
        raise SourceError(
            f'{where}: no "devices" key (device role tags); the source does not publish them '
            "(an OpenStack metadata version before 2016-06-30?)"
        )
    devices = document["devices"]
    if not isinstance(devices, list):
        raise SourceError(f'{where}: "devices" must be a list, got {type(devices).__name__}')
    return devices


def parse_devices(document: object, where: str = "meta_data.json") -> Entries:
    """Check every entry of ``document["devices"]``; SourceError when the list itself is missing."""
    devices: list[Device] = []
    problems: list[str] = []
    for index, raw in enumerate(devices_of(document, where)):
        try:
            devices.append(_parse_entry(index, raw))
        except _InvalidEntry as exc:
            problems.append(f"skipped devices[{index}]: {exc}")
    return Entries(tuple(devices), tuple(problems))


def _parse_entry(index: int, raw: object) -> Device:
    if not isinstance(raw, dict):
        raise _InvalidEntry(f"expected an object, got {type(raw).__name__}")
    kind = raw.get("type")
    if kind not in TYPES:
        raise _InvalidEntry(f'"type" must be one of {", ".join(TYPES)}, got {kind!r}')
    bus = raw.get("bus")
    if bus not in BUSES:
        raise _InvalidEntry(f'"bus" must be one of {", ".join(BUSES)}, got {bus!r}')
    strings = {name: _optional_string(raw, name) for name in ("address", "mac", "serial", "path", "devname")}
    address = strings["address"]
    if address is not None and bus in _HEX_BUSES:
        address = address.lower()
    if address is not None and bus in _ADDRESS and not _ADDRESS[bus].fullmatch(address):
        raise _InvalidEntry(f"{address!r} is not a {bus} address")
    mac = strings["mac"].lower() if strings["mac"] is not None else None
    if kind == "nic" and mac is None:
        raise _InvalidEntry('a nic needs a "mac"')
    if mac is not None and not _MAC.fullmatch(mac):
        raise _InvalidEntry(f"{strings['mac']!r} is not a MAC address")
    return Device(
        index=index,
        type=str(kind),
        bus=str(bus),
        tags=_tags(raw),
        address=address,
        mac=mac,
        serial=strings["serial"] if kind == "disk" else None,
        path=strings["path"] if kind == "disk" else None,
        devname=strings["devname"],
    )


def _optional_string(raw: dict[str, Any], name: str) -> str | None:
    value = raw.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise _InvalidEntry(f'"{name}" must be a non-empty string, got {value!r}')
    return value


def _tags(raw: dict[str, Any]) -> tuple[str, ...]:
    tags = raw.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(tag, str) and tag for tag in tags):
        raise _InvalidEntry(f'"tags" must be a list of non-empty strings, got {tags!r}')
    return tuple(dict.fromkeys(tags))
