"""``imds agent``'s options (``AGENT_OPTIONS``, env vars IMDS_AGENT_*) and settings.

``imds agent`` (one per hypervisor) has its own table, so its flags and variables stay apart from
the server's. One group, ``agent``; its checks are ``imds.config.checks.check_agent`` (provider
ranges are validated by ``imds.agent.allocate.Pool``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from imds.config.option import Group, Option, log_level

AGENT_OPTIONS: tuple[Option, ...] = (
    Option("ovsdb", "IMDS_AGENT_OVSDB", "str", "unix:/var/run/openvswitch/db.sock",
           "OVSDB server to read VM ports from and write Meta addresses to (unix:PATH or tcp:HOST:PORT).",
           group="agent"),
    Option("integration_bridge", "IMDS_AGENT_INTEGRATION_BRIDGE", "str", "br-int",
           "The bridge VM ports are plugged into (the operator's; it must exist).", group="agent"),
    Option("metadata_bridge", "IMDS_AGENT_METADATA_BRIDGE", "str", "br-meta",
           "The bridge the agent creates for tap-meta.", group="agent"),
    Option("upstream", "IMDS_AGENT_UPSTREAM", "str", None,
           "imds serve URL that haproxy forwards to, e.g. http://10.0.0.2:8000 (required).", group="agent"),
    Option("shared_secret_file", "IMDS_AGENT_SHARED_SECRET_FILE", "path", None,
           "File holding the proxy shared secret that signs X-Instance-ID (required).", group="agent"),
    Option("provider_cidr", "IMDS_AGENT_PROVIDER_CIDR", "str", "240.0.0.0/16",
           "IPv4 range of Meta IPs; the first host is tap-meta (haproxy).", group="agent"),
    Option("provider_cidr6", "IMDS_AGENT_PROVIDER_CIDR6", "str", "fd00:a9fe::/64",
           "IPv6 range of Meta IPv6 addresses (ULA); the first host is tap-meta.", group="agent"),
    Option("provider_base_mac", "IMDS_AGENT_PROVIDER_BASE_MAC", "str", "fa:16:ee:00:00:00",
           "Meta MACs are this plus the Meta IP's offset in the range (tap-meta: ...:01).", group="agent"),
    Option("provider_vlan_id", "IMDS_AGENT_PROVIDER_VLAN_ID", "int", 998,
           "VLAN tagging metadata traffic on the patch link between the two bridges.", group="agent"),
    Option("state_dir", "IMDS_AGENT_STATE_DIR", "path", "/var/lib/imds/agent",
           "Directory for the haproxy config and master socket.", group="agent"),
    Option("haproxy_bin", "IMDS_AGENT_HAPROXY_BIN", "str", "haproxy",
           "haproxy executable.", group="agent"),
    Option("meta_netns", "IMDS_AGENT_META_NETNS", "str", None,
           "Network namespace for tap-meta (created if missing; default: the host's own).", group="agent"),
    Option("meta_port", "IMDS_AGENT_META_PORT", "str", "tap-meta",
           "Name of the internal port haproxy listens behind.", group="agent"),
    Option("mode", "IMDS_AGENT_MODE", "str", "haproxy",
           "haproxy (one haproxy, a Meta IP per VM) or inport (source 128.0.0.0|ofport, for imds proxy --inport).",
           group="agent"),
    Option("check_interval", "IMDS_AGENT_CHECK_INTERVAL", "float", 2.0,
           "Seconds between checks that the flows are still installed (ovs-vswitchd restarts lose them).",
           group="agent"),
    Option("log_level", "IMDS_AGENT_LOG_LEVEL", "str", "info",
           "Log level: debug, info, warning or error.", parse=log_level, group="agent"),
    Option("max_connections_per_source", "IMDS_AGENT_MAX_CONNECTIONS_PER_SOURCE", "int", 32,
           "Open connections one VM port may hold to the metadata address (haproxy closes the rest at accept).",
           group="agent"),
)
AGENT_MODES = ("haproxy", "inport")


@dataclass(frozen=True, repr=False)
class AgentSettings(Group, rows=AGENT_OPTIONS):
    """Validated configuration of ``imds agent`` (the ``agent`` group). Build it with ``load_agent``."""

    ovsdb: str
    integration_bridge: str
    metadata_bridge: str
    upstream: str
    shared_secret_file: Path
    provider_cidr: str
    provider_cidr6: str
    provider_base_mac: str
    provider_vlan_id: int
    state_dir: Path
    haproxy_bin: str
    meta_netns: str | None
    meta_port: str
    mode: str
    check_interval: float
    log_level: str
    max_connections_per_source: int
