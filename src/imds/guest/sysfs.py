"""What this machine has: network interfaces and whole disks, read from sysfs and /dev.

Both roots are parameters, so tests point them at fake trees (``imds.guest.testing``).
A device's bus location is read from its resolved sysfs path, whose components are its
ancestors: ``/sys/devices/pci0000:00/0000:00:07.0/virtio3/block/vdb`` sits at PCI
``0000:00:07.0``, ``…/host1/target1:0:2/1:0:2:0/block/sdb`` at SCSI ``1:0:2:0``,
``/sys/devices/vif-0/net/eth0`` at Xen ``vif-0``. The *nearest* ancestor counts, which is
what ``/sys/bus/pci/devices/<addr>/net/*`` and ``/sys/class/scsi_disk/<hctl>/device/block/*``
list, with virtio's intermediate ``virtioN`` device included.

Serial numbers, strongest evidence first:

- the ``serial`` attribute of the disk (virtio-blk) or of its parent (NVMe), which udev
  matches as ``ATTRS{serial}``;
- ``/dev/disk/by-id/<bus>-<ID_SERIAL>`` links, which carry udev's own ``ID_SERIAL``
  (``virtio-vol-1``, ``scsi-0QEMU_QEMU_HARDDISK_vol-1``);
- SCSI VPD page 0x80 (``device/vpd_pg80``), udev's ``ID_SERIAL_SHORT``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

PCI = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
HCTL = re.compile(r"\d+:\d+:\d+:\d+")
XEN_VIF = re.compile(r"vif-(\d+)")


@dataclass(frozen=True)
class LocalNic:
    """A network interface: ``/sys/class/net/<name>``."""

    name: str
    mac: str
    physical: bool  # has a ``device`` link: not a bridge, bond, VLAN or veth
    pci: str | None = None
    xen_vif: str | None = None  # "0" for /sys/devices/vif-0


@dataclass(frozen=True)
class LocalDisk:
    """A whole disk: ``/sys/block/<name>`` (partitions are not listed there)."""

    name: str
    pci: str | None = None
    scsi: str | None = None
    attr_serial: str | None = None
    vpd_serial: str | None = None
    id_serials: tuple[str, ...] = ()  # ID_SERIAL values from /dev/disk/by-id/<bus>-<ID_SERIAL>


@dataclass(frozen=True)
class Inventory:
    """Everything matching can use, sorted by name."""

    nics: tuple[LocalNic, ...]
    disks: tuple[LocalDisk, ...]


def scan(sysfs_root: Path, dev_root: Path) -> Inventory:
    """Read the interfaces and disks under ``sysfs_root`` and their by-id links under ``dev_root``."""
    by_id = _by_id_serials(dev_root)
    nics = tuple(nic for nic in map(_nic, _entries(sysfs_root / "class" / "net")) if nic is not None)
    disks = tuple(_disk(path, by_id.get(path.name, ())) for path in _entries(sysfs_root / "block"))
    return Inventory(nics=nics, disks=disks)


def _entries(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except OSError:
        return []


def _nearest(path: Path, pattern: re.Pattern[str]) -> re.Match[str] | None:
    for part in reversed(Path(os.path.realpath(path)).parts[:-1]):
        found = pattern.fullmatch(part)
        if found:
            return found
    return None


def _read(path: Path) -> str | None:
    try:
        value = path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
    return value or None


def _nic(path: Path) -> LocalNic | None:
    mac = _read(path / "address")
    if mac is None or path.name == "lo":
        return None
    pci = _nearest(path, PCI)
    vif = _nearest(path, XEN_VIF)
    return LocalNic(
        name=path.name,
        mac=mac.lower(),
        physical=(path / "device").exists(),
        pci=pci.group(0) if pci else None,
        xen_vif=vif.group(1) if vif else None,
    )


def _disk(path: Path, id_serials: tuple[str, ...]) -> LocalDisk:
    pci = _nearest(path, PCI)
    scsi = _nearest(path, HCTL)
    return LocalDisk(
        name=path.name,
        pci=pci.group(0) if pci else None,
        scsi=scsi.group(0) if scsi else None,
        attr_serial=_read(path / "serial") or _read(path / "device" / "serial"),
        vpd_serial=_vpd_serial(path / "device" / "vpd_pg80"),
        id_serials=id_serials,
    )


def _vpd_serial(path: Path) -> str | None:
    """The unit serial number of SCSI VPD page 0x80: a 4-byte header, then the ASCII serial."""
    try:
        page = path.read_bytes()
    except OSError:
        return None
    if len(page) < 4 or page[1] != 0x80:
        return None
    length = int.from_bytes(page[2:4], "big")
    return page[4 : 4 + length].decode("ascii", errors="replace").strip(" \x00") or None


def _by_id_serials(dev_root: Path) -> dict[str, tuple[str, ...]]:
    """Disk name → the ID_SERIAL values of its ``/dev/disk/by-id`` links (partitions skipped)."""
    found: dict[str, list[str]] = {}
    for link in _entries(dev_root / "disk" / "by-id"):
        bus, _, id_serial = link.name.partition("-")
        if not id_serial or bus in ("wwn", "dm", "md", "lvm") or re.search(r"-part\d+\Z", id_serial):
            continue
        found.setdefault(Path(os.path.realpath(link)).name, []).append(id_serial)
    return {name: tuple(values) for name, values in found.items()}
