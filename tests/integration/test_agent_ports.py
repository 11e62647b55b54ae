"""Ports as a real compute host has them: plugged exactly as os-vif plugs them, and a VM with two.

os-vif (``vif_plug_ovs/ovsdb/ovsdb_lib.py``, ``create_ovs_vif_port``) writes four keys in the
Interface's ``external_ids`` and nothing else: ``iface-id``, ``iface-status``, ``attached-mac``,
``vm-uuid``. No tenant: neither Nova, os-vif nor Neutron writes one (OVN keeps
``neutron:project_id`` on its northbound ports, not here), so the agent asserts none and serve
has no tenant to compare; the instance is the port's ``vm-uuid``, signed, and the record's host
is what binds it to this hypervisor (docs/hypervisor.md). A VM with two ports gets a Meta
address per port and is answered on each, as itself.

The switch runs in a network namespace of its own (``ovs_daemons(own_netns=True)``), which is
this test's "host": no other userspace switch on the machine can get in its way.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import wait_for
from imds.signing import sign_stamped
from ovs_harness import READY_TIMEOUT, AgentProcess, Ovs, Vm, netns_exec, ovs_daemons, peer_echo, sh, vms

SECRET = b"agent-ports-secret"
OS_VIF = "d1000000-0000-4000-8000-0000000000d1"
TWO_PORTS = "d2000000-0000-4000-8000-0000000000d2"
UPSTREAM_PORT = 8775
METADATA = "http://169.254.169.254/metadata"


@dataclass
class Host:
    ovs: Ovs
    agent: AgentProcess
    plain: Vm
    twin: Vm  # eth0 of the two-port VM; eth1 is plugged as SECOND_PORT
    second_port: str


def _second_nic(vm: Vm, port: str, mac: str, address: str, tag: int) -> None:
    """A second veth (``eth1``) into ``vm``'s namespace, plugged with the same vm-uuid, as os-vif plugs a port."""
    netns = vm.ovs.netns
    assert netns is not None
    sh("ip", "-n", netns, "link", "add", port, "type", "veth", "peer", "name", "eth1", "netns", vm.name)
    for args in (("link", "set", "eth1", "address", mac), ("addr", "add", address, "dev", "eth1"),
                 ("link", "set", "eth1", "up"), ("route", "add", "169.254.169.254/32", "dev", "eth1", "metric", "200")):
        netns_exec(vm.name, "ip", *args)
    netns_exec(vm.name, "ethtool", "-K", "eth1", "tx", "off")
    sh("ip", "-n", netns, "link", "set", port, "up")
    vm.ovs.vsctl("add-port", vm.bridge, port, f"tag={tag}", "--", "set", "Interface", port,
                 f"external_ids:iface-id=port-{vm.uuid[:8]}-eth1", "external_ids:iface-status=active",
                 f"external_ids:attached-mac={mac}", f"external_ids:vm-uuid={vm.uuid}")


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    root = tmp_path_factory.mktemp("ovs")
    secret = root / "secret"
    secret.write_bytes(SECRET)
    with ovs_daemons(root, own_netns=True) as ovs:
        assert ovs.netns is not None
        t = ovs.tag
        bridge = f"bi{t}"
        ovs.add_bridge(bridge)
        plain = Vm(ovs, bridge, f"po{t}", OS_VIF, "02:00:00:00:d1:01", "10.0.0.5/24", tag=1)
        twin = Vm(ovs, bridge, f"pt{t}", TWO_PORTS, "02:00:00:00:d2:01", "10.0.0.6/24", tag=1)
        second = f"vq{t}"
        agent = AgentProcess(ovs, [
            "--ovsdb", f"unix:{ovs.db_sock}", "--integration-bridge", bridge, "--metadata-bridge", f"bm{t}",
            "--meta-port", f"tm{t}", "--upstream", f"http://127.0.0.1:{UPSTREAM_PORT}",
            "--shared-secret-file", str(secret), "--state-dir", str(root / "state"), "--check-interval", "1",
        ], root / "agent.log")
        try:
            with vms(plain, twin), peer_echo(ovs.netns, "127.0.0.1", UPSTREAM_PORT):
                _second_nic(twin, second, "02:00:00:00:d2:02", "10.1.0.6/24", tag=2)
                agent.start()
                yield Host(ovs, agent, plain, twin, second)
        finally:
            agent.stop()
            ovs.vsctl("--if-exists", "del-port", bridge, second, check=False)
            sh("ip", "-n", ovs.netns, "link", "del", second, check=False)


def _read(vm: Vm, *args: str) -> tuple[str, dict[str, str]] | None:
    """(peer haproxy saw, headers serve would get) for a read from ``vm``, or None while not served."""
    status, body = vm.get(METADATA, *args, timeout=3.0)
    if status != 200:
        return None
    answer = json.loads(body)
    return answer["peer"], answer["headers"]


def test_a_port_plugged_exactly_as_os_vif_plugs_it_is_served_without_a_tenant(host):
    """The four os-vif keys and no more: the VM reads as itself, signed, and no X-Tenant-ID is asserted."""
    ids = host.ovs.vsctl("get", "Interface", host.plain.port, "external_ids").strip()
    keys = sorted(item.split("=", 1)[0].strip().strip('"') for item in ids.strip("{}").split(", "))
    assert keys == ["attached-mac", "iface-id", "iface-status", "vm-uuid"]
    _, headers = wait_for(lambda: _read(host.plain), what="the os-vif port served", timeout=READY_TIMEOUT,
                          explain=host.agent.output)
    assert headers["x-instance-id"] == OS_VIF
    assert "x-tenant-id" not in headers
    stamp = int(headers["x-instance-id-timestamp"])
    assert abs(stamp - time.time()) < 30
    assert headers["x-instance-id-signature"] == sign_stamped(SECRET, OS_VIF, stamp)


def test_a_vm_with_two_ports_is_answered_on_each_as_itself(host):
    """eth0 and eth1 (two networks, two OVS ports, one vm-uuid): each read is the VM's, from its own port."""
    for nic in ("eth0", "eth1"):
        _, headers = wait_for(lambda nic=nic: _read(host.twin, "--interface", nic),
                              what=f"the two-port VM served on {nic}", timeout=READY_TIMEOUT,
                              explain=host.agent.output)
        assert headers["x-instance-id"] == TWO_PORTS
    meta = {port: host.ovs.vsctl("get", "Interface", port, "other_config:provider_ip").strip().strip('"')
            for port in (host.twin.port, host.second_port)}
    assert meta[host.twin.port] != meta[host.second_port]

    def both_logged() -> dict[str, str]:
        sources = {}
        for line in host.agent.output().splitlines():
            entry = json.loads(line) if line.startswith("{") else {}
            if entry.get("event") == "haproxy.request" and entry.get("instance_id") == TWO_PORTS:
                assert entry["tenant"] == ""  # os-vif wrote none: an empty string, not haproxy's "-"
                sources[entry["port"]] = entry["source"]
        return sources if len(sources) == 2 else {}

    # Each port's read came from that port's own Meta address (the flows took it on that port).
    assert wait_for(both_logged, what="both ports in the request log", timeout=READY_TIMEOUT) == meta


def test_the_switch_in_its_own_namespace_left_the_hosts_alone(host):
    """Nothing of this switch is in the machine's own namespace: its taps and ports live in the test's "host"."""
    assert host.ovs.netns is not None
    own = Path("/sys/class/net")
    for name in (host.plain.port, host.second_port, f"bi{host.ovs.tag}", f"tm{host.ovs.tag}"):
        assert not (own / name).exists(), name
    assert f"tm{host.ovs.tag}" in sh("ip", "-n", host.ovs.netns, "-o", "link", "show")
