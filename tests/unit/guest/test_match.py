"""Tagged entries → local devices, for each shared fixture and the awkward cases around them."""

from __future__ import annotations

from guest_machines import MAC, example_machine, load_fixture, lxc_machine, xen_machine

from imds.guest.devices import parse_devices
from imds.guest.match import Key, Match, match_devices
from imds.guest.sysfs import scan


def _match(fake, document):
    return match_devices(parse_devices(document).devices, scan(fake.sys, fake.dev))


def _nic(mac=MAC, **fields):
    return {"type": "nic", "bus": "pci", "mac": mac, "tags": ["t"], **fields}


def test_example_nics_sharing_a_mac_are_told_apart_by_pci_address(fake):
    """Two NICs with one MAC: each entry lands on the interface at its PCI address, and the key says so."""
    matching = _match(example_machine(fake), load_fixture("example"))
    nics = [found for found in matching.matches if found.type == "nic"]
    assert nics == [
        Match("nic", "eth0", ("nfvfunc1",), "pci address", (Key("mac", MAC), Key("pci", "0000:00:02.0")), entries=(0,)),
        Match("nic", "eth1", ("nfvfunc2",), "pci address", (Key("mac", MAC), Key("pci", "0000:00:03.0")), entries=(1,)),
    ]
    assert matching.misses == ()


def test_example_disks_match_by_serial_with_their_address_as_a_fallback_key(fake):
    """The SCSI disk is found by serial (by-id ID_SERIAL, then VPD), the virtio disk by its serial attribute."""
    matching = _match(example_machine(fake), load_fixture("example"))
    disks = {found.name: found for found in matching.matches if found.type == "disk"}
    assert disks["sda"].tags == ("oracledb",)
    assert disks["sda"].keys == (
        Key("id-serial", "0QEMU_QEMU_HARDDISK_disk-vol-2352423"),
        Key("serial-short", "disk-vol-2352423"),
        Key("scsi", "1:0:2:0"),
    )
    assert disks["vdb"].keys == (
        Key("attr-serial", "disk-vol-24235252"),
        Key("id-serial", "disk-vol-24235252"),
        Key("pci", "0000:00:07.0"),
    )
    assert "vda" not in disks


def test_xen_same_serial_twice_is_one_disk_with_one_tag(fake):
    """The ide and xen entries of one volume become one rule for xvda, tagged once; the ide twin is no miss."""
    matching = _match(xen_machine(fake), load_fixture("xen"))
    disks = [(found.name, found.tags, found.found_by, found.keys, found.entries) for found in matching.matches[2:]]
    assert disks == [
        ("xvda", ("oracledb",), "path", (Key("kernel", "xvda"),), (2, 3)),
        ("xvdb", ("squidcache",), "path", (Key("kernel", "xvdb"),), (4, 5)),
    ]
    assert matching.misses == ()


def test_xen_nics_sharing_a_mac_are_told_apart_by_vif(fake):
    """Xen NIC address N is the netfront device vif-N."""
    matching = _match(xen_machine(fake), load_fixture("xen"))
    assert [(found.name, found.keys[1]) for found in matching.matches[:2]] == [
        ("eth0", Key("xen-vif", "vif-0")),
        ("eth1", Key("xen-vif", "vif-1")),
    ]


def test_lxc_bus_none_matches_by_devname_and_by_serial_or_path(fake):
    """Container veths are told apart by devname; sda by its serial, sdb (no serial visible) by path."""
    matching = _match(lxc_machine(fake), load_fixture("lxc"))
    assert [(found.name, found.tags, found.found_by, found.keys[-1], found.hardware) for found in matching.matches] == [
        ("eth0", ("nfvfunc1",), "devname", Key("kernel", "eth0"), False),
        ("eth1", ("nfvfunc2",), "devname", Key("kernel", "eth1"), False),
        ("sda", ("oracledb",), "serial", Key("serial-short", "disk-vol-2352423"), True),
        ("sdb", ("squidcache",), "path", Key("kernel", "sdb"), True),
    ]
    assert matching.misses == ()


def test_mac_matches_case_insensitively_and_alone_when_unique(fake):
    """An upper-case MAC in the metadata finds the lower-case sysfs address; a unique MAC needs no second key."""
    fake.pci_nic("eth0", "fa:16:3e:0a:0b:0c", "0000:00:03.0")
    matching = _match(fake, {"devices": [_nic("FA:16:3E:0A:0B:0C", address="0000:00:09.0")]})
    assert matching.matches == (Match("nic", "eth0", ("t",), "MAC", (Key("mac", "fa:16:3e:0a:0b:0c"),), entries=(0,)),)


def test_nic_at_the_address_with_another_mac_is_not_used(fake):
    """The address comes first, but a MAC that disagrees means the metadata describes another NIC."""
    fake.pci_nic("eth0", "fa:16:3e:00:00:01", "0000:00:03.0")
    matching = _match(fake, {"devices": [_nic("fa:16:3e:00:00:02", address="0000:00:03.0")]})
    assert matching.matches == ()
    assert matching.misses[0].reason == "the interface at PCI 0000:00:03.0 is eth0 with MAC fa:16:3e:00:00:01"


def test_a_shared_mac_without_address_is_ambiguous(fake):
    """Two local NICs with the entry's MAC and nothing else to go on: reported, not guessed."""
    example_machine(fake)
    matching = _match(fake, {"devices": [_nic()]})
    assert matching.matches == ()
    assert matching.misses[0].describe() == (
        "not found: nic #0 (bus pci, mac 01:22:22:42:22:21; tags 't'): "
        "MAC 01:22:22:42:22:21 is on eth0, eth1 and nothing else tells them apart"
    )


def test_entries_sharing_a_mac_never_fall_back_to_it(fake):
    """When the metadata itself lists a MAC twice, an entry whose address is gone is a miss, not a guess."""
    fake.pci_nic("eth0", MAC, "0000:00:02.0")
    matching = _match(fake, {"devices": [_nic(address="0000:00:02.0"), _nic(address="0000:00:04.0")]})
    assert [found.name for found in matching.matches] == ["eth0"]
    assert matching.misses[0].reason == (
        "no interface at pci address 0000:00:04.0; other entries share MAC 01:22:22:42:22:21, "
        "so it cannot tell them apart"
    )


def test_bridges_and_vlans_copying_a_mac_do_not_make_it_ambiguous(fake):
    """Only interfaces with a device behind them count for bus pci: a bridge with the same MAC is ignored."""
    fake.pci_nic("eth0", "fa:16:3e:00:00:01", "0000:00:03.0")
    fake.virtual_nic("br0", "fa:16:3e:00:00:01")
    matching = _match(fake, {"devices": [_nic("fa:16:3e:00:00:01")]})
    assert [(found.name, found.keys) for found in matching.matches] == [("eth0", (Key("mac", "fa:16:3e:00:00:01"),))]


def test_virtio_serial_truncated_to_20_characters_still_matches(fake):
    """Nova's 36-character volume id as serial: virtio-blk shows its first 20 characters."""
    volume = "3d2a5c4e-1b7f-4c1a-9a52-0f7c3e9d8b11"
    fake.virtio_disk("vdb", "0000:00:07.0", serial=volume)
    matching = _match(fake, {"devices": [{"type": "disk", "bus": "pci", "serial": volume, "tags": ["db"]}]})
    assert matching.matches[0].name == "vdb"
    assert matching.matches[0].keys[0] == Key("attr-serial", volume[:20])


def test_disk_at_the_address_with_another_serial_is_not_used(fake):
    """A disk found by address whose own serial contradicts the metadata is reported, not tagged."""
    fake.virtio_disk("vdb", "0000:00:07.0", serial="other-volume")
    disk = {"type": "disk", "bus": "pci", "address": "0000:00:07.0", "serial": "vol-1", "tags": ["db"]}
    matching = _match(fake, {"devices": [disk]})
    assert matching.matches == ()
    assert matching.misses[0].reason == (
        "no disk has serial 'vol-1'; vdb at pci address 0000:00:07.0 has serial 'other-volume'"
    )


def test_disk_without_serial_is_found_by_address(fake):
    """No serial in the metadata: the SCSI address finds the disk and becomes its key."""
    fake.scsi_disk("sdc", "2:0:0:3")
    matching = _match(fake, {"devices": [{"type": "disk", "bus": "scsi", "address": "2:0:0:3", "tags": ["logs"]}]})
    assert [(found.name, found.found_by, found.keys) for found in matching.matches] == [
        ("sdc", "scsi address", (Key("scsi", "2:0:0:3"),))
    ]


def test_missing_devices_are_misses_with_reasons(fake):
    """A tagged NIC and disk that are not here are reported with what was tried."""
    matching = _match(fake, load_fixture("example"))
    assert matching.matches == ()
    assert [miss.reason for miss in matching.misses] == [
        (
            "no interface at pci address 0000:00:02.0; other entries share MAC 01:22:22:42:22:21, "
            "so it cannot tell them apart"
        ),
        (
            "no interface at pci address 0000:00:03.0; other entries share MAC 01:22:22:42:22:21, "
            "so it cannot tell them apart"
        ),
        "no disk has serial 'disk-vol-2352423'; no disk at scsi address 1:0:2:0",
        "no disk has serial 'disk-vol-24235252'; no disk at pci address 0000:00:07.0",
    ]


def test_a_missing_serial_group_is_reported_once_with_each_attempt(fake):
    """Both xen.json entries of a volume missing: one miss naming each entry's reason."""
    matching = _match(fake, load_fixture("xen"))
    assert matching.misses[2].describe() == (
        "not found: disk #2 (bus ide, address 0:0, serial 'disk-vol-123456'; tags 'oracledb'): "
        "#2: no disk has serial 'disk-vol-123456'; #3: no disk has serial 'disk-vol-123456'; no disk named xvda"
    )


def test_untagged_entries_are_ignored(fake):
    """Nova lists untagged vf_trusted NICs too: they are neither matched nor missed."""
    matching = _match(fake, {"devices": [{"type": "nic", "bus": "pci", "mac": MAC, "vf_trusted": True}]})
    assert matching.matches == ()
    assert matching.misses == ()


def test_two_entries_on_one_disk_merge_their_tags(fake):
    """Different serials that land on the same disk by path give one rule with both tags, and a note."""
    fake.xen_disk("xvdc", 51744)
    disk = {"type": "disk", "bus": "xen", "path": "/dev/xvdc"}
    entries = [{**disk, "serial": "a", "tags": ["x"]}, {**disk, "serial": "b", "tags": ["y"]}]
    matching = _match(fake, {"devices": entries})
    assert [(found.name, found.tags, found.entries) for found in matching.matches] == [("xvdc", ("x", "y"), (0, 1))]
    assert matching.notes == ("disk xvdc: entries #0 and #1 describe the same device; their tags are merged",)
