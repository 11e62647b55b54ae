"""Dragonflow's in-port identification: source ``128.0.0.0 | ofport`` → the VM plugged at that port.

With ``imds agent --mode inport`` the flows rewrite each request's source address to
``128.0.0.0 | ofport`` of the VM's port on the integration bridge. ``imds proxy --inport``
turns it back into the instance with ``InportIdentifier``: the Interface on that bridge with
that OpenFlow port number, its ``external_ids:vm-uuid`` (and ``tenant-id``/``project-id``),
read live from OVSDB. The table is re-read when older than ``max_age`` seconds, and at once
(at most every ``min_refresh`` seconds) when an address is not in it, so a VM plugged a moment
ago is found on its first request. OVS does not hand a freed port number out again at once,
so an entry at most ``max_age`` old cannot name another VM.

Usage::

    who = InportIdentifier(Ovsdb("unix:/var/run/openvswitch/db.sock"), "br-int")
    who.identify("128.0.0.7")   # PortIdentity(instance_id="…", tenant=None, port="tap…", ofport=7)
"""

from __future__ import annotations

import asyncio
import ipaddress
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from imds.agent.flows import INPORT_BASE
from imds.agent.ovsdb import Ovsdb

_INPORT_NET = ipaddress.IPv4Network(f"{INPORT_BASE}/16")


@dataclass(frozen=True)
class PortIdentity:
    """Who is behind an in-port address."""

    instance_id: str
    tenant: str | None
    port: str
    ofport: int


def ofport_of(address: str) -> int | None:
    """The OpenFlow port encoded in ``address`` (``128.0.0.0 | ofport``), or None for any other address."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if not isinstance(ip, ipaddress.IPv4Address) or ip not in _INPORT_NET:
        return None
    ofport = int(ip) - int(INPORT_BASE)
    return ofport or None


class InportIdentifier:
    """Maps in-port source addresses to VM ports of ``bridge``, live from OVSDB (thread-safe)."""

    def __init__(
        self,
        ovsdb: Ovsdb,
        bridge: str,
        *,
        max_age: float = 1.0,
        min_refresh: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ovsdb = ovsdb
        self.bridge = bridge
        self.max_age = max_age
        self.min_refresh = min_refresh
        self.clock = clock
        self._table: dict[int, PortIdentity] = {}
        self._read_at: float | None = None
        self._lock = threading.Lock()

    def _refresh(self) -> None:
        ports = self.ovsdb.snapshot().vm_ports(self.bridge)
        self._table = {p.ofport: PortIdentity(p.vm_uuid, p.tenant, p.name, p.ofport) for p in ports}
        self._read_at = self.clock()

    def identify(self, address: str) -> PortIdentity | None:
        """The VM behind ``address``, or None (not an in-port address, or no VM at that port)."""
        ofport = ofport_of(address)
        if ofport is None:
            return None
        with self._lock:
            age = None if self._read_at is None else self.clock() - self._read_at
            if age is None or age > self.max_age or (ofport not in self._table and age > self.min_refresh):
                self._refresh()
            return self._table.get(ofport)

    async def identify_async(self, address: str) -> PortIdentity | None:
        """``identify`` off the event loop (an OVSDB read is a subprocess)."""
        return await asyncio.to_thread(self.identify, address)
