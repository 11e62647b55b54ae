"""IPv6-only VMs and every route to the metadata address, through ``imds agent`` to a real ``imds serve``.

What a real guest does in the lab (``imds lab boot --ipv6-only``, ``--route``), without QEMU:

- a VM with no IPv4 at all asks AWS's IPv6 address ``fd00:ec2::254`` (cloud-init's EC2
  datasource) — through its router, as a SLAAC guest does (the address is not on-link), and
  on-link (the agent answers its neighbour solicitation) — and gets ITS instance id with an
  IMDSv2 token, the way back answering from ``fd00:ec2::254``;
- a VM reaches 169.254.169.254 through its default gateway (Neutron's scenario a: the packet
  carries the router's MAC, not the agent's, and is taken all the same);
- a VM told to reach it via the DHCP port's address (scenario b) after that port is gone: the
  agent answers the VM's real ARP (and, for IPv6, its neighbour solicitation) for that next hop
  itself (``--metadata-next-hop``), so the read works with no DHCP port at all.

The router is a static neighbour entry with a MAC no port owns (a live router answers its ARP);
the DHCP port's address has no entry and no owner: only the agent can answer for it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from ec2_expected import seed
from helpers import wait_for
from ovs_harness import AgentProcess, Vm, netns_exec, ovs_daemons, vms
from serve_process import serving

SECRET = b"agent-routes-shared-secret"
UUID_6 = "e6000000-0000-4000-8000-000000000006"
UUID_4 = "e4000000-0000-4000-8000-000000000004"
ADDRESS_6 = "fd00:231::5"
AWS6 = "http://[fd00:ec2::254]"
BASE = "http://169.254.169.254"
ROUTER6, ROUTER6_MAC = "fd00:231::1", "02:00:00:00:99:06"
GATEWAY, GATEWAY_MAC = "10.0.0.1", "02:00:00:00:99:01"
DHCP_PORT = "10.0.0.2"  # the DHCP port's address: the port is gone, nothing owns it
DHCP_PORT6 = "fd00:231::2"
AGENT_MAC = "fa:16:ee:00:00:01"  # tap-meta's (the gateway of the provider range): what the agent answers with


@dataclass
class Stack:
    v6: Vm
    v4: Vm


def _record(uuid: str, hostname: str, address: str, family: int) -> dict[str, object]:
    doc = copy.deepcopy(seed())
    doc.update(id=uuid, hostname=hostname)
    doc["network"] = {"interfaces": [{"name": "eth0", "mac": "02:00:00:00:00:01"}],
                      "addresses": [{"address": address, "address_family": family, "public": False}]}
    return doc


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("ovs")
    secret = root / "secret"
    secret.write_bytes(SECRET)
    serve_args = ("--db", "memory://", "--trusted-proxy", "127.0.0.1/32", "--proxy-shared-secret-file", str(secret),
                  "--imdsv2", "required")
    with serving(root, *serve_args) as server, ovs_daemons(root) as ovs:
        for uuid, host, address, family in ((UUID_6, "vm-six", ADDRESS_6, 6), (UUID_4, "vm-four", "10.0.0.5", 4)):
            server.post("/device-metadata", {"id": uuid, "ipAddresses": [address],
                                             "metadata": _record(uuid, host, address, family)})
        t = ovs.tag
        bridge, meta_bridge, tap, netns = f"bi{t}", f"bm{t}", f"tm{t}", f"imdsmeta{t}"
        ovs.add_bridge(bridge)
        v6 = Vm(ovs, bridge, f"s6{t}", UUID_6, "02:00:00:00:6a:01", f"{ADDRESS_6}/64", tag=1)
        v4 = Vm(ovs, bridge, f"s4{t}", UUID_4, "02:00:00:00:4a:01", "10.0.0.5/24", tag=1)
        agent = AgentProcess(ovs, [
            "--ovsdb", f"unix:{ovs.db_sock}", "--integration-bridge", bridge, "--metadata-bridge", meta_bridge,
            "--meta-port", tap, "--meta-netns", netns, "--upstream", server.url, "--shared-secret-file", str(secret),
            "--state-dir", str(root / "state"),
            "--metadata-next-hop", DHCP_PORT, "--metadata-next-hop", DHCP_PORT6,
        ], root / "agent.log")
        try:
            with vms(v6, v4):
                # No IPv4 at all in the IPv6-only VM: not the harness's on-link route either.
                netns_exec(v6.name, "ip", "route", "del", "169.254.169.254/32", "dev", "eth0")
                netns_exec(v6.name, "ip", "-6", "neigh", "replace", ROUTER6, "lladdr", ROUTER6_MAC, "dev", "eth0",
                           "nud", "permanent")
                netns_exec(v6.name, "ip", "-6", "route", "add", "default", "via", ROUTER6, "dev", "eth0")
                netns_exec(v4.name, "ip", "neigh", "replace", GATEWAY, "lladdr", GATEWAY_MAC, "dev", "eth0", "nud",
                           "permanent")
                agent.start()
                wait_for(lambda: v4.get(f"{BASE}/latest/api/token", *_PUT, timeout=3.0)[0] == 200,
                         what="the agent serving", timeout=40)
                yield Stack(v6, v4)
        finally:
            agent.stop()
            ovs.remove(meta_bridge, bridge, netns=netns)


_PUT = ("-X", "PUT", "-H", "X-aws-ec2-metadata-token-ttl-seconds: 60")


def _instance_id(vm: Vm, base: str) -> tuple[int, str]:
    """IMDSv2 as cloud-init does it: a token PUT, then the read with the token."""
    status, token = vm.get(f"{base}/latest/api/token", *_PUT)
    assert status == 200, token
    return vm.get(f"{base}/latest/meta-data/instance-id", "-H", f"X-aws-ec2-metadata-token: {token}")


def _addresses(vm: Vm) -> str:
    return netns_exec(vm.name, "ip", "-o", "addr", "show", "dev", "eth0")


def test_ipv6_only_vm_reads_its_own_id_from_aws_ipv6_address_through_its_router(stack):
    """No IPv4 anywhere in the VM; fd00:ec2::254 via the router's MAC answers with the VM's own id."""
    assert " inet " not in _addresses(stack.v6)
    assert "inet6 fd00:231::5/64" in _addresses(stack.v6)
    assert _instance_id(stack.v6, AWS6) == (200, UUID_6)
    # The answer came from the address asked (curl would not take it from another), and the VM
    # learned no neighbour for fd00:ec2::254: the packet went to the router's MAC.
    neighbours = netns_exec(stack.v6.name, "ip", "-6", "neigh", "show", "dev", "eth0")
    assert "fd00:ec2::254" not in neighbours


def test_ipv6_only_vm_reaches_aws_ipv6_address_on_link(stack):
    """With fd00:ec2::254 on-link the VM solicits it; the agent's NA answers and the read works."""
    vm = stack.v6
    netns_exec(vm.name, "ip", "-6", "route", "replace", "fd00:ec2::254/128", "dev", "eth0")
    try:
        assert _instance_id(vm, AWS6) == (200, UUID_6)
        neighbours = netns_exec(vm.name, "ip", "-6", "neigh", "show", "fd00:ec2::254", "dev", "eth0")
        assert "lladdr" in neighbours
        assert ROUTER6_MAC not in neighbours
        # fe80::a9fe:a9fe answers the same VM too, from its own address.
        assert _instance_id(vm, "http://[fe80::a9fe:a9fe%eth0]") == (200, UUID_6)
    finally:
        netns_exec(vm.name, "ip", "-6", "route", "del", "fd00:ec2::254/128", "dev", "eth0")


def test_metadata_through_the_default_gateway_whatever_its_mac(stack):
    """Neutron's scenario a: 169.254.169.254 via the router, whose MAC the packet carries."""
    vm = stack.v4
    netns_exec(vm.name, "ip", "route", "replace", "169.254.169.254/32", "via", GATEWAY, "dev", "eth0")
    try:
        assert f"via {GATEWAY}" in netns_exec(vm.name, "ip", "route", "get", "169.254.169.254")
        assert GATEWAY_MAC in netns_exec(vm.name, "ip", "neigh", "show", GATEWAY, "dev", "eth0")
        assert _instance_id(vm, BASE) == (200, UUID_4)
    finally:
        netns_exec(vm.name, "ip", "route", "replace", "169.254.169.254/32", "dev", "eth0")


def test_metadata_via_a_dhcp_port_that_is_gone(stack):
    """Scenario b with no DHCP port alive: the VM's own ARP for the next hop is answered by the agent."""
    vm = stack.v4
    netns_exec(vm.name, "ip", "neigh", "flush", "dev", "eth0", "to", DHCP_PORT)
    netns_exec(vm.name, "ip", "route", "replace", "169.254.169.254/32", "via", DHCP_PORT, "dev", "eth0")
    try:
        assert DHCP_PORT not in netns_exec(vm.name, "ip", "neigh", "show", "dev", "eth0")  # nothing pinned
        assert _instance_id(vm, BASE) == (200, UUID_4)
        learned = netns_exec(vm.name, "ip", "neigh", "show", DHCP_PORT, "dev", "eth0")
        assert f"lladdr {AGENT_MAC}" in learned  # a real ARP exchange, answered by the flows
        assert "PERMANENT" not in learned
    finally:
        netns_exec(vm.name, "ip", "route", "replace", "169.254.169.254/32", "dev", "eth0")


def test_ipv6_via_a_next_hop_that_is_gone(stack):
    """The IPv6-only VM told to reach fd00:ec2::254 via fd00:231::2 (no one there): the agent's NA answers."""
    vm = stack.v6
    netns_exec(vm.name, "ip", "-6", "neigh", "flush", "dev", "eth0", "to", DHCP_PORT6)
    netns_exec(vm.name, "ip", "-6", "route", "replace", "fd00:ec2::254/128", "via", DHCP_PORT6, "dev", "eth0")
    try:
        assert _instance_id(vm, AWS6) == (200, UUID_6)
        learned = netns_exec(vm.name, "ip", "-6", "neigh", "show", DHCP_PORT6, "dev", "eth0")
        assert f"lladdr {AGENT_MAC}" in learned
        assert "PERMANENT" not in learned
    finally:
        netns_exec(vm.name, "ip", "-6", "route", "del", "fd00:ec2::254/128", "dev", "eth0")
