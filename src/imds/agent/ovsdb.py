"""Reading and watching OVSDB: which VM ports are plugged into the integration bridge.

A VM port is an Interface on the integration bridge whose ``external_ids`` carry
``vm-uuid`` (the instance id) and ``attached-mac`` (the MAC the hypervisor gave the VM),
as libvirt/Nova plug them. Its Port's ``tag`` is the local VLAN (untagged: network 0).
The tenant, when the plugging side records one, is read from ``external_ids:tenant-id``
(or ``project-id``).

Reads are one ``ovsdb-client transact`` of three selects, so Bridge, Port and Interface
come from the same snapshot. Changes are watched with ``ovsdb-client monitor`` on the
Interface table: every line it prints means "something changed, resync".
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from imds.agent.command import run
from imds.errors import OvsCommandFailed

MONITORED = "name,ofport,external_ids,other_config"
TENANT_KEYS = ("tenant-id", "project-id")


@dataclass(frozen=True)
class Interface:
    """One OVS Interface as the agent needs it."""

    name: str
    ofport: int  # -1 when OVS has not (or could not) assign one
    type: str
    external_ids: Mapping[str, str] = field(default_factory=dict)
    other_config: Mapping[str, str] = field(default_factory=dict)
    tag: int = 0  # the Port's tag; 0 when untagged


@dataclass(frozen=True)
class VmPort:
    """An Interface that Nova plugged for a VM."""

    name: str
    ofport: int
    vm_uuid: str
    mac: str
    tag: int
    tenant: str | None
    other_config: Mapping[str, str]


@dataclass(frozen=True)
class Snapshot:
    """Bridges (name → datapath_type and interface names) and every interface by name."""

    bridges: Mapping[str, tuple[str, tuple[str, ...]]]
    interfaces: Mapping[str, Interface]

    def vm_ports(self, bridge: str) -> list[VmPort]:
        """The VM ports on ``bridge`` that have an OpenFlow port number, sorted by name."""
        found = []
        for name in self.bridges.get(bridge, ("", ()))[1]:
            iface = self.interfaces[name]
            uuid = iface.external_ids.get("vm-uuid", "").strip()
            mac = iface.external_ids.get("attached-mac", "").strip().lower()
            if not uuid or not mac or iface.ofport <= 0:
                continue
            tenant = next((iface.external_ids[k] for k in TENANT_KEYS if iface.external_ids.get(k)), None)
            found.append(VmPort(name, iface.ofport, uuid, mac, iface.tag, tenant, iface.other_config))
        return sorted(found, key=lambda p: p.name)


def _datum(value: Any) -> Any:
    """An OVSDB JSON datum as Python: atoms as they are, sets as lists, maps as dicts, uuids as strings."""
    if isinstance(value, list) and len(value) == 2 and value[0] in ("set", "map", "uuid", "named-uuid"):
        kind, body = value
        if kind == "set":
            return [_datum(item) for item in body]
        if kind == "map":
            return {_datum(k): _datum(v) for k, v in body}
        return body
    return value


def _scalar(value: Any, default: Any) -> Any:
    """An optional column (an empty set when unset) as a scalar."""
    value = _datum(value)
    if isinstance(value, list):
        return value[0] if value else default
    return value


def parse_snapshot(reply: list[dict[str, Any]]) -> Snapshot:
    """Build a Snapshot from the replies to the three selects of ``Ovsdb.snapshot``."""
    bridges_rows, ports_rows, ifaces_rows = (part["rows"] for part in reply)
    iface_names: dict[str, str] = {}
    interfaces_raw: dict[str, dict[str, Any]] = {}
    for row in ifaces_rows:
        iface_names[_datum(row["_uuid"])] = row["name"]
        interfaces_raw[row["name"]] = row
    port_ifaces: dict[str, list[str]] = {}
    tags: dict[str, int] = {}
    for row in ports_rows:
        members = _datum(row["interfaces"])
        names = [iface_names[u] for u in (members if isinstance(members, list) else [members]) if u in iface_names]
        port_ifaces[_datum(row["_uuid"])] = names
        for name in names:
            tags[name] = int(_scalar(row["tag"], 0))
    bridges: dict[str, tuple[str, tuple[str, ...]]] = {}
    for row in bridges_rows:
        ports = _datum(row["ports"])
        names = [n for p in (ports if isinstance(ports, list) else [ports]) for n in port_ifaces.get(p, [])]
        bridges[row["name"]] = (row["datapath_type"], tuple(sorted(names)))
    interfaces = {
        name: Interface(
            name=name,
            ofport=int(_scalar(row["ofport"], -1)),
            type=row["type"],
            external_ids=_datum(row["external_ids"]),
            other_config=_datum(row["other_config"]),
            tag=tags.get(name, 0),
        )
        for name, row in interfaces_raw.items()
    }
    return Snapshot(bridges, interfaces)


_SELECTS = [
    {"op": "select", "table": "Bridge", "where": [], "columns": ["name", "ports", "datapath_type"]},
    {"op": "select", "table": "Port", "where": [], "columns": ["_uuid", "interfaces", "tag"]},
    {"op": "select", "table": "Interface", "where": [],
     "columns": ["_uuid", "name", "ofport", "type", "external_ids", "other_config"]},
]


class Ovsdb:
    """The OVSDB server at ``remote`` (``unix:PATH``): snapshots, writes and a change monitor."""

    def __init__(self, remote: str) -> None:
        self.remote = remote

    def snapshot(self) -> Snapshot:
        """Bridges, ports and interfaces, read in one transaction."""
        query = json.dumps(["Open_vSwitch", *_SELECTS])
        text = run("ovsdb-client", "--format=json", "transact", self.remote, query)
        try:
            reply = json.loads(text)
        except ValueError as exc:
            raise OvsCommandFailed("ovsdb-client transact", f"unreadable reply: {text[:200]}") from exc
        errors = [part["error"] for part in reply if isinstance(part, dict) and "error" in part]
        if errors:
            raise OvsCommandFailed("ovsdb-client transact", str(errors))
        return parse_snapshot(reply)

    def vsctl(self, *args: str) -> str:
        """``ovs-vsctl --no-wait`` (never blocks on a stopped ovs-vswitchd) against this database."""
        return run("ovs-vsctl", f"--db={self.remote}", "--no-wait", "--timeout=10", *args)

    def monitor(self) -> subprocess.Popen[bytes]:
        """A child ``ovsdb-client monitor`` on the Interface table; each line it prints is a change."""
        command = ["ovsdb-client", "--format=json", "monitor", self.remote, "Open_vSwitch", "Interface", MONITORED]
        return subprocess.Popen(  # noqa: S603 - the OVS client from PATH, like every OVS tool the agent runs
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0
        )
