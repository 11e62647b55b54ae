"""Flow rendering: what each bridge gets, in both modes (checked for real in test_agent_ovs.py)."""

from __future__ import annotations

import ipaddress

from imds.agent import flows
from imds.agent.allocate import Pool

POOL = Pool.parse("240.0.0.0/16", "fd00:a9fe::/64", "fa:16:ee:00:00:00")
WIRING = flows.Wiring(int_patch=1, meta_patch=1, tap=2, vlan=998, gateway=POOL.gateway)
PORTS = [flows.PortFlows(5, "02:00:00:00:00:0a", POOL.meta(2)), flows.PortFlows(7, "02:00:00:00:00:0b", POOL.meta(3))]


def _egress(rules: list[str], ofport: int, proto: str = "tcp") -> str:
    return next(r for r in rules if f"in_port={ofport}," in r and f",{proto}," in r and "dl_src" in r)


def test_egress_matches_port_and_mac_and_rewrites_to_the_meta_address():
    """The VM's port and MAC select the rule; source becomes its Meta IP/MAC, tagged toward br-meta."""
    rule = _egress(flows.integration_flows(WIRING, PORTS), 5)
    assert "dl_src=02:00:00:00:00:0a" in rule
    assert "nw_dst=169.254.169.254,tp_dst=80" in rule
    assert "set_field:240.0.0.2->ip_src" in rule
    assert "set_field:fa:16:ee:00:00:02->eth_src" in rule
    assert "set_field:240.0.0.1->ip_dst" in rule
    assert "mod_vlan_vid:998,output:1" in rule
    # The way back is learned, keyed on the Meta address, never configured from the VM's IP.
    assert "learn(table=210" in rule
    assert "NXM_OF_IP_DST[]=240.0.0.2" in rule
    assert "NXM_OF_TCP_DST[]=NXM_OF_TCP_SRC[]" in rule


def test_ipv6_rules_in_haproxy_mode_only():
    """Haproxy mode answers NS for fe80::a9fe:a9fe and rewrites to the Meta IPv6; in-port mode has no IPv6."""
    rules = flows.integration_flows(WIRING, PORTS)
    assert "set_field:fd00:a9fe::2->ipv6_src" in _egress(rules, 5, "tcp6")
    assert any("icmp_type=135,nd_target=fe80::a9fe:a9fe" in r for r in rules)
    assert any(r.startswith("table=211") and "nd_tll" in r for r in rules)
    inport = flows.integration_flows(flows.Wiring(1, 1, 2, 998, POOL.gateway, mode="inport"), PORTS)
    assert not any("ipv6" in r or "icmp6" in r for r in inport)


def test_aws_ipv6_address_is_answered_and_the_way_back_answers_from_it():
    """fd00:ec2::254 (cloud-init's EC2 IPv6 address) gets its own NS answer, egress rule and drop.

    Each egress rule learns a way back that restores the address the VM asked, and none matches a
    destination MAC (a guest may send through its router or the DHCP port, not only on-link).
    """
    rules = flows.integration_flows(WIRING, PORTS)
    ec2 = next(r for r in rules if "in_port=5," in r and "tcp6,ipv6_dst=fd00:ec2::254,tp_dst=80" in r)
    assert "set_field:fd00:a9fe::2->ipv6_src" in ec2
    assert f"load:{int(flows.METADATA_IP6_EC2):#x}->NXM_NX_IPV6_SRC[]" in ec2
    assert f"{int(flows.METADATA_IP6):#x}" not in ec2
    link_local = next(r for r in rules if "in_port=5," in r and "tcp6,ipv6_dst=fe80::a9fe:a9fe" in r)
    assert f"load:{int(flows.METADATA_IP6):#x}->NXM_NX_IPV6_SRC[]" in link_local
    assert any("icmp_type=135,nd_target=fd00:ec2::254" in r for r in rules)
    assert any(r.startswith("table=211") and "nd_target=fd00:ec2::254" in r for r in rules)
    assert any("in_port=5,ipv6,ipv6_dst=fd00:ec2::254,actions=drop" in r for r in rules)
    egress = [r for r in rules if "dl_src=" in r]
    assert len(egress) == 3 * len(PORTS)
    assert not any("dl_dst" in r for r in egress)


def test_inport_mode_encodes_the_ofport_as_source():
    """In-port mode rewrites the source to 128.0.0.0 | ofport (Dragonflow's scheme)."""
    wiring = flows.Wiring(1, 1, 2, 998, POOL.gateway, mode="inport")
    rule = _egress(flows.integration_flows(wiring, PORTS), 7)
    assert "load:0x80000000->NXM_OF_IP_SRC[],move:NXM_OF_IN_PORT[]->NXM_OF_IP_SRC[0..15]" in rule
    assert "NXM_OF_IP_DST[]=128.0.0.7" in rule
    meta = flows.metadata_flows(wiring, PORTS)
    assert any("arp_tpa=128.0.0.7" in r for r in meta)
    assert str(flows.inport_address(0x1234)) == "128.0.18.52"


def test_metadata_bridge_answers_arp_for_each_meta_ip():
    """br-meta answers haproxy's ARP/NS for each Meta address with that port's Meta MAC."""
    rules = flows.metadata_flows(WIRING, PORTS)
    arp = next(r for r in rules if "arp_tpa=240.0.0.3" in r)
    assert "set_field:fa:16:ee:00:00:03->arp_sha" in arp
    assert any("nd_target=fd00:a9fe::3" in r and "nd_tll" in r for r in rules)


def test_bundle_replaces_every_agent_rule_atomically():
    """The bundle first deletes every rule with the agent's cookie, then adds each rule with it."""
    text = flows.bundle(["priority=1,actions=drop", "priority=2,actions=drop"])
    lines = text.splitlines()
    assert lines[0] == "delete cookie=0x494d445300000000/0xffffffff00000000"
    assert lines[1:] == ["add cookie=0x494d445300000000,priority=1,actions=drop",
                         "add cookie=0x494d445300000000,priority=2,actions=drop"]


def test_rendering_is_stable():
    """The same ports in any order render the same rules (so unchanged state is not re-applied)."""
    assert flows.integration_flows(WIRING, PORTS) == flows.integration_flows(WIRING, list(reversed(PORTS)))
    assert flows.metadata_flows(WIRING, PORTS) == flows.metadata_flows(WIRING, list(reversed(PORTS)))


def test_next_hops_are_answered_as_the_gateway_on_every_vm_port():
    """--metadata-next-hop: ARP for an IPv4 next hop and NS for an IPv6 one get the gateway MAC, port by port."""
    hops = (ipaddress.ip_address("10.0.0.2"), ipaddress.ip_address("fd00:231::2"))
    wiring = flows.Wiring(1, 1, 2, 998, POOL.gateway, next_hops=hops)
    rules = flows.integration_flows(wiring, PORTS)
    for ofport in (5, 7):
        arp = next(r for r in rules if f"in_port={ofport},arp,arp_op=1,arp_tpa=10.0.0.2," in r)
        assert "set_field:fa:16:ee:00:00:01->arp_sha,set_field:10.0.0.2->arp_spa,IN_PORT" in arp
        assert any(f"in_port={ofport},icmp6,icmp_type=135,nd_target=fd00:231::2," in r for r in rules)
    answer = next(r for r in rules if r.startswith("table=211") and "nd_target=fd00:231::2" in r)
    assert "set_field:fa:16:ee:00:00:01->nd_tll" in answer
    assert not any("10.0.0.2" in r for r in flows.integration_flows(WIRING, PORTS))  # none unless asked


def test_next_hops_in_inport_mode_are_ipv4_only():
    """In-port mode has no IPv6 path: an IPv6 next hop is not answered there, an IPv4 one is."""
    hops = (ipaddress.ip_address("10.0.0.2"), ipaddress.ip_address("fd00:231::2"))
    rules = flows.integration_flows(flows.Wiring(1, 1, 2, 998, POOL.gateway, mode="inport", next_hops=hops), PORTS)
    assert any("arp_tpa=10.0.0.2" in r for r in rules)
    assert not any("fd00:231::2" in r for r in rules)
