"""In-port identification against a real OVSDB: 128.0.0.0 | ofport → the VM's vm-uuid, live."""

from __future__ import annotations

import ipaddress

import pytest

from imds.agent.inport import InportIdentifier, ofport_of
from imds.agent.ovsdb import Ovsdb
from ovs_harness import ovs_daemons


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _plug(ovs, bridge: str, name: str, uuid: str, tenant: str | None = None) -> int:
    ids = [f"external_ids:vm-uuid={uuid}", "external_ids:attached-mac=02:00:00:00:00:01"]
    if tenant:
        ids.append(f"external_ids:tenant-id={tenant}")
    ovs.vsctl("add-port", bridge, name, "--", "set", "Interface", name, "type=internal", *ids)
    return ovs.ofport(name)


def _address(ofport: int) -> str:
    return str(ipaddress.IPv4Address("128.0.0.0") + ofport)


def test_ofport_of_accepts_only_the_inport_range():
    """Only 128.0.0.1-128.0.255.255 (also IPv4-mapped) encode a port."""
    assert ofport_of("128.0.0.7") == 7
    assert ofport_of("::ffff:128.0.1.0") == 256
    for other in ("128.0.0.0", "128.1.0.1", "10.0.0.7", "fe80::1", "junk"):
        assert ofport_of(other) is None


def test_identifies_vms_by_port_and_follows_plugging(tmp_path):
    """An address maps to the VM at that port; a new port is found at once; a removed one is forgotten."""
    with ovs_daemons(tmp_path) as ovs:
        bridge, other = f"bi{ovs.tag}", f"bo{ovs.tag}"
        ovs.add_bridge(bridge)
        ovs.add_bridge(other)
        names = [f"ia{ovs.tag}", f"ib{ovs.tag}", f"ic{ovs.tag}"]
        try:
            first = _plug(ovs, bridge, names[0], "uuid-first", tenant="t1")
            clock = Clock()
            who = InportIdentifier(Ovsdb(f"unix:{ovs.db_sock}"), bridge, clock=clock)
            found = who.identify(_address(first))
            assert found is not None
            assert (found.instance_id, found.tenant, found.port) == ("uuid-first", "t1", names[0])
            assert who.identify("10.0.0.1") is None

            # Plugged after the first read: an unknown port triggers a re-read (past min_refresh).
            second = _plug(ovs, bridge, names[1], "uuid-second")
            clock.now += 0.5
            assert who.identify(_address(second)).instance_id == "uuid-second"  # type: ignore[union-attr]

            # A port on another bridge is never taken for a VM of this one.
            elsewhere = _plug(ovs, other, names[2], "uuid-elsewhere")
            clock.now += 5
            assert all(p is None or p.instance_id != "uuid-elsewhere" for p in [who.identify(_address(elsewhere))])

            # Unplugged: gone once the table is older than max_age.
            ovs.vsctl("del-port", bridge, names[0])
            clock.now += 5
            assert who.identify(_address(first)) is None
        finally:
            for bridge_name in (bridge, other):
                ovs.vsctl("--if-exists", "del-br", bridge_name, check=False)


@pytest.mark.anyio
async def test_async_identify(tmp_path):
    """The async form answers the same without blocking the loop."""
    with ovs_daemons(tmp_path) as ovs:
        bridge = f"bi{ovs.tag}"
        ovs.add_bridge(bridge)
        try:
            port = _plug(ovs, bridge, f"ia{ovs.tag}", "uuid-async")
            who = InportIdentifier(Ovsdb(f"unix:{ovs.db_sock}"), bridge)
            found = await who.identify_async(_address(port))
            assert found is not None
            assert found.instance_id == "uuid-async"
        finally:
            ovs.vsctl("--if-exists", "del-br", bridge, check=False)
