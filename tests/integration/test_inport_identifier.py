"""In-port identification against a real OVSDB: 128.0.0.0 | ofport → the VM's vm-uuid, followed live."""

from __future__ import annotations

import ipaddress

import pytest

from helpers import wait_for_async
from imds.agent.ovsdb import Ovsdb
from imds.errors import ConfigError
from imds.proxy.identify import Identifier, Identity
from imds.proxy.inport import InportIdentifier, ofport_of
from ovs_harness import ovs_daemons

WAIT = 20.0


def _plug(ovs, bridge: str, name: str, uuid: str, tenant: str | None = None) -> int:
    ids = [f"external_ids:vm-uuid={uuid}", "external_ids:attached-mac=02:00:00:00:00:01"]
    if tenant:
        ids.append(f"external_ids:tenant-id={tenant}")
    ovs.vsctl("add-port", bridge, name, "--", "set", "Interface", name, "type=internal", *ids)
    return ovs.ofport(name)


def _address(ofport: int) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address("128.0.0.0") + ofport


async def _eventually(who: InportIdentifier, address: ipaddress.IPv4Address, expected: Identity | None) -> None:
    """Poll (bounded) until the identifier answers ``expected`` for ``address``."""

    async def answers() -> bool:
        return await who.identify(address) == expected

    await wait_for_async(answers, what=f"{address} identified as {expected}", timeout=WAIT)


def test_ofport_of_accepts_only_the_inport_range():
    """Only 128.0.0.1-128.0.255.255 (also IPv4-mapped) encode a port."""
    assert ofport_of(ipaddress.ip_address("128.0.0.7")) == 7
    assert ofport_of(ipaddress.ip_address("::ffff:128.0.1.0")) == 256
    for other in ("128.0.0.0", "128.1.0.1", "10.0.0.7", "fe80::1"):
        assert ofport_of(ipaddress.ip_address(other)) is None


@pytest.mark.anyio
async def test_identifies_vms_by_port_and_follows_plugging(tmp_path):
    """An address maps to the VM at that port of the bridge; plugs and unplugs are followed live."""
    with ovs_daemons(tmp_path) as ovs:
        bridge, other = f"bi{ovs.tag}", f"bo{ovs.tag}"
        ovs.add_bridge(bridge)
        ovs.add_bridge(other)
        names = [f"ia{ovs.tag}", f"ib{ovs.tag}", f"ic{ovs.tag}", f"id{ovs.tag}"]
        who = InportIdentifier(Ovsdb(f"unix:{ovs.db_sock}"), bridge)
        _: Identifier = who
        try:
            first = _plug(ovs, bridge, names[0], "uuid-first", tenant="t1")
            await who.start()
            assert await who.identify(_address(first)) == Identity("uuid-first", "t1")
            assert await who.identify(ipaddress.IPv4Address("10.0.0.1")) is None

            second = _plug(ovs, bridge, names[1], "uuid-second")
            await _eventually(who, _address(second), Identity("uuid-second", None))

            # A VM on another bridge is never taken for one of this bridge.
            # OVSDB reports changes in order: once a later plug on the watched bridge is seen,
            # the one on the other bridge has been processed too.
            _plug(ovs, other, names[2], "uuid-elsewhere")
            later = _plug(ovs, bridge, names[3], "uuid-later")
            await _eventually(who, _address(later), Identity("uuid-later", None))
            assert all(i.instance_id != "uuid-elsewhere" for i in who.table.values())

            ovs.vsctl("del-port", bridge, names[0])
            await _eventually(who, _address(first), None)
        finally:
            await who.stop()
            for bridge_name in (bridge, other):
                ovs.vsctl("--if-exists", "del-br", bridge_name, check=False)


@pytest.mark.anyio
async def test_unreachable_ovsdb_is_a_config_error(tmp_path):
    """Starting against an OVSDB that is not there fails clearly, naming --ovsdb."""
    who = InportIdentifier(Ovsdb(f"unix:{tmp_path}/missing.sock"), "br-int")
    with pytest.raises(ConfigError, match="--ovsdb"):
        await who.start()
