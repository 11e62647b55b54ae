"""Fake machines for the device-role-tagging fixtures (tests/fixtures).

Every tree is built in ``tmp_path`` with ``imds.guest.testing.FakeSystem``; nothing here
reads the real /sys or /dev, writes /etc, or runs the real udevadm.
"""

from __future__ import annotations

import json
import stat
from dataclasses import dataclass
from pathlib import Path

from helpers import fixture_json
from imds.guest.testing import FakeSystem

MAC = "01:22:22:42:22:21"  # both NICs of every fixture carry it


def load_fixture(name: str) -> dict:
    """``device-role-tagging-<name>.json`` from tests/fixtures."""
    return fixture_json(f"device-role-tagging-{name}.json")


def make_config_drive(root: Path, document: object) -> Path:
    """A mounted-config-drive directory holding ``document`` as openstack/latest/meta_data.json."""
    latest = root / "openstack" / "latest"
    latest.mkdir(parents=True)
    (latest / "meta_data.json").write_text(json.dumps(document))
    return root


def example_machine(fake: FakeSystem) -> FakeSystem:
    """What example.json describes: an e1000 and a virtio NIC sharing a MAC, a SCSI and a virtio disk."""
    fake.pci_nic("eth0", MAC, "0000:00:02.0", virtio=False)
    fake.pci_nic("eth1", MAC, "0000:00:03.0")
    fake.virtual_nic("lo", "00:00:00:00:00:00")
    fake.scsi_disk("sda", "1:0:2:0", serial="disk-vol-2352423")
    fake.virtio_disk("vda", "0000:00:06.0", serial="root-disk")
    fake.virtio_disk("vdb", "0000:00:07.0", serial="disk-vol-24235252")
    fake.partition("vdb", 1)
    return fake


def xen_machine(fake: FakeSystem) -> FakeSystem:
    """What xen.json describes, as a PV guest sees it: vif-0/vif-1 sharing a MAC, xvda/xvdb without serials."""
    fake.xen_nic("eth0", MAC, 0)
    fake.xen_nic("eth1", MAC, 1)
    fake.xen_disk("xvda", 51712)
    fake.xen_disk("xvdb", 51728)
    return fake


def lxc_machine(fake: FakeSystem) -> FakeSystem:
    """What lxc.json describes: two veths sharing a MAC; sda shows its serial, sdb does not."""
    fake.virtual_nic("eth0", MAC)
    fake.virtual_nic("eth1", MAC)
    fake.scsi_disk("sda", "0:0:0:0", serial="disk-vol-2352423")
    fake.scsi_disk("sdb", "0:0:1:0")
    return fake


@dataclass
class FakeUdevadm:
    """A udevadm stand-in that records its arguments, one call per line."""

    path: Path
    log: Path

    def calls(self) -> list[str]:
        """The recorded calls, arguments joined by spaces."""
        return self.log.read_text().splitlines() if self.log.exists() else []


def write_script(path: Path, body: str) -> Path:
    """An executable /bin/sh script."""
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path
