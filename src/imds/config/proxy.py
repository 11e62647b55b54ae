"""``imds proxy``'s options (``PROXY_OPTIONS``, flags generated the same way, env vars IMDS_PROXY_*) and settings.

One group, ``proxy``; its checks are ``imds.config.checks.check_proxy``. The signing and TLS rows
are shared with ``imds agent`` (``imds.config.hostside``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from imds.config.hostside import HostSide, host_side_rows
from imds.config.option import Group, Option, Rows, listen

_proxy = Rows("proxy", "IMDS_PROXY_")

PROXY_OPTIONS: tuple[Option, ...] = (
    _proxy("listen", "list", ("169.254.169.254:80",),
        "HOST:PORT to listen on (repeatable; [v6]:PORT, [fe80::a9fe:a9fe%IFACE]:PORT; env: comma-separated).",
        parse=listen),
    _proxy("upstream", "str", None,
        "Base URL of imds serve, e.g. http://10.0.0.2:8000 or https://imds.internal:8443 (required)."),
    *host_side_rows(_proxy),
    _proxy("map", "path", None,
        "Identify VMs by source IP from this file (JSON or lines; see README), reloaded on SIGHUP or change."),
    _proxy("map_poll_interval", "float", 2.0, "Seconds between checks of the --map file for changes (0: SIGHUP only)."),
    _proxy("inport", "bool", False,  # noqa: FBT003 - a table row, not a call site
        "Identify VMs by OVS port: source 128.0.0.0|ofport (imds agent --mode inport), looked up in --ovsdb."),
    _proxy("ovsdb", "str", None, "OVSDB server for --inport (unix:PATH), e.g. unix:/var/run/openvswitch/db.sock."),
    _proxy("integration_bridge", "str", "br-int",
        "For --inport: the bridge whose OpenFlow port numbers the source addresses carry."),
    _proxy("timeout", "float", 5.0,
        "Seconds the whole proxied request may take: connect, answer and its body (then 504; a change watch "
        "gets its timeout_sec on top)."),
    _proxy("connect_timeout", "float", 2.0, "Seconds to connect to the upstream (then 503)."),
    _proxy("watch_max_timeout", "int", 300,
        "Longest wait_for_change timeout_sec held open (set it as imds serve's --watch-max-timeout)."),
    _proxy("max_connections", "int", 64, "Keep-alive connections to the upstream, at most."),
    _proxy("max_body_bytes", "int", 64 * 1024, "Largest request body a VM may send (then 413)."),
    _proxy("max_requests_per_source", "int", 32,
        "Requests one VM address may have in flight at once (0: off; over: 429)."),
    _proxy.log_level_row(),
)


@dataclass(frozen=True, repr=False)
class ProxySettings(Group, HostSide, rows=PROXY_OPTIONS):
    """Validated configuration of ``imds proxy`` (the ``proxy`` group). Build it with ``load_proxy``."""

    listen: tuple[tuple[str, int], ...]
    upstream: str
    map: Path | None
    map_poll_interval: float
    inport: bool
    ovsdb: str | None
    integration_bridge: str
    timeout: float
    connect_timeout: float
    watch_max_timeout: int
    max_connections: int
    max_body_bytes: int
    max_requests_per_source: int
    log_level: str
