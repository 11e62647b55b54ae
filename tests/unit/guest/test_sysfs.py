"""What the guest sees: interfaces and whole disks read from a fake sysfs and /dev."""

from __future__ import annotations

from guest_machines import MAC, example_machine, xen_machine

from imds.guest.sysfs import LocalDisk, LocalNic, scan


def test_pci_nics_carry_their_pci_address_and_mac(fake):
    """An e1000-style NIC (net/ under the PCI device) and a virtio one (under virtioN) both report their function."""
    example_machine(fake)
    nics = {nic.name: nic for nic in scan(fake.sys, fake.dev).nics}
    assert nics == {
        "eth0": LocalNic(name="eth0", mac=MAC, physical=True, pci="0000:00:02.0"),
        "eth1": LocalNic(name="eth1", mac=MAC, physical=True, pci="0000:00:03.0"),
    }


def test_loopback_is_skipped_and_virtual_nics_are_not_physical(fake):
    """``lo`` is never listed; a veth without a device link is listed as not physical."""
    fake.virtual_nic("lo", "00:00:00:00:00:00")
    fake.virtual_nic("veth0", "FA:16:3E:00:00:09")
    assert scan(fake.sys, fake.dev).nics == (LocalNic(name="veth0", mac="fa:16:3e:00:00:09", physical=False),)


def test_xen_nics_report_their_vif_index(fake):
    """Netfront NICs under /sys/devices/vif-N report N."""
    xen_machine(fake)
    assert [(nic.name, nic.xen_vif, nic.pci) for nic in scan(fake.sys, fake.dev).nics] == [
        ("eth0", "0", None),
        ("eth1", "1", None),
    ]


def test_disks_report_address_and_every_kind_of_serial(fake):
    """virtio-blk: serial attribute and by-id link; SCSI: h:c:t:l, VPD page 0x80 and by-id link."""
    example_machine(fake)
    disks = {disk.name: disk for disk in scan(fake.sys, fake.dev).disks}
    assert disks["vdb"] == LocalDisk(
        name="vdb", pci="0000:00:07.0", attr_serial="disk-vol-24235252", id_serials=("disk-vol-24235252",)
    )
    assert disks["sda"] == LocalDisk(
        name="sda",
        pci="0000:00:05.0",
        scsi="1:0:2:0",
        vpd_serial="disk-vol-2352423",
        id_serials=("0QEMU_QEMU_HARDDISK_disk-vol-2352423",),
    )


def test_partitions_are_not_disks(fake):
    """vdb1 exists in class/block but only whole disks from /sys/block are listed."""
    example_machine(fake)
    assert [disk.name for disk in scan(fake.sys, fake.dev).disks] == ["sda", "vda", "vdb"]


def test_by_id_links_of_partitions_and_wwn_are_ignored(fake):
    """``-partN`` and ``wwn-`` links add no serial to a disk."""
    fake.virtio_disk("vdc", "0000:00:08.0")
    fake.partition("vdc", 1)
    fake.by_id("virtio-vol-9-part1", "vdc1")
    fake.by_id("wwn-0x5000c500a1b2c3d4", "vdc")
    fake.by_id("virtio-vol-9", "vdc")
    assert scan(fake.sys, fake.dev).disks[0].id_serials == ("vol-9",)


def test_nvme_serial_comes_from_the_parent_device(fake):
    """A ``device/serial`` attribute (NVMe controller) counts as the disk's serial."""
    directory = fake.virtio_disk("nvme0n1", "0000:00:04.0")
    (directory / "device" / "serial").write_text("NVME-SERIAL-1   \n")
    assert scan(fake.sys, fake.dev).disks[0].attr_serial == "NVME-SERIAL-1"


def test_empty_or_missing_trees_give_an_empty_inventory(tmp_path):
    """A sysfs root without class/net or block yields no devices instead of failing."""
    inventory = scan(tmp_path, tmp_path / "dev")
    assert inventory.nics == ()
    assert inventory.disks == ()
