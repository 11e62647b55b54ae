"""Reading the ``devices`` list: the schema checked with the standard library alone."""

from __future__ import annotations

import pytest
from guest_machines import load_fixture

from imds.guest.devices import Device, parse_devices
from imds.guest.errors import SourceError


def test_example_fixture_parses_every_entry():
    """All four example.json entries are kept, with their bus, address, MAC, serial and tags."""
    entries = parse_devices(load_fixture("example"))
    assert entries.problems == ()
    assert entries.devices[0] == Device(
        index=0, type="nic", bus="pci", tags=("nfvfunc1",), address="0000:00:02.0", mac="01:22:22:42:22:21"
    )
    assert entries.devices[2] == Device(
        index=2, type="disk", bus="scsi", tags=("oracledb",), address="1:0:2:0", serial="disk-vol-2352423"
    )


@pytest.mark.parametrize("name", ["example", "xen", "lxc"])
def test_every_shared_fixture_is_valid(name):
    """The shared fixtures (pci/scsi, xen/ide, none buses) produce no problems."""
    entries = parse_devices(load_fixture(name))
    assert entries.problems == ()
    assert len(entries.devices) == len(load_fixture(name)["devices"])


def test_mac_and_hex_addresses_are_lower_cased():
    """An upper-case MAC and PCI address are accepted and lower-cased."""
    entries = parse_devices(
        {"devices": [{"type": "nic", "bus": "pci", "address": "0000:00:0A.0", "mac": "FA:16:3E:AA:BB:CC"}]}
    )
    assert entries.devices[0].mac == "fa:16:3e:aa:bb:cc"
    assert entries.devices[0].address == "0000:00:0a.0"


def test_duplicate_tags_collapse_in_order():
    """Repeated tags on one entry appear once, first occurrence first."""
    entries = parse_devices({"devices": [{"type": "disk", "bus": "none", "path": "/dev/sdb", "tags": ["b", "a", "b"]}]})
    assert entries.devices[0].tags == ("b", "a")


def test_unknown_properties_are_ignored():
    """The schema is append-only: extra properties (vlan, vf_trusted, future ones) do not reject an entry."""
    entries = parse_devices(
        {"devices": [{"type": "nic", "bus": "pci", "mac": "fa:16:3e:00:00:01", "vlan": 10, "vf_trusted": True, "x": 1}]}
    )
    assert entries.problems == ()
    assert entries.devices[0].tags == ()


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("nic", "skipped devices[0]: expected an object, got str"),
        ({"type": "gpu", "bus": "pci"}, "skipped devices[0]: \"type\" must be one of nic, disk, got 'gpu'"),
        ({"type": "disk", "bus": "sata"}, 'skipped devices[0]: "bus" must be one of pci, usb, ide, scsi, xen, none'),
        ({"type": "nic", "bus": "pci", "tags": ["a"]}, 'skipped devices[0]: a nic needs a "mac"'),
        ({"type": "nic", "bus": "none", "mac": "01:22:22"}, "skipped devices[0]: '01:22:22' is not a MAC address"),
        ({"type": "disk", "bus": "pci", "address": "00:02.0"}, "skipped devices[0]: '00:02.0' is not a pci address"),
        ({"type": "disk", "bus": "ide", "address": "2:0"}, "skipped devices[0]: '2:0' is not a ide address"),
        ({"type": "disk", "bus": "none", "tags": "db"}, 'skipped devices[0]: "tags" must be a list of non-empty'),
        ({"type": "disk", "bus": "none", "tags": [""]}, 'skipped devices[0]: "tags" must be a list of non-empty'),
        ({"type": "disk", "bus": "none", "serial": 42}, 'skipped devices[0]: "serial" must be a non-empty string'),
    ],
)
def test_invalid_entry_is_reported_and_skipped(entry, message):
    """An entry that breaks the schema is left out with a message naming its index and the fault."""
    good = {"type": "disk", "bus": "none", "path": "/dev/sdb", "tags": ["ok"]}
    entries = parse_devices({"devices": [entry, good]})
    assert len(entries.problems) == 1
    assert entries.problems[0].startswith(message)
    assert [device.index for device in entries.devices] == [1]


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([], "meta_data.json: expected a JSON object, got list"),
        ({"uuid": "x"}, 'meta_data.json: no "devices" key (device role tags)'),
        ({"devices": {"type": "nic"}}, 'meta_data.json: "devices" must be a list, got dict'),
    ],
)
def test_document_without_a_devices_list_is_an_error(document, message):
    """A document that is not an object, or has no ``devices`` list, raises SourceError saying so."""
    with pytest.raises(SourceError) as caught:
        parse_devices(document)
    assert str(caught.value).startswith(message)


def test_describe_names_the_entry_for_reports():
    """Reports name an entry by type, index, bus facts and tags."""
    device = parse_devices(load_fixture("lxc")).devices[2]
    assert device.describe() == "disk #2 (bus none, serial 'disk-vol-2352423', path '/dev/sda'; tags 'oracledb')"
