"""The udev rules text: keys, symlinks, tags, and what cannot be written safely."""

from __future__ import annotations

import pytest
from guest_machines import MAC, example_machine, load_fixture, lxc_machine, xen_machine

from imds.guest.devices import parse_devices
from imds.guest.match import Key, Match, match_devices
from imds.guest.rules import HEADER, render, tag_problem, value_is_safe
from imds.guest.sysfs import scan


def _rules(fake, document, **options):
    matching = match_devices(parse_devices(document).devices, scan(fake.sys, fake.dev))
    return render(matching.matches, **options)


SERIAL_KEY = Key("attr-serial", "vol-1")


def _disk(tags=("db",), keys=(SERIAL_KEY,)):
    return Match("disk", "vdb", tuple(tags), "serial", tuple(keys))


def test_example_rules_text(fake):
    """example.json: NICs on MAC + PCI address, SCSI disk on ID_SERIAL, virtio disk on ATTRS{serial}."""
    rendered = _rules(example_machine(fake), load_fixture("example"))
    assert rendered.text == HEADER + (
        "\n# nic eth0 (found by pci address): nfvfunc1\n"
        'SUBSYSTEM=="net", ATTR{address}=="01:22:22:42:22:21", KERNELS=="0000:00:02.0", ENV{IMDS_TAG}="nfvfunc1"\n'
        "\n# nic eth1 (found by pci address): nfvfunc2\n"
        'SUBSYSTEM=="net", ATTR{address}=="01:22:22:42:22:21", KERNELS=="0000:00:03.0", ENV{IMDS_TAG}="nfvfunc2"\n'
        "\n# disk sda (found by serial): oracledb\n"
        'SUBSYSTEM=="block", ENV{DEVTYPE}=="disk", ENV{ID_SERIAL}=="0QEMU_QEMU_HARDDISK_disk-vol-2352423", '
        'ENV{IMDS_TAG}="oracledb", SYMLINK+="disk/by-tag/oracledb"\n'
        'SUBSYSTEM=="block", ENV{DEVTYPE}=="partition", ENV{ID_SERIAL}=="0QEMU_QEMU_HARDDISK_disk-vol-2352423", '
        'SYMLINK+="disk/by-tag/oracledb-part%n"\n'
        "\n# disk vdb (found by serial): squidcache\n"
        'SUBSYSTEM=="block", ENV{DEVTYPE}=="disk", ATTRS{serial}=="disk-vol-24235252", '
        'ENV{IMDS_TAG}="squidcache", SYMLINK+="disk/by-tag/squidcache"\n'
        'SUBSYSTEM=="block", ENV{DEVTYPE}=="partition", ATTRS{serial}=="disk-vol-24235252", '
        'SYMLINK+="disk/by-tag/squidcache-part%n"\n'
    )
    assert rendered.subsystems == ("block", "net")
    assert rendered.tagged == 4
    assert rendered.skipped == ()


def test_xen_rules_match_vif_and_kernel_names(fake):
    """xen.json: NICs on MAC + KERNELS=="vif-N"; each disk once, on its kernel name (KERNELS for partitions)."""
    lines = [line for line in _rules(xen_machine(fake), load_fixture("xen")).text.splitlines() if "==" in line]
    assert lines == [
        'SUBSYSTEM=="net", ATTR{address}=="01:22:22:42:22:21", KERNELS=="vif-0", ENV{IMDS_TAG}="nfvfunc1"',
        'SUBSYSTEM=="net", ATTR{address}=="01:22:22:42:22:21", KERNELS=="vif-1", ENV{IMDS_TAG}="nfvfunc2"',
        (
            'SUBSYSTEM=="block", ENV{DEVTYPE}=="disk", KERNEL=="xvda", ENV{IMDS_TAG}="oracledb", '
            'SYMLINK+="disk/by-tag/oracledb"'
        ),
        'SUBSYSTEM=="block", ENV{DEVTYPE}=="partition", KERNELS=="xvda", SYMLINK+="disk/by-tag/oracledb-part%n"',
        (
            'SUBSYSTEM=="block", ENV{DEVTYPE}=="disk", KERNEL=="xvdb", ENV{IMDS_TAG}="squidcache", '
            'SYMLINK+="disk/by-tag/squidcache"'
        ),
        'SUBSYSTEM=="block", ENV{DEVTYPE}=="partition", KERNELS=="xvdb", SYMLINK+="disk/by-tag/squidcache-part%n"',
    ]


def test_lxc_rules_use_kernel_names_serial_and_no_drivers_key(fake):
    """Bus none: veths (no driver) on MAC + KERNEL name; sda on its ID_SERIAL, sdb on its kernel name."""
    lines = [line for line in _rules(lxc_machine(fake), load_fixture("lxc")).text.splitlines() if "==" in line]
    assert lines == [
        'SUBSYSTEM=="net", ATTR{address}=="01:22:22:42:22:21", KERNEL=="eth0", ENV{IMDS_TAG}="nfvfunc1"',
        'SUBSYSTEM=="net", ATTR{address}=="01:22:22:42:22:21", KERNEL=="eth1", ENV{IMDS_TAG}="nfvfunc2"',
        (
            'SUBSYSTEM=="block", ENV{DEVTYPE}=="disk", ENV{ID_SERIAL}=="0QEMU_QEMU_HARDDISK_disk-vol-2352423", '
            'ENV{IMDS_TAG}="oracledb", SYMLINK+="disk/by-tag/oracledb"'
        ),
        (
            'SUBSYSTEM=="block", ENV{DEVTYPE}=="partition", ENV{ID_SERIAL}=="0QEMU_QEMU_HARDDISK_disk-vol-2352423", '
            'SYMLINK+="disk/by-tag/oracledb-part%n"'
        ),
        (
            'SUBSYSTEM=="block", ENV{DEVTYPE}=="disk", KERNEL=="sdb", ENV{IMDS_TAG}="squidcache", '
            'SYMLINK+="disk/by-tag/squidcache"'
        ),
        'SUBSYSTEM=="block", ENV{DEVTYPE}=="partition", KERNELS=="sdb", SYMLINK+="disk/by-tag/squidcache-part%n"',
    ]


def test_vpd_serial_alone_matches_on_id_serial_short(fake):
    """A SCSI disk whose serial is only in VPD page 0x80 (no by-id link) is matched on ENV{ID_SERIAL_SHORT}."""
    fake.scsi_disk("sdc", "0:0:3:0", serial="vol-7")
    (fake.dev / "disk" / "by-id" / "scsi-0QEMU_QEMU_HARDDISK_vol-7").unlink()
    document = {"devices": [{"type": "disk", "bus": "scsi", "serial": "vol-7", "tags": ["db"]}]}
    assert _rules(fake, document).text.splitlines()[-2] == (
        'SUBSYSTEM=="block", ENV{DEVTYPE}=="disk", ENV{ID_SERIAL_SHORT}=="vol-7", ENV{IMDS_TAG}="db", '
        'SYMLINK+="disk/by-tag/db"'
    )


def test_unique_mac_on_hardware_requires_a_driver(fake):
    """A MAC-only rule for a PCI NIC adds DRIVERS=="?*" so bridges and VLANs copying the MAC stay untagged."""
    fake.pci_nic("eth0", "fa:16:3e:00:00:01", "0000:00:03.0")
    document = {"devices": [{"type": "nic", "bus": "pci", "mac": "FA:16:3E:00:00:01", "tags": ["mgmt"]}]}
    assert _rules(fake, document).text.splitlines()[-1] == (
        'SUBSYSTEM=="net", ATTR{address}=="fa:16:3e:00:00:01", DRIVERS=="?*", ENV{IMDS_TAG}="mgmt"'
    )


def test_several_tags_give_several_symlinks_and_one_spaced_env():
    """Tags a, b: two SYMLINK+= per rule, IMDS_TAG "a b"."""
    lines = render((_disk(tags=("a", "b")),)).text.splitlines()
    assert lines[-2] == (
        'SUBSYSTEM=="block", ENV{DEVTYPE}=="disk", ATTRS{serial}=="vol-1", ENV{IMDS_TAG}="a b", '
        'SYMLINK+="disk/by-tag/a", SYMLINK+="disk/by-tag/b"'
    )
    assert lines[-1] == (
        'SUBSYSTEM=="block", ENV{DEVTYPE}=="partition", ATTRS{serial}=="vol-1", '
        'SYMLINK+="disk/by-tag/a-part%n", SYMLINK+="disk/by-tag/b-part%n"'
    )


@pytest.mark.parametrize(
    ("tag", "problem"),
    [
        ("has space", "contains whitespace"),
        ("tab\there", "contains whitespace"),
        ("new\nline", "contains whitespace"),
        ('quo"te', "contains a quote"),
        ("it's", "contains a quote"),
        ("a/b", "contains a slash"),
        ("a\\b", "contains a slash"),
        ("$kernel", "contains a udev substitution character ($ or %)"),
        ("100%", "contains a udev substitution character ($ or %)"),
        ("a*b", "contains '*' (allowed: letters, digits and #+-.:=@_)"),
        ("café", "contains 'é' (allowed: letters, digits and #+-.:=@_)"),
        ("..", "is a relative path component"),
        ("x" * 129, "is longer than 128 characters"),
    ],
)
def test_unsafe_tags_are_rejected_with_a_reason(tag, problem):
    """Tags udev cannot carry as a file name and quoted string are refused, saying why."""
    assert tag_problem(tag) == problem


@pytest.mark.parametrize("tag", ["oracledb", "nfv-func_1", "db.primary", "a:b=c@d#e+f", "x" * 128])
def test_plain_tags_are_accepted(tag):
    """Letters, digits and #+-.:=@_ pass unchanged."""
    assert tag_problem(tag) is None


def test_skipped_tags_are_reported_and_the_rest_kept():
    """One bad tag is left out and reported; the device keeps its other tags."""
    rendered = render((_disk(tags=("good", "bad tag")),))
    assert 'ENV{IMDS_TAG}="good", SYMLINK+="disk/by-tag/good"' in rendered.text
    assert "bad tag" not in rendered.text
    assert rendered.skipped == ("disk vdb: skipped tag 'bad tag': contains whitespace",)


def test_device_whose_tags_are_all_unsafe_gets_no_rule():
    """No usable tag, no rule: the file holds only the header."""
    rendered = render((_disk(tags=('"; RUN+="/bin/sh',)),))
    assert rendered.text == HEADER
    assert rendered.tagged == 0
    assert rendered.subsystems == ()


@pytest.mark.parametrize("value", ['vol"1', "vol\\1", "vol*", "vol?", "vol[1]", "a|b", "$env", "100%", "\x01", ""])
def test_unsafe_match_values(value):
    """Quotes, backslashes, globs, substitutions and control characters cannot be matched literally."""
    assert not value_is_safe(value)


def test_unsafe_serial_falls_back_to_the_next_key():
    """A local serial with a glob character gives way to the disk's PCI address."""
    found = _disk(keys=(Key("attr-serial", "vol*1"), Key("pci", "0000:00:07.0")))
    assert 'KERNELS=="0000:00:07.0"' in render((found,)).text
    assert "vol*1" not in render((found,)).text


def test_device_without_any_safe_key_is_skipped():
    """When no key can be written, the device is reported instead of matched loosely."""
    rendered = render((_disk(keys=(Key("attr-serial", "vol*1"),)),))
    assert rendered.text == HEADER
    assert rendered.skipped == ("disk vdb: no identifier of it can be written safely in a udev rule",)


def test_rename_nics_adds_name_from_the_first_tag(fake):
    """--rename-nics: NAME="<first tag>"; a KERNEL key also accepts the new name for later triggers."""
    lxc_machine(fake)
    lines = _rules(fake, load_fixture("lxc"), rename_nics=True).text.splitlines()
    assert (
        'SUBSYSTEM=="net", ATTR{address}=="01:22:22:42:22:21", KERNEL=="eth0|nfvfunc1", '
        'ENV{IMDS_TAG}="nfvfunc1", NAME="nfvfunc1"'
    ) in lines


def test_rename_refuses_names_the_kernel_would_not_take():
    """A first tag longer than 15 characters, or with ':', is not used as an interface name."""
    nic = Match("nic", "eth0", ("a-very-long-tag-name",), "MAC", (Key("mac", MAC),))
    rendered = render((nic,), rename_nics=True)
    assert "NAME=" not in rendered.text
    assert rendered.skipped == (
        "nic eth0: not renamed: tag 'a-very-long-tag-name' is not an interface name (1-15 of [0-9A-Za-z_.-])",
    )


def test_rename_refuses_a_name_twice():
    """Two NICs whose first tag is the same: only the first is renamed."""
    first = Match("nic", "eth0", ("uplink",), "MAC", (Key("mac", "fa:16:3e:00:00:01"),))
    second = Match("nic", "eth1", ("uplink",), "MAC", (Key("mac", "fa:16:3e:00:00:02"),))
    rendered = render((first, second), rename_nics=True)
    assert rendered.text.count('NAME="uplink"') == 1
    assert rendered.skipped == ("nic eth1: not renamed: another interface is already named 'uplink'",)


def test_without_rename_there_is_no_name():
    """NAME= appears only with --rename-nics."""
    nic = Match("nic", "eth0", ("uplink",), "MAC", (Key("mac", MAC),))
    assert "NAME=" not in render((nic,)).text
