"""Test data for the OpenStack, config drive and NoCloud tests: the seed fixtures."""

from __future__ import annotations

import copy
from typing import Any

from helpers import fixture_json

DEVICE_EXAMPLES = ("example", "xen", "lxc")
SEED_ID = "cc40301c-4038-4011-af55-6eae3ba60246"
VENDOR_DATA = {"cloud-init": "#cloud-config\nruncmd: [echo vendor]\n", "provider": {"region": "da"}}
USERDATA = "#cloud-config\n# héllo — ünïcødé ✓\nruncmd: [echo hi]\n"


def seed_document() -> dict[str, Any]:
    """The design's Equinix-shaped example document."""
    document: dict[str, Any] = fixture_json("metadata-example.json")
    return document


def devices(example: str = "example") -> list[dict[str, Any]]:
    """The ``devices`` list of device-role-tagging-<example>.json."""
    found: list[dict[str, Any]] = fixture_json(f"device-role-tagging-{example}.json")["devices"]
    return found


def device_schema() -> dict[str, Any]:
    """The design's device role tagging schema."""
    schema: dict[str, Any] = fixture_json("device-role-tagging.schema.json")
    return schema


def openstack_document(example: str = "example", **changes: Any) -> dict[str, Any]:
    """The seed document with device role tags and vendor data (network_data is derived from its network)."""
    document = copy.deepcopy(seed_document())
    document.update({"devices": devices(example), "vendor_data": VENDOR_DATA, **changes})
    return document

