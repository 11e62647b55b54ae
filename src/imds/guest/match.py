"""Tagged metadata entries → the local interfaces and disks they describe.

NICs, first rule that finds something wins:

1. bus ``pci``/``xen`` with an address: the interface at that PCI function / Xen ``vif-N``;
   its MAC must agree (two NICs may share a MAC, so the address comes first);
2. ``devname``: the interface of that name; its MAC must agree;
3. the MAC alone (any case), when exactly one interface has it. Bridges, bonds and VLANs
   copy MACs, so only interfaces with a device behind them count, except on bus ``none``
   (containers, where every interface is virtual).

Disks, serial first because it names the volume wherever it is attached:

1. ``serial``: the disk whose serial is that (see ``sysfs``; virtio-blk keeps only the
   first 20 characters, so a 20-character local serial may be a prefix of the metadata's);
2. bus ``pci``/``scsi`` with an address: the disk at that PCI function / SCSI h:c:t:l;
3. ``path`` (``/dev/xvda``) or ``devname``: the disk of that kernel name.

A disk found by address or name whose local serial contradicts the metadata is not used.
Entries that share a serial are one logical disk (Xen lists the same volume on ``ide`` and
``xen``): the first entry that is found carries the tags of all of them. Entries that
land on the same local device add their tags to it.

Each match carries its udev *keys*, strongest first; ``rules`` uses the first one it can
write safely.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import PurePosixPath

from imds.guest.devices import Device
from imds.guest.sysfs import Inventory, LocalDisk, LocalNic

VIRTIO_SERIAL_LENGTH = 20


@dataclass(frozen=True)
class Key:
    """One way to recognise a device in udev: ``kind`` is one of the names below, ``value`` its value.

    ``mac``, ``pci``, ``scsi``, ``xen-vif``, ``kernel`` (a kernel name), ``attr-serial``
    (sysfs ``serial`` attribute), ``id-serial`` (udev ``ID_SERIAL``), ``serial-short``
    (udev ``ID_SERIAL_SHORT``).
    """

    kind: str
    value: str


@dataclass(frozen=True)
class Match:
    """A local device and what the metadata says about it."""

    type: str  # "nic" | "disk"
    name: str  # the kernel name now: eth0, vdb
    tags: tuple[str, ...]
    found_by: str  # human words for the report and the rule comment: "pci address", "serial"
    keys: tuple[Key, ...]  # for a NIC: the MAC, then a key that tells apart NICs sharing it
    hardware: bool = True  # a NIC behind a device (not bus "none"): rules add DRIVERS=="?*"
    entries: tuple[int, ...] = ()


@dataclass(frozen=True)
class Miss:
    """A tagged entry (or a group sharing a serial) that matched nothing here."""

    devices: tuple[Device, ...]
    reason: str

    def describe(self) -> str:
        """One report line: which entry, and why nothing matched."""
        return f"not found: {self.devices[0].describe()}: {self.reason}"


@dataclass(frozen=True)
class Matching:
    """The result: matches in metadata order, then misses and notes for stderr."""

    matches: tuple[Match, ...]
    misses: tuple[Miss, ...]
    notes: tuple[str, ...]


def match_devices(devices: Iterable[Device], inventory: Inventory) -> Matching:
    """Find every tagged entry of ``devices`` in ``inventory``; untagged entries are ignored."""
    tagged = [device for device in devices if device.tags]
    matches: list[Match] = []
    misses: list[Miss] = []
    mac_counts: dict[str, int] = {}
    for device in tagged:
        if device.mac is not None and device.type == "nic":
            mac_counts[device.mac] = mac_counts.get(device.mac, 0) + 1
    for device in (device for device in tagged if device.type == "nic"):
        found = _find_nic(device, inventory, shared_in_metadata=mac_counts[str(device.mac)] > 1)
        if isinstance(found, Match):
            matches.append(found)
        else:
            misses.append(found)
    for group in _serial_groups(device for device in tagged if device.type == "disk"):
        misses_here: list[Miss] = []
        for device in group:
            found = _find_disk(device, inventory)
            if isinstance(found, Match):
                tags = tuple(dict.fromkeys(tag for entry in group for tag in entry.tags))
                entries = tuple(entry.index for entry in group)
                matches.append(replace(found, tags=tags, entries=entries))
                break
            misses_here.append(found)
        else:
            reasons = "; ".join(f"#{miss.devices[0].index}: {miss.reason}" for miss in misses_here)
            misses.append(Miss(tuple(group), reasons) if len(group) > 1 else misses_here[0])
    merged, notes = _merge(matches)
    return Matching(matches=merged, misses=tuple(misses), notes=notes)


def _merge(matches: list[Match]) -> tuple[tuple[Match, ...], tuple[str, ...]]:
    """One match per local device: later entries that land on the same device add their tags."""
    by_device: dict[tuple[str, str], Match] = {}
    notes: list[str] = []
    for found in matches:
        key = (found.type, found.name)
        if key not in by_device:
            by_device[key] = found
            continue
        first = by_device[key]
        notes.append(
            f"{found.type} {found.name}: entries {_indexes(first.entries)} and {_indexes(found.entries)} "
            "describe the same device; their tags are merged"
        )
        tags = tuple(dict.fromkeys((*first.tags, *found.tags)))
        by_device[key] = replace(first, tags=tags, entries=(*first.entries, *found.entries))
    return tuple(by_device.values()), tuple(notes)


def _indexes(entries: tuple[int, ...]) -> str:
    return "+".join(f"#{index}" for index in entries)


def _serial_groups(disks: Iterable[Device]) -> list[list[Device]]:
    groups: dict[object, list[Device]] = {}
    for device in disks:
        groups.setdefault(device.serial if device.serial is not None else device.index, []).append(device)
    return list(groups.values())


# NICs


def _find_nic(device: Device, inventory: Inventory, *, shared_in_metadata: bool) -> Match | Miss:
    mac = str(device.mac)
    pool = [nic for nic in inventory.nics if device.bus == "none" or nic.physical]
    with_mac = [nic for nic in pool if nic.mac == mac]

    def matched(nic: LocalNic, found_by: str, key: Key) -> Match:
        alone = not shared_in_metadata and len(with_mac) == 1
        keys = (Key("mac", mac),) if alone else (Key("mac", mac), key)
        return Match("nic", nic.name, device.tags, found_by, keys, device.bus != "none", (device.index,))

    notes: list[str] = []
    located = _nic_at_address(device, pool)
    if located is not None:
        nic, key = located
        if nic.mac != mac:
            return Miss((device,), f"the interface at {_where(key)} is {nic.name} with MAC {nic.mac}")
        return matched(nic, f"{device.bus} address", key)
    if device.address is not None and device.bus in ("pci", "xen"):
        notes.append(f"no interface at {device.bus} address {device.address}")
    if device.devname is not None:
        named = [nic for nic in pool if nic.name == device.devname]
        if named and named[0].mac != mac:
            return Miss((device,), f"{device.devname} has MAC {named[0].mac}")
        if named:
            return matched(named[0], "devname", Key("kernel", named[0].name))
        notes.append(f"no interface named {device.devname}")
    if len(with_mac) == 1 and not shared_in_metadata:
        return matched(with_mac[0], "MAC", Key("kernel", with_mac[0].name))
    notes.append(_why_not_by_mac(mac, with_mac, shared_in_metadata=shared_in_metadata))
    return Miss((device,), "; ".join(notes))


def _why_not_by_mac(mac: str, with_mac: Sequence[LocalNic], *, shared_in_metadata: bool) -> str:
    if shared_in_metadata:
        return f"other entries share MAC {mac}, so it cannot tell them apart"
    if with_mac:
        return f"MAC {mac} is on {', '.join(nic.name for nic in with_mac)} and nothing else tells them apart"
    return f"no interface has MAC {mac}"


def _nic_at_address(device: Device, pool: Sequence[LocalNic]) -> tuple[LocalNic, Key] | None:
    if device.address is None:
        return None
    if device.bus == "pci":
        at = [nic for nic in pool if nic.pci == device.address]
        key = Key("pci", device.address)
    elif device.bus == "xen" and device.address.isdigit():
        at = [nic for nic in pool if nic.xen_vif == device.address]
        key = Key("xen-vif", f"vif-{device.address}")
    else:
        return None
    # A PCI function may carry several ports (mlx4): the MAC picks one of them.
    same_mac = [nic for nic in at if nic.mac == device.mac]
    chosen = same_mac or at
    return (chosen[0], key) if len(chosen) == 1 else None


def _where(key: Key) -> str:
    return {"pci": "PCI", "xen-vif": "Xen"}.get(key.kind, key.kind) + f" {key.value}"


# Disks


def _find_disk(device: Device, inventory: Inventory) -> Match | Miss:
    notes: list[str] = []
    for finder in (_disk_by_serial, _disk_by_address, _disk_by_name):
        found = finder(device, inventory.disks, notes)
        if found is not None:
            disk, found_by, keys = found
            return Match("disk", disk.name, device.tags, found_by, keys, entries=(device.index,))
    return Miss((device,), "; ".join(notes) or "nothing in the metadata identifies it (no serial, address or path)")


Found = tuple[LocalDisk, str, tuple[Key, ...]]


def _disk_by_serial(device: Device, disks: Sequence[LocalDisk], notes: list[str]) -> Found | None:
    if device.serial is None:
        return None
    serial = device.serial
    hits = [(disk, _serial_keys(disk, serial)) for disk in disks]
    hits = [(disk, keys) for disk, keys in hits if keys]
    if len(hits) > 1:  # the same volume seen twice (multipath): the address decides
        hits = [(disk, keys) for disk, keys in hits if _address_key(device, disk) is not None]
    if len(hits) == 1:
        disk, keys = hits[0]
        address = _address_key(device, disk)
        return disk, "serial", (*keys, *([address] if address else []))
    notes.append(f"serial {serial!r} is on {len(hits)} disks" if hits else f"no disk has serial {serial!r}")
    return None


def _serial_keys(disk: LocalDisk, serial: str) -> list[Key]:
    keys = []
    if disk.attr_serial is not None and _same_serial(disk.attr_serial, serial):
        keys.append(Key("attr-serial", disk.attr_serial))
    keys += [
        Key("id-serial", id_serial)
        for id_serial in disk.id_serials
        if _same_serial(id_serial, serial) or id_serial.endswith(f"_{serial}")
    ]
    if disk.vpd_serial is not None and disk.vpd_serial == serial:
        keys.append(Key("serial-short", disk.vpd_serial))
    return keys


def _same_serial(local: str, serial: str) -> bool:
    return local == serial or (len(local) == VIRTIO_SERIAL_LENGTH and serial.startswith(local))


def _known_serials(disk: LocalDisk) -> list[str]:
    return [value for value in (disk.attr_serial, disk.vpd_serial) if value is not None]


def _contradicts(device: Device, disk: LocalDisk) -> bool:
    """The disk has a serial of its own and it is not the one the metadata names."""
    known = _known_serials(disk)
    return device.serial is not None and bool(known) and not _serial_keys(disk, device.serial)


def _address_key(device: Device, disk: LocalDisk) -> Key | None:
    if device.address is None:
        return None
    if device.bus == "pci" and disk.pci == device.address:
        return Key("pci", device.address)
    if device.bus == "scsi" and disk.scsi == device.address:
        return Key("scsi", device.address)
    return None


def _disk_by_address(device: Device, disks: Sequence[LocalDisk], notes: list[str]) -> Found | None:
    if device.address is None or device.bus not in ("pci", "scsi"):
        return None
    at = [(disk, key) for disk in disks if (key := _address_key(device, disk)) is not None]
    if len(at) != 1:
        detail = f"{len(at)} disks" if at else "no disk"
        notes.append(f"{detail} at {device.bus} address {device.address}")
        return None
    disk, key = at[0]
    if _contradicts(device, disk):
        notes.append(f"{disk.name} at {device.bus} address {device.address} has serial {_known_serials(disk)[0]!r}")
        return None
    return disk, f"{device.bus} address", (key,)


def _disk_by_name(device: Device, disks: Sequence[LocalDisk], notes: list[str]) -> Found | None:
    names = [PurePosixPath(value).name for value in (device.path, device.devname) if value is not None]
    for name in dict.fromkeys(names):
        disk = next((disk for disk in disks if disk.name == name), None)
        if disk is None:
            notes.append(f"no disk named {name}")
        elif _contradicts(device, disk):
            notes.append(f"{name} has serial {_known_serials(disk)[0]!r}")
        else:
            return disk, "path" if device.path is not None else "devname", (Key("kernel", disk.name),)
    return None
