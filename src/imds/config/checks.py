"""Checks that need several options (``check_*``), one per concern, each naming the flags it refuses.

Each takes the resolved ``Values`` of its command; ``imds.config.commands`` lists which run for
which command. ``store_location`` derives ``imds serve``'s data directory and database URL from
the other values and the environment before the checks run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from imds.config.agent import AGENT_MODES
from imds.config.database import DatabaseUrlError, parse_database
from imds.config.hostside import check_host_side
from imds.config.resolve import Values
from imds.config.serve import IMDSV2_MODES, MIN_HEADER_BYTES, SERVERS
from imds.errors import ConfigError

_SQLITE_URL = re.compile(r"sqlite(\+\w+)?:///.+", re.DOTALL)


def _positive(value: float) -> bool:
    return value > 0


def store_location(values: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """The data directory (default: under XDG_DATA_HOME) and the database URL (default: an SQLite file in it)."""
    base = env.get("XDG_DATA_HOME") or str(Path(env.get("HOME", ".")) / ".local" / "share")
    data_dir = Path(values["data_dir"] or Path(base) / "imds")
    db_url = values["db"] or f"sqlite:///{data_dir / 'imds.db'}"
    if db_url.startswith("postgres://"):  # Heroku's and libpq's alias; SQLAlchemy knows only postgresql://
        db_url = "postgresql://" + db_url.removeprefix("postgres://")
    try:
        parse_database(db_url)  # the one parse of --db: refused here, once, in one line
    except DatabaseUrlError as exc:
        raise ConfigError(f"--db / IMDS_DB: {exc.message}") from exc
    return {"data_dir": data_dir, "db": db_url}


# --- imds serve ---------------------------------------------------------------------------

def check_limits(values: Values) -> None:
    """Admin write bounds are positive."""
    values.require(("max_body_bytes", "max_addresses", "max_document_depth", "max_document_keys"),
                   _positive, "must be positive")


def check_ec2(values: Values) -> None:
    """A known IMDSv2 mode, a hop limit an IP header holds, key and certificate files that exist."""
    if values["imdsv2"] not in IMDSV2_MODES:
        msg = f"--imdsv2 / IMDS_IMDSV2: {values['imdsv2']!r} is not one of {', '.join(IMDSV2_MODES)}"
        raise ConfigError(msg)
    values.require(("token_hop_limit",), lambda hops: 0 <= hops <= 255, "must be 0 (system default) to 255")
    values.require_files(("imdsv2_key_file", "identity_key", "identity_cert"))


def check_lookup(values: Values) -> None:
    """Upstream settings: an http(s) URL, one credential kind, complete client credentials."""
    url = values["lookup_url"]
    if url is not None and not url.lower().startswith(("http://", "https://")):
        msg = f"--lookup-url / IMDS_LOOKUP_URL: {url!r} is not an http:// or https:// URL"
        raise ConfigError(msg)
    oauth = [values[k] for k in ("lookup_oidc_issuer", "lookup_client_id", "lookup_client_secret")]
    if any(oauth) and not all(oauth):
        msg = ("--lookup-oidc-issuer, --lookup-client-id and --lookup-client-secret "
               "(IMDS_LOOKUP_OIDC_ISSUER, IMDS_LOOKUP_CLIENT_ID, IMDS_LOOKUP_CLIENT_SECRET) go together")
        raise ConfigError(msg)
    if any(oauth) and values["lookup_token"]:
        msg = "--lookup-token / IMDS_LOOKUP_TOKEN and OAuth2 client credentials exclude each other"
        raise ConfigError(msg)
    values.require(("lookup_timeout", "lookup_negative_ttl", "lookup_cache_ttl", "lookup_breaker_reset"),
                   _positive, "must be positive")
    values.require(("lookup_concurrency", "lookup_breaker_failures"), lambda n: n >= 1, "must be at least 1")
    values.require(("lookup_refresh_after",), lambda s: s >= 0, "must be 0 (off) or positive")


def check_http(values: Values) -> None:
    """Server choice and listener limits: a known server, positive limits, workers that can share a store."""
    if values["server"] not in SERVERS:
        msg = f"--server / IMDS_SERVER: {values['server']!r} is not one of {', '.join(SERVERS)}"
        raise ConfigError(msg)
    if values["workers"] > 1 and values["db"].startswith("memory://"):
        msg = "--workers / IMDS_WORKERS: more than one worker needs a shared database, not memory://"
        raise ConfigError(msg)
    values.require(("workers", "max_header_bytes", "max_headers", "header_timeout", "body_timeout",
                   "keepalive_timeout", "max_connections"), _positive, "must be positive")
    values.require(("max_header_bytes",), lambda n: n >= MIN_HEADER_BYTES, f"must be at least {MIN_HEADER_BYTES}")
    values.require(("max_connections_per_source",), lambda n: n >= 0, "must be 0 (off) or positive")
    shared = sorted(set(values["admin_listen"]) & set(values["listen"]))
    if shared:
        host, port = shared[0]
        msg = f"--admin-listen / IMDS_ADMIN_LISTEN: {host}:{port} is also a --listen address (give the admin its own)"
        raise ConfigError(msg)


def check_callers(values: Values) -> None:
    """Rate limit bounds, a positive signature window; a previous proxy or fleet secret only beside a current one."""
    values.require(("rate_limit", "rate_burst", "max_requests_per_source"), lambda n: n >= 0, "must be zero or more")
    values.require(("proxy_signature_window",), _positive, "must be positive")
    if values["rate_limit"] and values["rate_burst"] < 1:
        msg = "--rate-burst / IMDS_RATE_BURST must be at least 1 when --rate-limit is on"
        raise ConfigError(msg)
    for previous, current in (("proxy_previous_secret_file", "proxy_shared_secret_file"),
                              ("proxy_previous_fleet_secret_file", "proxy_fleet_secret_file")):
        if values[previous] is not None and values[current] is None:
            msg = f"--{previous.replace('_', '-')} / IMDS_{previous.upper()} needs --{current.replace('_', '-')}"
            raise ConfigError(msg)


def check_admin(values: Values) -> None:
    """The admin tokens file exists."""
    values.require_files(("admin_tokens_file",))


def check_ganeti(values: Values) -> None:
    """The private key file exists; OS parameter and package bounds are positive; metad's socket has one worker."""
    values.require_files(("private_key_file",))
    if values["ganeti_metad_socket"] is not None and values["workers"] > 1:
        msg = "--ganeti-metad-socket / IMDS_GANETI_METAD_SOCKET is served by one process: use --workers 1"
        raise ConfigError(msg)
    values.require(("os_param_max_bytes", "os_package_max_bytes", "os_package_timeout", "os_image_max_bytes"),
                   _positive, "must be positive")


def check_channel(values: Values) -> None:
    """The instance<->host channel bounds are positive."""
    values.require(("event_rate", "event_burst", "event_max_bytes", "event_retain", "message_max_bytes",
                   "message_max_queued", "watch_max_timeout"), _positive, "must be positive")


def check_store(values: Values) -> None:
    """An SQLite URL has its path after three slashes; database timeouts are positive."""
    db = values["db"]
    if db.startswith("sqlite") and not _SQLITE_URL.fullmatch(db):
        msg = (f"--db / IMDS_DB: {db!r} is not an SQLite URL: the path follows three slashes "
               "(sqlite:///relative/path.db, sqlite:////absolute/path.db)")
        raise ConfigError(msg)
    values.require(("db_connect_timeout", "db_statement_timeout"), _positive, "must be positive")


SERVE_CHECKS = (check_limits, check_ec2, check_lookup, check_http, check_callers, check_admin, check_ganeti,
                check_channel, check_store)


# --- imds proxy and imds agent --------------------------------------------------------------

def check_proxy(values: Values) -> None:
    """An http(s):// upstream, one signing mode, exactly one identification mode, positive limits."""
    upstream = values["upstream"]
    if not upstream or not upstream.lower().startswith(("http://", "https://")):
        msg = "--upstream / IMDS_PROXY_UPSTREAM: an http://HOST:PORT or https://HOST:PORT URL of imds serve is required"
        raise ConfigError(msg)
    check_host_side(values)
    if (values["map"] is None) == (not values["inport"]):
        msg = "exactly one identification mode is required: --map FILE, or --ovsdb unix:PATH --inport"
        raise ConfigError(msg)
    if values["inport"] and not values["ovsdb"]:
        msg = "--inport needs --ovsdb unix:PATH / IMDS_PROXY_OVSDB"
        raise ConfigError(msg)
    values.require(("timeout", "connect_timeout", "max_connections", "max_body_bytes", "watch_max_timeout"), _positive,
                   "must be positive")
    values.require(("map_poll_interval", "max_requests_per_source"), lambda s: s >= 0, "must be 0 (off) or positive")


def check_agent(values: Values) -> None:
    """The upstream, one signing mode, a known mode, a valid VLAN, positive intervals, Linux-sized port names."""
    values.require(("upstream",), lambda value: value is not None, "is required")
    check_host_side(values)
    if values["mode"] not in AGENT_MODES:
        raise ConfigError(f"--mode / IMDS_AGENT_MODE: {values['mode']!r} is not one of {', '.join(AGENT_MODES)}")
    values.require(("provider_vlan_id",), lambda vlan: 1 <= vlan <= 4094, "must be 1 to 4094")
    # Below the main table's rule (32766), above 0 (local): a table of its own for in-port mode.
    values.require(("inport_route_table",), lambda table: 1 <= table <= 32765 and table not in (253, 254, 255),
                   "must be 1 to 32765, not a reserved table (253-255)")
    values.require(("check_interval", "max_connections_per_source", "watch_max_timeout"), _positive, "must be positive")
    for name in ("meta_port", "integration_bridge", "metadata_bridge"):
        if not 0 < len(values[name]) <= 15:
            raise ConfigError(f"--{name.replace('_', '-')}: {values[name]!r} must be 1-15 characters (a Linux name)")
