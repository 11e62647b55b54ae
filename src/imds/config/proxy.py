"""``imds proxy``'s options (``PROXY_OPTIONS``, flags generated the same way, env vars IMDS_PROXY_*) and settings.

One group, ``proxy``; its checks are ``imds.config.checks.check_proxy``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from imds.config.option import Group, Option, listen, log_level

PROXY_OPTIONS: tuple[Option, ...] = (
    Option("listen", "IMDS_PROXY_LISTEN", "list", ("169.254.169.254:80",),
           "HOST:PORT to listen on (repeatable; [v6]:PORT, [fe80::a9fe:a9fe%IFACE]:PORT; env: comma-separated).",
           parse=listen, group="proxy"),
    Option("upstream", "IMDS_PROXY_UPSTREAM", "str", None,
           "Base URL of imds serve, e.g. http://10.0.0.2:8000 (required).", group="proxy"),
    Option("shared_secret_file", "IMDS_PROXY_SHARED_SECRET_FILE", "path", None,
           "File holding the secret that signs X-Instance-ID (the one imds serve checks; required).", group="proxy"),
    Option("map", "IMDS_PROXY_MAP", "path", None,
           "Identify VMs by source IP from this file (JSON or lines; see README), reloaded on SIGHUP or change.",
           group="proxy"),
    Option("map_poll_interval", "IMDS_PROXY_MAP_POLL_INTERVAL", "float", 2.0,
           "Seconds between checks of the --map file for changes (0: SIGHUP only).", group="proxy"),
    Option("inport", "IMDS_PROXY_INPORT", "bool", False,  # noqa: FBT003 - a table row, not a call site
           "Identify VMs by OVS port: source 128.0.0.0|ofport (imds agent --mode inport), looked up in --ovsdb.",
           group="proxy"),
    Option("ovsdb", "IMDS_PROXY_OVSDB", "str", None,
           "OVSDB server for --inport (unix:PATH), e.g. unix:/var/run/openvswitch/db.sock.", group="proxy"),
    Option("integration_bridge", "IMDS_PROXY_INTEGRATION_BRIDGE", "str", "br-int",
           "For --inport: the bridge whose OpenFlow port numbers the source addresses carry.", group="proxy"),
    Option("timeout", "IMDS_PROXY_TIMEOUT", "float", 5.0,
           "Seconds an upstream read or write may take, per request (then 503).", group="proxy"),
    Option("connect_timeout", "IMDS_PROXY_CONNECT_TIMEOUT", "float", 2.0,
           "Seconds to connect to the upstream (then 503).", group="proxy"),
    Option("max_connections", "IMDS_PROXY_MAX_CONNECTIONS", "int", 64,
           "Keep-alive connections to the upstream, at most.", group="proxy"),
    Option("max_body_bytes", "IMDS_PROXY_MAX_BODY_BYTES", "int", 64 * 1024,
           "Largest request body a VM may send (then 413).", group="proxy"),
    Option("max_requests_per_source", "IMDS_PROXY_MAX_REQUESTS_PER_SOURCE", "int", 32,
           "Requests one VM address may have in flight at once (0: off; over: 429).", group="proxy"),
    Option("log_level", "IMDS_PROXY_LOG_LEVEL", "str", "info",
           "Log level: debug, info, warning or error.", parse=log_level, group="proxy"),
)


@dataclass(frozen=True, repr=False)
class ProxySettings(Group, rows=PROXY_OPTIONS):
    """Validated configuration of ``imds proxy`` (the ``proxy`` group). Build it with ``load_proxy``."""

    listen: tuple[tuple[str, int], ...]
    upstream: str
    shared_secret_file: Path
    map: Path | None
    map_poll_interval: float
    inport: bool
    ovsdb: str | None
    integration_bridge: str
    timeout: float
    connect_timeout: float
    max_connections: int
    max_body_bytes: int
    max_requests_per_source: int
    log_level: str
