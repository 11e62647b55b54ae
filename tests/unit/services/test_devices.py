"""Device role tags and the other OpenStack parts: schema errors with field paths, the tag rule, the shipped schema."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from helpers import fixture_json
from imds.errors import Problem
from imds.services.records.devices import check_devices, schema
from imds.services.records.parts import check_parts

EXAMPLES = ("example", "xen", "lxc")
TAG_RULE = "a tag names one logical device per device type"


def example(name: str) -> list[dict[str, Any]]:
    devices: list[dict[str, Any]] = fixture_json(f"device-role-tagging-{name}.json")["devices"]
    return devices


def fields(problems: list[Problem]) -> list[str]:
    return [p.field for p in problems]


# --- the shipped schema -----------------------------------------------------------------------------------


def contains(big: Any, small: Any, where: str = "$") -> None:
    """``big`` has everything ``small`` has (objects may have grown; everything else is equal)."""
    if isinstance(small, dict):
        assert isinstance(big, dict), where
        for key, value in small.items():
            assert key in big, f"{where}.{key} was removed"
            contains(big[key], value, f"{where}.{key}")
    else:
        assert big == small, where


def test_the_packaged_schema_only_grows_from_the_fixture():
    """The schema in the package holds every definition and property of the design's fixture (append-only)."""
    fixture = fixture_json("device-role-tagging.schema.json")
    contains(schema(), fixture)
    Draft202012Validator.check_schema(schema())
    assert schema()["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_seed_examples_are_valid(name):
    """The example, Xen and LXC documents pass the schema and the tag rule, and the schema itself agrees."""
    assert check_devices(example(name)) == []
    assert list(Draft202012Validator(schema()).iter_errors({"devices": example(name)})) == []


# --- schema errors -------------------------------------------------------------------------------------------


def test_a_bad_mac_is_named_by_its_field_and_rule():
    """A NIC's malformed MAC is reported at metadata.devices[N].mac with the failing keyword, not as a oneOf miss."""
    devices = example("example")
    devices[1]["mac"] = "01:22:22:42:22"
    [problem] = check_devices(devices)
    assert problem.field == "metadata.devices[1].mac"
    assert "'01:22:22:42:22' does not match" in problem.message
    assert problem.message.endswith("(schema: pattern)")


def test_the_bus_branch_is_chosen_by_the_bus_value():
    """A PCI address in the wrong form is a pattern error on .address (the pci branch), not a list of every bus."""
    devices = example("example")
    devices[3]["address"] = "00:07.0"
    [problem] = check_devices(devices)
    assert problem.field == "metadata.devices[3].address"
    assert problem.message.endswith("(schema: pattern)")


def test_an_unknown_type_or_bus_lists_the_allowed_values():
    """An unknown type ('gpu') and bus ('warp') are each reported once with the values the schema allows."""
    problems = check_devices([{"type": "gpu", "bus": "pci"}, {"type": "disk", "bus": "warp"}])
    assert problems == [
        Problem("metadata.devices[0].type", '"gpu" is not one of "nic", "disk" (schema: const)'),
        Problem("metadata.devices[1].bus",
                '"warp" is not one of "pci", "usb", "ide", "scsi", "xen", "none" (schema: const)'),
    ]


def test_missing_required_fields_are_named():
    """A NIC without bus and mac: each missing field is its own path, reported once."""
    problems = check_devices([{"type": "nic", "tags": ["a"]}])
    assert sorted(fields(problems)) == ["metadata.devices[0].bus", "metadata.devices[0].mac"]
    assert all(p.message == "is required (schema: required)" for p in problems)


def test_ranges_types_and_shapes():
    """A vlan over 4095, a non-string tag, an empty tag, a non-object entry and a non-list value are each named."""
    problems = check_devices([
        {"type": "nic", "bus": "none", "mac": "01:22:22:42:22:21", "vlan": 5000},
        {"type": "disk", "bus": "ide", "tags": [1, ""]},
        "disk",
    ])
    assert fields(problems) == [
        "metadata.devices[0].vlan", "metadata.devices[1].tags[0]", "metadata.devices[1].tags[1]", "metadata.devices[2]",
    ]
    assert [p.message.rsplit("(", 1)[1] for p in problems] == ["schema: maximum)", "schema: type)",
                                                               "schema: minLength)", "schema: type)"]
    assert check_devices({"nic": 1}) == [
        Problem("metadata.devices", "{'nic': 1} is not of type 'array' (schema: type)"),
    ]


# --- the tag rule ----------------------------------------------------------------------------------------------


def test_two_nics_may_not_share_a_tag():
    """A second NIC tagged like the first is refused at its own index, naming the first and the rule."""
    devices = example("example")
    devices[1]["tags"] = ["nfvfunc1"]
    [problem] = check_devices(devices)
    assert problem.field == "metadata.devices[1]"
    assert "tag 'nfvfunc1' already names nic metadata.devices[0]" in problem.message
    assert TAG_RULE in problem.message


def test_a_nic_and_a_disk_may_share_a_tag():
    """Tags are per device type: a NIC and a disk both tagged 'db' is fine."""
    devices = example("example")
    devices[0]["tags"] = ["oracledb"]
    assert check_devices(devices) == []


def test_disks_share_a_tag_only_when_they_are_the_same_backend():
    """Two disks with one tag pass with the same serial (Xen's IDE + PV view) and fail with different serials."""
    devices = example("xen")
    assert check_devices(devices) == []
    devices[3]["serial"] = "disk-vol-999"
    [problem] = check_devices(devices)
    assert problem.field == "metadata.devices[3]"
    assert "tag 'oracledb' already names disk metadata.devices[2]" in problem.message
    del devices[2]["serial"], devices[3]["serial"]
    assert fields(check_devices(devices)) == ["metadata.devices[3]"]


def test_schema_and_tag_problems_are_reported_together():
    """Every problem is reported at once: a bad MAC and a shared NIC tag in one list."""
    devices = copy.deepcopy(example("lxc"))
    devices[0]["mac"] = "zz"
    devices[1]["tags"] = ["nfvfunc1"]
    assert fields(check_devices(devices)) == ["metadata.devices[0].mac", "metadata.devices[1]"]


# --- network_data and vendor_data -----------------------------------------------------------------------------


def test_absent_parts_are_fine_and_present_ones_are_checked():
    """A document without parts has no problems; bad network_data and vendor_data are named field by field."""
    assert check_parts({"hostname": "a"}) == []
    problems = check_parts({
        "vendor_data": [1],
        "network_data": {
            "links": [{"id": "eth0", "type": "phy"}, {"type": "phy"}, 3],
            "networks": [{"link": "eth9", "type": "ipv4"}, {"type": "ipv4"}],
            "services": "dns",
        },
    })
    assert problems == [
        Problem("metadata.network_data.links[2]", "must be an object"),
        Problem("metadata.network_data.services", "must be a list of objects"),
        Problem("metadata.network_data.links[1].id", "is required (a string)"),
        Problem("metadata.network_data.networks[0].link", "names no link: 'eth9' is not a links[].id"),
        Problem("metadata.network_data.networks[1].link", "is required (a string)"),
        Problem("metadata.vendor_data", "must be a JSON object"),
    ]
    assert check_parts({"network_data": "x"}) == [
        Problem("metadata.network_data", "must be a JSON object with links, networks and services lists"),
    ]


def test_parts_include_the_device_checks():
    """check_parts reports device problems under metadata.devices."""
    assert fields(check_parts({"devices": [{"type": "nic"}]})) == ["metadata.devices[0].bus", "metadata.devices[0].mac"]


def test_a_link_id_that_is_no_string_is_a_problem_not_a_crash():
    """links[].id = [] was unhashable (TypeError, a 500); now it is named, and a network naming it finds no link."""
    problems = check_parts({"network_data": {"links": [{"id": [], "type": "phy"}],
                                             "networks": [{"link": "eth0", "type": "ipv4"}]}})
    assert problems == [
        Problem("metadata.network_data.links[0].id", "is required (a string)"),
        Problem("metadata.network_data.networks[0].link", "names no link: 'eth0' is not a links[].id"),
    ]
