"""Instance records in the admin wire format, for reading out (``imds get``, ``imds export``).

The shape is exactly what ``POST /device-metadata`` and ``POST /device-userdata`` accept
(``imds.services.records.wire``), merged into one object per instance, so an export can be
imported again and pushed to any hollow-compatible service::

    {"id": "7d0a…", "ipAddresses": ["10.0.0.5", "10.20.0.0/16"],
     "metadata": {...}, "userdata": "#cloud-config…", "userdata_encoding": "text"}

``metadata`` and ``userdata`` are present only when stored. Userdata that is not UTF-8
is base64 with ``"userdata_encoding": "base64"``. An instance with a Ganeti OS record
also has ``"os"`` (``imds.services.ganeti.transfer``: private values unless ``private=False``,
never secret ones).
"""

from __future__ import annotations

import base64
from typing import Any

from imds.errors import NotFound
from imds.models import Instance
from imds.services.catalog.addresses import display
from imds.services.ganeti.crypto import PrivateCipher
from imds.services.ganeti.transfer import os_to_wire


def to_wire(instance: Instance, cipher: PrivateCipher | None = None, *, private: bool = True) -> dict[str, Any]:
    """One instance as an upsert object (see the module docstring).

    ``cipher`` opens private OS values (without it only unencrypted ones open; one that does
    not is a ConfigError naming it).
    """
    record: dict[str, Any] = {"id": instance.id, "ipAddresses": [display(a) for a in instance.addresses]}
    if instance.metadata is not None:
        record["metadata"] = instance.metadata
    if instance.userdata is not None:
        try:
            record["userdata"], record["userdata_encoding"] = instance.userdata.decode(), "text"
        except UnicodeDecodeError:
            record["userdata"] = base64.b64encode(instance.userdata).decode()
            record["userdata_encoding"] = "base64"
    if instance.os is not None:
        record["os"] = os_to_wire(instance.id, instance.os, cipher or PrivateCipher([]), private=private)
    return record


def summary(record: dict[str, Any]) -> dict[str, Any]:
    """What ``imds list`` shows of one wire record: id, hostname, addresses, which record types exist."""
    metadata = record.get("metadata")
    hostname = metadata.get("hostname") if isinstance(metadata, dict) else None
    userdata = record.get("userdata")
    size = None
    if isinstance(userdata, str):
        base64_encoded = record.get("userdata_encoding") == "base64"
        size = len(base64.b64decode(userdata)) if base64_encoded else len(userdata.encode())
    return {
        "id": record["id"],
        "hostname": hostname if isinstance(hostname, str) else None,
        "ipAddresses": list(record.get("ipAddresses", [])),
        "metadata": isinstance(metadata, dict),
        "userdata_bytes": size,
    }


class InstanceNotStored(NotFound):
    """No record of any kind is stored for this instance id."""

    def __init__(self, instance_id: str) -> None:
        super().__init__(f"no instance {instance_id} is stored")
        self.instance_id = instance_id
