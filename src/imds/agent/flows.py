"""OpenFlow rules of the distributed metadata datapath, rendered as ``ovs-ofctl`` text (pure).

The path of a request (haproxy mode)::

    VM ──ARP/NS 169.254.169.254 / fe80::a9fe:a9fe / fd00:ec2::254──► br-int answers with the gateway MAC
    VM ──TCP :80──► br-int table 0, matched on (in_port, VM MAC):
                    learn the way back, rewrite source to the port's Meta IP/MAC and
                    destination to tap-meta, tag the provider VLAN ──patch──► br-meta ─► tap-meta (haproxy)
    haproxy ──ARP/NS for the Meta IP──► br-meta answers with the port's Meta MAC
    haproxy ──reply──► br-meta tags it ──patch──► br-int untags, table 210 (learned per port):
                    restore the VM's MAC/IP, source the address it asked ─► the VM port

The VM's own address is never configured anywhere: the ``learn`` action in the egress flow
writes the reverse rule from what the packet carried, keyed on the port's Meta address. So
two VMs with the same IP on different networks each get their own record, and a VM that
changes its MAC matches no egress rule and gets nothing.

The egress rules match no destination MAC: a guest reaches the metadata address on-link (the
ARP/NS answer above), through its default router, or via the DHCP port's address (the three
ways of Neutron's metadata spec), and the packet is taken whichever MAC it was sent to.
IPv6 has two metadata addresses: ``fe80::a9fe:a9fe`` (OpenStack's, cloud-init 23+) and
``fd00:ec2::254`` (AWS's, which cloud-init's EC2 datasource asks, also behind a router: it is
not link-local). The way back answers from the address the request went to.

A guest told to reach 169.254.169.254 *via* an address (the DHCP port's, Neutron's scenario b)
ARPs for that next hop first. Once the DHCP port is gone nothing would answer, so the agent
answers ARP (and NDP, for IPv6) for each ``--metadata-next-hop`` itself, with the gateway MAC,
on every VM port: the packets that follow are taken by the egress rule like any other (it
matches no destination MAC). Only addresses no live port holds belong there: the answer
takes every packet the guest sends to that address, not only metadata.

``--mode inport`` (Dragonflow's scheme) differs only in the source address: ``128.0.0.0 |
ofport`` instead of the Meta IP, so ``imds proxy --inport`` maps it back to the OVS port.

Every rule carries the agent's cookie; ``bundle`` turns a rule list into one atomic
``ovs-ofctl --bundle add-flows`` transaction that first deletes every rule with that cookie,
so re-applying is idempotent and a resync removes stale rules without a gap.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from imds.agent.allocate import Meta

Mode = Literal["haproxy", "inport"]

METADATA_IP = ipaddress.IPv4Address("169.254.169.254")
METADATA_IP6 = ipaddress.IPv6Address("fe80::a9fe:a9fe")
METADATA_IP6_EC2 = ipaddress.IPv6Address("fd00:ec2::254")
METADATA_IPS6 = (METADATA_IP6, METADATA_IP6_EC2)  # every IPv6 address the datapath answers
METADATA_PORT = 80
INPORT_BASE = ipaddress.IPv4Address("128.0.0.0")

COOKIE = 0x494D445300000000  # "IMDS": every static rule of the agent
COOKIE_MASK = 0xFFFFFFFF00000000
LEARN_COOKIE = 0x494D444C00000000  # "IMDL" | ofport: rules learned for one port's way back
RETURN_TABLE = 210  # br-int: learned reverse rewrites
NA_TABLE = 211  # br-int and br-meta: second stage of the neighbour-advertisement responder
LEARN_IDLE = 3600  # the per-port way back (last address used)
CONNECTION_IDLE = 300  # the per-connection way back
FIN_IDLE = 5  # ... once a FIN or RST went by
PRIORITY = 300
NA_FLAGS = 0x60000000  # solicited + override


@dataclass(frozen=True)
class Wiring:
    """What the rules are built from besides the VM ports: OpenFlow port numbers and the gateway."""

    int_patch: int  # on br-int, toward br-meta
    meta_patch: int  # on br-meta, toward br-int
    tap: int  # tap-meta on br-meta
    vlan: int  # provider VLAN on the patch link
    gateway: Meta
    mode: Mode = "haproxy"
    next_hops: tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, ...] = ()  # answered as the gateway

    @property
    def next_hops4(self) -> list[ipaddress.IPv4Address]:
        """The IPv4 next hops (ARP answered)."""
        return [hop for hop in self.next_hops if isinstance(hop, ipaddress.IPv4Address)]

    @property
    def next_hops6(self) -> list[ipaddress.IPv6Address]:
        """The IPv6 next hops (neighbour solicitations answered); none in in-port mode (IPv4 only)."""
        if self.mode == "inport":
            return []
        return [hop for hop in self.next_hops if isinstance(hop, ipaddress.IPv6Address)]


@dataclass(frozen=True)
class PortFlows:
    """One VM port as the rules see it: where it is, its own MAC and its Meta addresses."""

    ofport: int
    mac: str
    meta: Meta


def inport_address(ofport: int) -> ipaddress.IPv4Address:
    """Dragonflow's source address for a port: ``128.0.0.0 | ofport``."""
    return INPORT_BASE + ofport


def source_address(wiring: Wiring, port: PortFlows) -> ipaddress.IPv4Address:
    """The IPv4 source haproxy or the proxy sees for ``port``."""
    return inport_address(port.ofport) if wiring.mode == "inport" else port.meta.ip


def _mac_int(mac: str) -> str:
    return "0x" + mac.replace(":", "")


def _arp_reply(mac: str, ip: ipaddress.IPv4Address) -> str:
    """Actions turning an ARP request into the reply "``ip`` is at ``mac``", sent back where it came from."""
    return (
        f"move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],set_field:{mac}->eth_src,load:0x2->NXM_OF_ARP_OP[],"
        f"move:NXM_NX_ARP_SHA[]->NXM_NX_ARP_THA[],move:NXM_OF_ARP_SPA[]->NXM_OF_ARP_TPA[],"
        f"set_field:{mac}->arp_sha,set_field:{ip}->arp_spa,IN_PORT"
    )


def _na_stage1(match: str, target: ipaddress.IPv6Address) -> str:
    """First stage of the NA responder: NS → NA addressed back to the asker, then the second stage."""
    return (
        f"{match},icmp6,icmp_type=135,nd_target={target},actions="
        f"move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],move:NXM_NX_IPV6_SRC[]->NXM_NX_IPV6_DST[],"
        f"set_field:{target}->ipv6_src,set_field:136->icmpv6_type,resubmit(,{NA_TABLE})"
    )


def _na_stage2(target: ipaddress.IPv6Address, mac: str) -> str:
    """Second stage: the NA's target link-layer address and flags (one stage is refused by OVS)."""
    return (
        f"table={NA_TABLE},priority=100,icmp6,icmp_type=136,nd_target={target},actions="
        f"set_field:{mac}->eth_src,set_field:{mac}->nd_tll,set_field:{NA_FLAGS:#x}->nd_reserved,"
        "set_field:2->nd_options_type,IN_PORT"
    )


def _learn(port: PortFlows, gateway_mac: str, key: str, metadata_ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
           *, connection: bool) -> str:
    """A ``learn`` writing the way back for this port, from the addresses the request carried.

    Two are learned per request: one for this connection (keyed on the Meta address and the
    VM's TCP port, gone shortly after FIN), so a VM using several addresses at once gets
    each answer at the right one; and one per port (the address last used), for answers on a
    connection idle longer than the first one lives.
    """
    v6 = metadata_ip.version == 6
    ip_field = "NXM_NX_IPV6" if v6 else "NXM_OF_IP"
    metadata = f"{int(metadata_ip):#x}"
    if connection:
        key += ",nw_proto=6,NXM_OF_TCP_DST[]=NXM_OF_TCP_SRC[]"
        timeouts = f"priority=110,idle_timeout={CONNECTION_IDLE},fin_idle_timeout={FIN_IDLE}"
    else:
        timeouts = f"priority=100,idle_timeout={LEARN_IDLE}"
    return (
        f"learn(table={RETURN_TABLE},cookie={LEARN_COOKIE | port.ofport:#x},{timeouts},"
        f"eth_type={0x86DD if v6 else 0x0800:#06x},{key},"
        "load:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],"
        f"load:{_mac_int(gateway_mac)}->NXM_OF_ETH_SRC[],"
        f"load:{ip_field}_SRC[]->{ip_field}_DST[],load:{metadata}->{ip_field}_SRC[],"
        "output:NXM_OF_IN_PORT[])"
    )


def _learn_back(port: PortFlows, gateway_mac: str, key: str,
                metadata_ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """Both learns (per connection, per port) for one egress rule, answering from ``metadata_ip``."""
    return ",".join(_learn(port, gateway_mac, key, metadata_ip, connection=c) for c in (True, False))


def _port_rules(wiring: Wiring, port: PortFlows) -> list[str]:
    """br-int rules of one VM port: ARP/NA answers, the egress rewrite(s), and a drop for anything else."""
    gw = wiring.gateway
    here = f"priority={PRIORITY},in_port={port.ofport}"
    source = source_address(wiring, port)
    if wiring.mode == "inport":
        rewrite = f"load:{int(INPORT_BASE):#x}->NXM_OF_IP_SRC[],move:NXM_OF_IN_PORT[]->NXM_OF_IP_SRC[0..15]"
    else:
        rewrite = f"set_field:{source}->ip_src"
    key4 = f"NXM_OF_IP_DST[]={source}"
    rules = [
        f"{here},arp,arp_op=1,arp_tpa={METADATA_IP},actions={_arp_reply(gw.mac, METADATA_IP)}",
        (f"{here},dl_src={port.mac},tcp,nw_dst={METADATA_IP},tp_dst={METADATA_PORT},actions="
        f"{_learn_back(port, gw.mac, key4, METADATA_IP)},"
        f"set_field:{port.meta.mac}->eth_src,set_field:{gw.mac}->eth_dst,"
        f"{rewrite},set_field:{gw.ip}->ip_dst,mod_vlan_vid:{wiring.vlan},output:{wiring.int_patch}"),
        f"priority={PRIORITY - 10},in_port={port.ofport},ip,nw_dst={METADATA_IP},actions=drop",
    ]
    rules += [f"{here},arp,arp_op=1,arp_tpa={hop},actions={_arp_reply(gw.mac, hop)}" for hop in wiring.next_hops4]
    rules += [_na_stage1(here, hop) for hop in wiring.next_hops6]
    if wiring.mode == "haproxy":
        key6 = f"NXM_NX_IPV6_DST[]={port.meta.ip6}"
        for target in METADATA_IPS6:
            rules += [
                _na_stage1(here, target),
                (f"{here},dl_src={port.mac},tcp6,ipv6_dst={target},tp_dst={METADATA_PORT},actions="
                f"{_learn_back(port, gw.mac, key6, target)},"
                f"set_field:{port.meta.mac}->eth_src,set_field:{gw.mac}->eth_dst,"
                f"set_field:{port.meta.ip6}->ipv6_src,set_field:{gw.ip6}->ipv6_dst,"
                f"mod_vlan_vid:{wiring.vlan},output:{wiring.int_patch}"),
                f"priority={PRIORITY - 10},in_port={port.ofport},ipv6,ipv6_dst={target},actions=drop",
            ]
    return rules


def integration_flows(wiring: Wiring, ports: Iterable[PortFlows]) -> list[str]:
    """Every agent rule on the integration bridge, in a stable order."""
    rules: list[str] = []
    for port in sorted(ports, key=lambda p: p.ofport):
        rules += _port_rules(wiring, port)
    rules += [
        (f"priority={PRIORITY},in_port={wiring.int_patch},dl_vlan={wiring.vlan},"
        f"actions=strip_vlan,resubmit(,{RETURN_TABLE})"),
        f"table={RETURN_TABLE},priority=0,actions=drop",
    ]
    if wiring.mode == "haproxy":
        rules += [_na_stage2(target, wiring.gateway.mac) for target in (*METADATA_IPS6, *wiring.next_hops6)]
    return rules


def metadata_flows(wiring: Wiring, ports: Iterable[PortFlows]) -> list[str]:
    """Every rule on the metadata bridge (the agent owns it whole), in a stable order."""
    gw = wiring.gateway
    tap = f"priority=200,in_port={wiring.tap}"
    rules = [
        (f"priority=100,in_port={wiring.meta_patch},dl_vlan={wiring.vlan},dl_dst={gw.mac},"
        f"actions=strip_vlan,output:{wiring.tap}"),
        (f"priority=100,in_port={wiring.tap},ip,nw_src={gw.ip},actions=mod_vlan_vid:{wiring.vlan},"
        f"output:{wiring.meta_patch}"),
        "priority=0,actions=drop",
    ]
    if wiring.mode == "haproxy":
        rules.insert(2, f"priority=100,in_port={wiring.tap},ipv6,ipv6_src={gw.ip6},"
                        f"actions=mod_vlan_vid:{wiring.vlan},output:{wiring.meta_patch}")
    for port in sorted(ports, key=lambda p: p.ofport):
        source = source_address(wiring, port)
        rules.append(f"{tap},arp,arp_op=1,arp_tpa={source},actions={_arp_reply(port.meta.mac, source)}")
        if wiring.mode == "haproxy":
            rules += [_na_stage1(tap, port.meta.ip6), _na_stage2(port.meta.ip6, port.meta.mac)]
    return rules


def bundle(rules: Sequence[str], cookie: int = COOKIE) -> str:
    """One ``ovs-ofctl --bundle add-flows`` file: delete every rule with ``cookie``, then add ``rules``."""
    lines = [f"delete cookie={cookie:#x}/{COOKIE_MASK:#x}"]
    lines += [f"add cookie={cookie:#x},{rule}" for rule in rules]
    return "\n".join(lines) + "\n"


def forget_port(ofport: int) -> str:
    """``del-flows`` match removing what was learned for a port that is gone."""
    return f"cookie={LEARN_COOKIE | ofport:#x}/-1"
