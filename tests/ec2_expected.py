"""The seed's example document and hollow's documented EC2 answers for it, shared by the EC2 tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers import fixture_json

REPO = next(p for p in Path(__file__).parents if (p / "pyproject.toml").is_file())

INSTANCE_ID = "cc40301c-4038-4011-af55-6eae3ba60246"
ED25519_KEY = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDtmDuGK3tzmR4o/7QENvMOitBvsO8uN4Z1WblfVWyAg test@testmachine.local"
)
RSA_KEY = (
    "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAACAQDYgqt+YAYiF0v3PohhkqR3rCul3TaksPbYE+e0VyGXE7C/bjBKDCBqrjN1MmbwFzatY7KLXzin"
    "5tFJCcuyDwAh3poSI57YYufYQAfBhG3u8Z++Q4RHdgjrSY0OspQR0dEHfK64FQ/6jbbtfWat09KN9F9Gay5BHl93B+OOb0qVq7Pf9Z7hC0OeMDsE"
    "tx6jhZmDeWfAPfLPVkk2bVaORFwFuF3cbNT3CtTAXaHTl4JWpL98ZVYFNm35s0x+eFbG5hyU9OW9MgOU3a21SKiGFt0673iQpwCC5jO1hyUVAsQd"
    "P1qRC2DbYhO0elVJ11GeXgz/BospqI+vmdEBRbo/vv6NVspxhOgyy+LpUDVSqX9FN0wWAtWoKN4WliEohCibuFNlIRUlfd9ZEvTCMZFE+xbwewCZ"
    "wmXT0aThbRLZleMjGGR5HDEv3YAYGm7XplaQH+XiTS9t2J2GQiCltlbTft/yUxMUs2Iq1iGn7RigMyaBvHdTFQW/l0Mqihip/0zT/7BtNu9A6Ooh"
    "WWl9Vv8cQZurUwt7pQ9L5XvtMTqpAJqTsacUsu1H2kERZ8PiUjfvYWjrM++PJu5OvkodpawxN4KRX63oso2PPbfo105BsMmmstTaIusp+2LBqzDM"
    "TQee9wdfMc2po8TEOHSnEsmAnnG8AGSMnSWODchJEPiFXtiaDw== test@testmachine.local"
)

# Hollow's documented output for the seed's example document, item by item
# (pkg/api/v1/ec2/metadata_types.go and its router tests): subtrees are listed without "/".
HOLLOW_SEED: dict[str, str] = {
    "": "instance-id\nhostname\niqn\nplan\nfacility\ntags\noperating-system\npublic-keys\n"
    "public-ipv4\npublic-ipv6\nlocal-ipv4",
    "instance-id": "cc40301c-4038-4011-af55-6eae3ba60246",
    "hostname": "metadata-example-01",
    "iqn": "iqn.2022-02.net.packet:device.cc40301c",
    "plan": "c3.medium.x86",
    "facility": "da11",
    "tags": "",
    "operating-system": "slug\ndistro\nversion\nlicense-activation\nimage-tag",
    "operating-system/slug": "ubuntu_20_04",
    "operating-system/distro": "ubuntu",
    "operating-system/version": "20.04",
    "operating-system/license-activation": "state",
    "operating-system/license-activation/state": "unlicensed",
    "operating-system/image-tag": "31853a2b0b2fcc4ee7fd5da5e53611303b60aafa",
    "public-keys": ED25519_KEY + "\n" + RSA_KEY,
    "public-ipv4": "40.91.78.229",
    "public-ipv6": "2001:0db8:8583:0000::9",
    "local-ipv4": "10.70.17.9",
}


def seed() -> dict[str, Any]:
    """A fresh copy of the seed's example document."""
    return fixture_json("metadata-example.json")
