"""``--hotplug``: a NIC and a tagged disk attached to the running guest, configured from fresh metadata, then detached.

Once the boot has passed (and with ``--device-tags``' watcher running in the guest):

1. **the port**: a second tap, plugged as os-vif plugs a port of the same instance (VLAN 2,
   ``vm-uuid`` the instance's), so ``imds agent`` programs flows for it: the lab waits until
   ``br-int`` has a rule for the new MAC;
2. **the record**: the source of truth adds the port (``POST /device-metadata``, the whole
   record again): interface ``ens8`` with the new MAC, its address ``10.231.1.10/24`` on that
   NIC (``interface``), and two device role tags, the NIC (``hotnic``, PCI ``0000:00:08.0``)
   and a disk (``hotdisk``, PCI ``0000:00:09.0``, serial ``imds-lab-hot``);
3. **QEMU** (QMP): ``netdev_add`` + ``device_add virtio-net-pci`` at slot 8, ``blockdev-add``
   + ``device_add virtio-blk-pci`` at slot 9;
4. **the guest**: cloud-init's hotplug hook (enabled by the userdata: ``updates: network:
   when: [boot, hotplug]``) reads the metadata again and configures the NIC; the watcher's
   next ``imds-guest udev`` tags both. The lab waits for the console to show the NIC with its
   tag and address and the disk's ``by-tag`` link;
5. **back**: the record without them, ``device_del`` both (QEMU reports ``DEVICE_DELETED``
   once the guest let go), ``netdev_del``/``blockdev-del``, the port unplugged (its flows gone);
   the console must show both gone.

The NIC is named ``ens8`` in the record because that is the name the guest's kernel gives a
virtio NIC in slot 8: cloud-init 22.4's hook brings up the interface by its current name
after writing the config, and a record naming it otherwise would ask for a rename it cannot
do on a running interface. The boot NIC is named ``ens2`` for the same reason: cloud-init
22.4's hook reads the metadata again with DHCP on the interface its datasource noted at boot
(``fallback_interface``, pickled with it), and a boot NIC renamed to ``eth0`` by the network
config has no DHCP to give under its old name.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imds.errors import LabError
from imds.lab.console import Console
from imds.lab.ganeti import fresh_disk
from imds.lab.qmp import Qmp
from imds.lab.server import Server

HOT_NAME = "ens8"
BOOT_NIC = "ens2"  # the boot NIC as the guest's kernel names it (slot 2): cloud-init then renames nothing
HOT_SLOT = 8
HOT_IP = "10.231.1.10"
HOT_PREFIX = 24
HOT_VLAN = 2
NIC_TAG = "hotnic"
DISK_TAG = "hotdisk"
DISK_SERIAL = "imds-lab-hot"
DISK = "disk-hot.raw"
STEP_TIMEOUT = 600.0  # cloud-init's hook takes minutes under TCG on a loaded machine
USERDATA = "#cloud-config\nupdates:\n  network:\n    when: [boot, hotplug]\n"  # cloud-init's hotplug, enabled


def hot_mac(mac: str) -> str:
    """The hot NIC's MAC: the guest's with the last octet flipped."""
    head, last = mac.rsplit(":", 1)
    return f"{head}:{int(last, 16) ^ 0xFF:02x}"


def with_hot_devices(document: dict[str, Any], mac: str) -> dict[str, Any]:
    """The record with the hot NIC (interface, address on it, tag) and the hot disk's tag added."""
    changed = copy.deepcopy(document)
    network = changed.setdefault("network", {})
    network.setdefault("interfaces", []).append({"name": HOT_NAME, "mac": mac})
    network.setdefault("addresses", []).append({
        "address": HOT_IP, "cidr": HOT_PREFIX, "address_family": 4, "public": False, "interface": HOT_NAME})
    changed.setdefault("devices", []).extend([
        {"type": "nic", "bus": "pci", "address": f"0000:00:{HOT_SLOT:02x}.0", "mac": mac, "tags": [NIC_TAG]},
        {"type": "disk", "bus": "pci", "address": f"0000:00:{HOT_SLOT + 1:02x}.0", "serial": DISK_SERIAL,
         "tags": [DISK_TAG]},
    ])
    return changed


@dataclass
class Hotplug:
    """One run's hot NIC and disk: what the lab needs to attach them and watch the guest take them."""

    server: Server
    uuid: str
    addresses: list[str]
    document: dict[str, Any]
    mac: str  # the hot NIC's
    plug: Callable[[str, str, int], None]  # (tap, mac, vlan): os-vif's plug on br-int
    unplug: Callable[[str], None]
    flows: Callable[[], str]  # br-int's rules, as ovs-ofctl dumps them
    tap: str
    out: Path
    say: Callable[[str], None]
    seen: dict[str, float] = field(default_factory=dict)

    def run(self, qmp_path: Path, console: Console) -> dict[str, Any]:
        """Attach, wait for the guest to take both, detach, wait for both to go; what happened, with times."""
        started = time.monotonic()
        problems: list[str] = []
        try:
            with Qmp(qmp_path) as qmp:
                self._attach(qmp, console)
                self._detach(qmp, console)
        except LabError as exc:
            problems.append(exc.message)
        self.seen = {name: round(at - started, 1) for name, at in self.seen.items()}
        return {"passed": not problems, "problems": problems, "seconds": self.seen, "mac": self.mac,
                "devices": sorted(console.devices), "guest_log": console.guest_log}

    def _mark(self, what: str) -> None:
        self.seen[what] = time.monotonic()
        self.say(f"lab: hotplug: {what}")

    def _push(self, document: dict[str, Any], addresses: list[str]) -> None:
        self.server.post("/device-metadata", {"id": self.uuid, "ipAddresses": addresses, "metadata": document})

    def _attach(self, qmp: Qmp, console: Console) -> None:
        self.plug(self.tap, self.mac, HOT_VLAN)
        _wait("the agent's flows for the hot NIC", lambda: f"dl_src={self.mac}" in self.flows())
        self._mark("flows plugged")
        self._push(with_hot_devices(self.document, self.mac), [*self.addresses, HOT_IP])
        self._mark("record has the port")
        disk = fresh_disk(self.out / DISK, 8 << 20)
        qmp.execute("netdev_add", type="tap", id="hotnet", ifname=self.tap, script="no", downscript="no",
                    vnet_hdr=False)
        qmp.execute("device_add", driver="virtio-net-pci", netdev="hotnet", mac=self.mac, id="hotnic",
                    addr=f"{HOT_SLOT:#x}")
        qmp.execute("blockdev-add", **{"node-name": "hotdisk", "driver": "raw",
                                       "file": {"driver": "file", "filename": str(disk.resolve())}})
        qmp.execute("device_add", driver="virtio-blk-pci", drive="hotdisk", serial=DISK_SERIAL, id="hotdisk",
                    addr=f"{HOT_SLOT + 1:#x}")
        self._mark("attached")
        nic = f"nic {self.mac} {HOT_NAME} tag={NIC_TAG} addr={HOT_IP}/{HOT_PREFIX}"
        _wait(f"the guest to configure and tag the hot NIC ({nic})", lambda: _has(console, nic))
        self._mark("nic configured and tagged")
        _wait("the guest to tag the hot disk", lambda: _has(console, f"disk {DISK_TAG} "))
        self._mark("disk tagged")

    def _detach(self, qmp: Qmp, console: Console) -> None:
        self._push(self.document, self.addresses)
        qmp.execute("device_del", id="hotnic")
        qmp.execute("device_del", id="hotdisk")
        qmp.wait_event("DEVICE_DELETED", STEP_TIMEOUT, device="hotnic")
        qmp.wait_event("DEVICE_DELETED", STEP_TIMEOUT, device="hotdisk")
        qmp.execute("netdev_del", id="hotnet")
        qmp.execute("blockdev-del", **{"node-name": "hotdisk"})
        self.unplug(self.tap)
        self._mark("detached")
        _wait("the hot NIC's flows to go", lambda: f"dl_src={self.mac}" not in self.flows())
        _wait("the guest to drop the hot NIC and disk",
              lambda: not _has(console, f"nic {self.mac} ") and not _has(console, f"disk {DISK_TAG} "))
        self._mark("gone")


def _has(console: Console, start: str) -> bool:
    console.poll()
    return any(line.startswith(start) for line in console.devices)


def _wait(what: str, predicate: Callable[[], bool], timeout: float = STEP_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1.0)
    raise LabError(f"hotplug: timed out after {timeout:.0f}s waiting for {what}")
