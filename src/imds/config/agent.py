"""``imds agent``'s options (``AGENT_OPTIONS``, env vars IMDS_AGENT_*) and settings.

``imds agent`` (one per hypervisor) has its own table, so its flags and variables stay apart from
the server's. One group, ``agent``; its checks are ``imds.config.checks.check_agent`` (provider
ranges are validated by ``imds.agent.allocate.Pool``).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from imds.config.hostside import HostSide, host_side_rows
from imds.config.option import Group, Option, Rows, addresses

_agent = Rows("agent", "IMDS_AGENT_")

AGENT_OPTIONS: tuple[Option, ...] = (
    _agent("ovsdb", "str", "unix:/var/run/openvswitch/db.sock",
        "OVSDB server to read VM ports from and write Meta addresses to (unix:PATH or tcp:HOST:PORT)."),
    _agent("integration_bridge", "str", "br-int",
        "The bridge VM ports are plugged into (the operator's; it must exist)."),
    _agent("metadata_bridge", "str", "br-meta", "The bridge the agent creates for tap-meta."),
    _agent("upstream", "str", None,
        "imds serve URL that haproxy forwards to, e.g. http://10.0.0.2:8000 or https://imds.internal:8443 (required)."),
    *host_side_rows(_agent),
    _agent("provider_cidr", "str", "240.0.0.0/16", "IPv4 range of Meta IPs; the first host is tap-meta (haproxy)."),
    _agent("provider_cidr6", "str", "fd00:a9fe::/64",
        "IPv6 range of Meta IPv6 addresses (ULA); the first host is tap-meta."),
    _agent("provider_base_mac", "str", "fa:16:ee:00:00:00",
        "Meta MACs are this plus the Meta IP's offset in the range (tap-meta: ...:01)."),
    _agent("provider_vlan_id", "int", 998, "VLAN tagging metadata traffic on the patch link between the two bridges."),
    _agent("state_dir", "path", "/var/lib/imds/agent", "Directory for the haproxy config and master socket."),
    _agent("haproxy_bin", "str", "haproxy", "haproxy executable."),
    _agent("haproxy_user", "str", "imds-haproxy",
        "System user (and group of the same name) haproxy's workers run as, chrooted to an empty directory "
        "(deploy/sysusers.d/imds-agent.conf creates it)."),
    _agent("meta_netns", "str", None, "Network namespace for tap-meta (created if missing; default: the host's own)."),
    _agent("meta_port", "str", "tap-meta", "Name of the internal port haproxy listens behind."),
    _agent("mode", "str", "haproxy",
        "haproxy (one haproxy, a Meta IP per VM) or inport (source 128.0.0.0|ofport, for imds proxy --inport)."),
    _agent("metadata_next_hop", "list", (),
        "Address the guests were told to reach 169.254.169.254 through (the DHCP port's): the agent answers "
        "its ARP/NDP on every VM port (repeatable; only addresses no live port holds).", parse=addresses),
    _agent("inport_route_table", "int", 4254,
        "For --mode inport: the routing table (and rule priority) for 128.0.0.0/16 on tap-meta, never the main one."),
    _agent("check_interval", "float", 2.0,
        "Seconds between checks that the flows are still installed (ovs-vswitchd restarts lose them)."),
    _agent.log_level_row(),
    _agent("max_connections_per_source", "int", 32,
        "Open connections one VM port may hold to the metadata address (haproxy closes the rest at accept)."),
    _agent("watch_max_timeout", "int", 300,
        "Longest wait_for_change timeout_sec haproxy holds open (set it as imds serve's --watch-max-timeout)."),
)
AGENT_MODES = ("haproxy", "inport")


@dataclass(frozen=True, repr=False)
class AgentSettings(Group, HostSide, rows=AGENT_OPTIONS):
    """Validated configuration of ``imds agent`` (the ``agent`` group). Build it with ``load_agent``."""

    ovsdb: str
    integration_bridge: str
    metadata_bridge: str
    upstream: str
    provider_cidr: str
    provider_cidr6: str
    provider_base_mac: str
    provider_vlan_id: int
    state_dir: Path
    haproxy_bin: str
    haproxy_user: str
    meta_netns: str | None
    meta_port: str
    mode: str
    metadata_next_hop: tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, ...]
    inport_route_table: int
    check_interval: float
    log_level: str
    max_connections_per_source: int
    watch_max_timeout: int
