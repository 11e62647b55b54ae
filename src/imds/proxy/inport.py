"""``--ovsdb unix:PATH --inport``: Dragonflow's scheme, the VM's OVS port encoded in its source address.

With ``imds agent --mode inport`` the flows rewrite each request's source to ``128.0.0.0 |
ofport`` of the VM's port on the integration bridge. This identifier maps it back: the
Interface on that bridge with that OpenFlow port number, its ``external_ids:vm-uuid`` and
tenant (``tenant-id`` or ``project-id``), read from OVSDB. The table lives in memory; a
background task re-reads it whenever ``ovsdb-client monitor`` reports an Interface change (a
port plugged, unplugged or renumbered), so ``identify`` is a dict lookup. OVS does not hand a
freed port number out again at once, so an unplugged VM's number never names another VM.

Usage::

    who = InportIdentifier(Ovsdb("unix:/var/run/openvswitch/db.sock"), "br-int")
    await who.start()
    await who.identify(ipaddress.ip_address("128.0.0.7"))   # Identity("…vm-uuid…", tenant)
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress

from imds import log
from imds.agent.flows import INPORT_BASE
from imds.agent.ovsdb import MONITORED, Ovsdb
from imds.errors import ConfigError, OvsCommandFailed
from imds.models import Address
from imds.proxy.identify import Identity

_INPORT_NET = ipaddress.IPv4Network(f"{INPORT_BASE}/16")
_log = log.get("proxy.inport")
RETRY = 1.0


def ofport_of(address: Address) -> int | None:
    """The OpenFlow port encoded in ``address`` (``128.0.0.0 | ofport``), or None for any other address."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if not isinstance(address, ipaddress.IPv4Address) or address not in _INPORT_NET:
        return None
    return (int(address) - int(INPORT_BASE)) or None


class InportIdentifier:
    """The VM ports of ``bridge`` by OpenFlow port number, kept current from OVSDB."""

    def __init__(self, ovsdb: Ovsdb, bridge: str) -> None:
        self.ovsdb = ovsdb
        self.bridge = bridge
        self.table: dict[int, Identity] = {}
        self._task: asyncio.Task[None] | None = None

    def load(self) -> None:
        """Re-read the bridge's VM ports (blocking: one ``ovsdb-client transact``)."""
        ports = self.ovsdb.snapshot().vm_ports(self.bridge)
        self.table = {p.ofport: Identity(p.vm_uuid, p.tenant) for p in ports}

    async def start(self) -> None:
        """First read (ConfigError if OVSDB cannot be read), then follow changes in the background."""
        try:
            await asyncio.to_thread(self.load)
        except OvsCommandFailed as exc:
            msg = f"--ovsdb {self.ovsdb.remote}: {exc.message}"
            raise ConfigError(msg) from exc
        _log.info("inport.loaded", bridge=self.bridge, ports=len(self.table))
        self._task = asyncio.create_task(self._follow())

    async def stop(self) -> None:
        """Stop following OVSDB."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def identify(self, peer: Address) -> Identity | None:
        """The VM at the port ``peer`` encodes, or None (not an in-port address, or no VM there)."""
        ofport = ofport_of(peer)
        return None if ofport is None else self.table.get(ofport)

    async def _follow(self) -> None:
        """Re-read on every monitor line; restart the monitor (after a pause) when it ends."""
        command = ("ovsdb-client", "--format=json", "monitor", self.ovsdb.remote, "Open_vSwitch", "Interface",
                   MONITORED)
        while True:
            process = await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
            )
            try:
                assert process.stdout is not None  # noqa: S101 - PIPE was asked for
                while await process.stdout.readline():
                    await self._reload()
            finally:
                if process.returncode is None:
                    process.terminate()
                    await process.wait()
            _log.warning("inport.monitor_ended", remote=self.ovsdb.remote)
            await asyncio.sleep(RETRY)
            await self._reload()

    async def _reload(self) -> None:
        try:
            await asyncio.to_thread(self.load)
        except OvsCommandFailed as exc:
            _log.warning("inport.reload_failed", error=exc.message)
