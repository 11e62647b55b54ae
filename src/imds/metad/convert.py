"""A Ganeti instance, as its node daemon pushes it to metad, → the admin writes imds stores.

Ganeti's ``UpdateMetadata`` (lib/cmdlib/instance_utils.py) sends ``objects.Instance.ToDict()``
plus ``osparams_private`` and ``osparams_secret``. metad (src/Ganeti/Metad/Config.hs) keys the
instance by the ``ip`` of its first NIC whose ``name`` starts with ``ganeti:communication:``
and serves ``osparams`` as public, ``osparams_private`` as private and ``osparams_secret`` as
secret parameters (``osparams_public``, which a reinstall adds, is ignored by metad and here).

This module is pure: it checks the instance the way metad does (same messages) and builds the
two bodies the admin API takes (``POST /device-metadata`` and ``POST /device-os``), so the
same parsers (``parse_metadata_write``, ``parse_os_write``) apply every other rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from imds.errors import InvalidInput, Problem
from imds.metad.network import nic_network
from imds.models import PRIVATE, PUBLIC, SECRET

COMMUNICATION_PREFIX = "ganeti:communication:"  # Ganeti's instanceCommunicationNicPrefix
# Ganeti's instance keys → the visibility metad serves them with.
SECTIONS = (("osparams", PUBLIC), ("osparams_private", PRIVATE), ("osparams_secret", SECRET))
# A name given in two sections keeps the more protected visibility: secret beats private beats
# public, whatever order the sections come in (metad's JSON has the later duplicate key win, and
# it writes them in this order).
PROTECTION = {PUBLIC: 0, PRIVATE: 1, SECRET: 2}
SHOWN_KEYS = ("name", "os", "hypervisor", "primary_node", "tags", "ctime", "mtime")  # copied into the document
NIC_KEYS = ("name", "mac", "ip", "uuid", "nicparams", "network", "netinfo")
DISK_KEYS = ("uuid", "name", "mode", "size", "dev_type", "logical_id", "iv_name")
PARAM_KEYS = ("hvparams", "beparams")  # scalar values only
MODE = "run"  # metad serves at any time: run mode with communication on does the same in imds


@dataclass(frozen=True)
class Converted:
    """An instance's two writes, or ``skipped`` (no communication NIC) with both bodies None."""

    name: str
    metadata: dict[str, Any] | None
    os: dict[str, Any] | None

    @property
    def skipped(self) -> bool:
        """Whether metad would skip this instance (it has no communication NIC)."""
        return self.metadata is None


def refused(message: str) -> InvalidInput:
    """A refused call, with metad's message as it is (a problem without a field)."""
    return InvalidInput.one("", message)


def fail(message: str) -> InvalidInput:
    """The refusal of an instance metad cannot take either, with its message."""
    return refused(f"Could not get instance parameters: {message}")


def convert(instance: Any) -> Converted:
    """Check ``instance`` as metad's ``getInstanceParams`` does and build the admin bodies."""
    if not isinstance(instance, dict):
        raise fail("Expecting a dictionary")
    name = instance.get("name")
    if name is None:
        raise fail("Could not find instance name")
    if not isinstance(name, str):
        raise fail("Name is not a string")
    address = communication_ip(instance)
    if address is None:
        return Converted(name, None, None)
    instance_id = instance.get("uuid")
    if not isinstance(instance_id, str):
        raise fail("Could not find instance uuid (imds keeps the instance under it)")
    metadata = {"id": instance_id, "ipAddresses": [address], "metadata": _document(instance, address)}
    return Converted(name, metadata, _os_body(instance, instance_id))


def communication_ip(instance: dict[str, Any]) -> str | None:
    """The communication NIC's IP; None without such a NIC; metad's messages for broken NICs."""
    nics = instance.get("nics")
    if nics is None:
        raise fail("Could not find OS parameters key 'nics'")
    if not isinstance(nics, list):
        raise fail("Instance nics is not an array")
    for nic in nics:
        if not isinstance(nic, dict):
            raise fail("Found wrong data in instance NICs")
        nic_name = nic.get("name")
        if isinstance(nic_name, str) and nic_name.startswith(COMMUNICATION_PREFIX):
            if "ip" not in nic:
                raise fail("Could not find instance communication IP")
            if not isinstance(nic["ip"], str):
                raise fail("Instance communication IP is not a string")
            return nic["ip"]
    return None


def _document(instance: dict[str, Any], address: str) -> dict[str, Any]:
    """The metadata document: the hostname, Ganeti's public facts (never an OS parameter) and the network.

    ``network`` is the NICs as every flavor describes a network (``imds.metad.network``).

    What ``imds.services.ganeti.environment`` needs for the OS scripts' environment is kept:
    the disks (Ganeti 3.0 pushes their UUIDs; disk objects are reduced to ``DISK_KEYS``), the
    NICs with their ``nicparams`` and network, the hypervisor and backend parameters.
    """
    ganeti: dict[str, Any] = {key: instance[key] for key in SHOWN_KEYS if key in instance}
    ganeti["nics"] = [
        {key: nic[key] for key in NIC_KEYS if key in nic}
        for nic in instance.get("nics", ())
        if isinstance(nic, dict)
    ]
    disks = instance.get("disks")
    if isinstance(disks, list):
        ganeti["disks"] = [
            {key: disk[key] for key in DISK_KEYS if key in disk} if isinstance(disk, dict) else disk
            for disk in disks
            if isinstance(disk, dict | str)
        ]
    for key in PARAM_KEYS:
        params = instance.get(key)
        if isinstance(params, dict):
            ganeti[key] = {name: value for name, value in params.items() if isinstance(value, str | int | float | bool)}
    ganeti["communication_ip"] = address
    return {"id": instance["uuid"], "hostname": instance["name"], "ganeti": ganeti,
            "network": nic_network(instance.get("nics"))}


def _os_body(instance: dict[str, Any], instance_id: str) -> dict[str, Any] | None:
    """The ``POST /device-os`` body; None when the instance names no OS (nothing to serve scripts from)."""
    os_type = instance.get("os")
    if not os_type:
        return None
    problems: list[Problem] = []
    parameters: dict[str, Any] = {}
    for key, visibility in sorted(SECTIONS, key=lambda section: PROTECTION[section[1]]):
        section = instance.get(key) or {}
        if not isinstance(section, dict):
            problems.append(Problem(key, "must be an object of NAME: value"))
            continue
        for name, value in section.items():
            held = parameters.get(name)
            if held is not None and PROTECTION[held["visibility"]] > PROTECTION[visibility]:
                continue  # never made less protected
            parameters.pop(name, None)  # keep metad's order: a redefined name moves to its new section
            parameters[name] = {"value": value, "visibility": visibility}
    if problems:
        raise InvalidInput(problems)
    return {"id": instance_id, "os_type": os_type, "mode": MODE, "communication": True, "parameters": parameters}
