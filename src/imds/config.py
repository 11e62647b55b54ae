"""Settings: the only module that reads the environment.

Every option has one row in ``OPTIONS``: its flag (``--listen``), its environment variable
(``IMDS_LISTEN``), its kind, default and help, and the group (concern) it belongs to. The CLI
builds its flags from that table, and ``load`` resolves each value once: flag, else
environment, else the TOML config file (``--config`` / ``IMDS_CONFIG``; keys are option
names), else default. The result is a frozen ``Settings`` of groups, one frozen dataclass per
concern (``settings.store.db``, ``settings.limits.max_body_bytes``), each built generically
from the rows by name: a group's fields are exactly its options' names, holding the value in
the row's kind (``parse`` turns a few into richer values: addresses, networks, templates). So
an option is one row plus one typed field. Checks that need several options are small named
functions below (``_check_*``), each naming the flag. Nothing else reads ``os.environ`` or
the config file. ``imds proxy`` (``PROXY_OPTIONS`` → ``ProxySettings``) and ``imds agent``
(``AGENT_OPTIONS`` → ``AgentSettings``) are one group each, built the same way.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, TypeVar, get_type_hints

from imds.errors import ConfigError
from imds.models import Network
from imds.templates import Template, compile_template

Kind = Literal["str", "int", "float", "bool", "list", "path"]


@dataclass(frozen=True)
class Option:
    """One setting: flag name, environment variable, kind, default, help text and group.

    ``group`` names the dataclass holding it (``Settings.<group>``, or ``proxy``/``agent``).
    ``parse`` turns the value (already of ``kind``) into the field's value, raising ConfigError.
    """

    name: str
    env: str
    kind: Kind
    default: Any
    help: str
    secret: bool = False
    parse: Callable[[Option, Any], Any] | None = None
    group: str = field(kw_only=True)

    @property
    def flag(self) -> str:
        """The command-line flag, e.g. ``--trusted-proxy``."""
        return "--" + self.name.replace("_", "-")

    @property
    def named(self) -> str:
        """How error messages name it: ``--flag / IMDS_VAR``."""
        return f"{self.flag} / {self.env}"


# --- value parsers named by rows (each raises ConfigError naming the option) ------------------

LOG_LEVELS = ("debug", "info", "warning", "error")
INSTANCE_AUTH_FLAVORS = ("json", "openstack", "nocloud", "ganeti")


def parse_listen(value: str) -> tuple[str, int]:
    """Parse ``HOST:PORT`` or ``[V6]:PORT`` into a (host, port) pair."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        msg = f"--listen / IMDS_LISTEN: {value!r} is not HOST:PORT"
        raise ConfigError(msg)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        msg = f"--listen / IMDS_LISTEN: {value!r} has no host (use 0.0.0.0 or [::])"
        raise ConfigError(msg)
    return host, int(port)


def _listen(_option: Option, values: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    return tuple(parse_listen(item) for item in values)


def _networks(option: Option, values: tuple[str, ...]) -> tuple[Network, ...]:
    networks = []
    for value in values:
        try:
            networks.append(ipaddress.ip_network(value, strict=False))
        except ValueError as exc:
            msg = f"{option.named}: {value!r} is not a CIDR"
            raise ConfigError(msg) from exc
    return tuple(networks)


def _log_level(option: Option, value: str) -> str:
    level = value.lower()
    if level not in LOG_LEVELS:
        msg = f"{option.named}: {level!r} is not one of {', '.join(LOG_LEVELS)}"
        raise ConfigError(msg)
    return level


def _flavors(option: Option, values: tuple[str, ...]) -> frozenset[str]:
    chosen = {str(value).strip().lower() for value in values if str(value).strip()}
    unknown = sorted(chosen - {*INSTANCE_AUTH_FLAVORS, "all"})
    if unknown:
        msg = f"{option.named}: {', '.join(unknown)} is not one of {', '.join(INSTANCE_AUTH_FLAVORS)} or all"
        raise ConfigError(msg)
    return frozenset(INSTANCE_AUTH_FLAVORS) if "all" in chosen else frozenset(chosen)


def _template(option: Option, source: str | None) -> str | None:
    """The template's source, once it compiles (``imds serve`` renders it into every document)."""
    if source:
        try:
            compile_template(option.name, source)
        except ConfigError as exc:
            raise ConfigError(f"{option.named}: {exc.message}") from exc
    return source


OPTIONS: tuple[Option, ...] = (
    Option("listen", "IMDS_LISTEN", "list", ("127.0.0.1:8000", "[::1]:8000"),
           "HOST:PORT to listen on (repeatable; [v6]:PORT for IPv6; env: comma-separated; "
           "the default's [::1] is skipped on a host without IPv6 loopback).", parse=_listen, group="http"),
    Option("admin_listen", "IMDS_ADMIN_LISTEN", "list", (),
           "HOST:PORT for the admin API alone (repeatable; [v6]:PORT). When set, the --listen addresses "
           "serve instances only and answer admin paths 404.", parse=_listen, group="http"),
    Option("data_dir", "IMDS_DATA_DIR", "path", None,
           "Directory for the embedded database and generated keys "
           "(default: $XDG_DATA_HOME/imds or ~/.local/share/imds).", group="store"),
    Option("db", "IMDS_DB", "str", None,
           "Database URL: sqlite:///PATH, postgresql://USER:PASS@HOST:PORT/DB or memory:// "
           "(default: an SQLite file in the data directory).", group="store"),
    Option("migrate", "IMDS_MIGRATE", "bool", True,  # noqa: FBT003 - a table row, not a call site
           "Apply database migrations at startup.", group="store"),
    Option("trusted_proxy", "IMDS_TRUSTED_PROXIES", "list", (),
           "CIDR of a proxy whose X-Forwarded-For is believed (repeatable; default: none).",
           parse=_networks, group="callers"),
    Option("proxy_shared_secret_file", "IMDS_PROXY_SHARED_SECRET_FILE", "path", None,
           "File holding the secret a trusted proxy signs X-Instance-ID with (unset: signed ids are refused).",
           group="callers"),
    Option("proxy_previous_secret_file", "IMDS_PROXY_PREVIOUS_SECRET_FILE", "path", None,
           "The previous proxy secret, still accepted during a rotation (remove it when every proxy has the new one).",
           group="callers"),
    Option("api_url", "IMDS_API_URL", "str", None,
           "Template for the api_url field, e.g. https://{{.facility}}.example/{{.id}}.",
           parse=_template, group="templates"),
    Option("phone_home_url", "IMDS_PHONE_HOME_URL", "str", None,
           "Template for the phone_home_url field.", parse=_template, group="templates"),
    Option("user_state_url", "IMDS_USER_STATE_URL", "str", None,
           "Template for the user_state_url field.", parse=_template, group="templates"),
    Option("admin_token", "IMDS_ADMIN_TOKEN", "str", None,
           "Static bearer token with every admin scope (prefer the env var: flags show in ps).", secret=True,
           group="admin"),
    Option("admin_tokens_file", "IMDS_ADMIN_TOKENS_FILE", "path", None,
           "JSON file of admin tokens with their scopes (see docs/admin-auth.md).", group="admin"),
    Option("oidc_issuer", "IMDS_OIDC_ISSUER", "str", None,
           "OIDC issuer whose JWTs the admin API accepts.", group="admin"),
    Option("oidc_jwks_url", "IMDS_OIDC_JWKS_URL", "str", None,
           "JWKS URL (default: discovered from the issuer's openid-configuration).", group="admin"),
    Option("oidc_audience", "IMDS_OIDC_AUDIENCE", "str", None,
           "Audience the JWTs must carry.", group="admin"),
    Option("oidc_roles_claim", "IMDS_OIDC_ROLES_CLAIM", "str", "scope",
           "JWT claim holding the scopes (a list, or a space-separated string).", group="admin"),
    Option("oidc_username_claim", "IMDS_OIDC_USERNAME_CLAIM", "str", "sub",
           "JWT claim logged as the subject of each admin write.", group="admin"),
    Option("imdsv2", "IMDS_IMDSV2", "str", "optional",
           "EC2 IMDSv2 tokens: optional (tokenless GETs allowed) or required.", group="ec2"),
    Option("token_hop_limit", "IMDS_TOKEN_HOP_LIMIT", "int", 0,
           "IP TTL / hop limit of every response on the listeners (AWS's PUT hop limit; 0: system default).",
           group="ec2"),
    Option("imdsv2_key_file", "IMDS_IMDSV2_KEY_FILE", "path", None,
           "HMAC key for IMDSv2 tokens (default: imdsv2.key in the data directory; replicas must share it).",
           group="ec2"),
    Option("identity_key", "IMDS_IDENTITY_KEY", "path", None,
           "RSA private key (PEM) signing EC2 identity documents (default: generated into the data directory).",
           group="ec2"),
    Option("identity_cert", "IMDS_IDENTITY_CERT", "path", None,
           "Certificate (PEM) for --identity-key (default: self-signed).", group="ec2"),
    Option("lookup_url", "IMDS_LOOKUP_URL", "str", None,
           "Upstream source of truth (hollow's lookup contract); unknown callers are fetched from it.", group="lookup"),
    Option("lookup_token", "IMDS_LOOKUP_TOKEN", "str", None,
           "Static bearer token for the upstream (prefer the env var: flags show in ps).", secret=True, group="lookup"),
    Option("lookup_oidc_issuer", "IMDS_LOOKUP_OIDC_ISSUER", "str", None,
           "OIDC issuer whose token endpoint grants upstream access tokens (client credentials).", group="lookup"),
    Option("lookup_client_id", "IMDS_LOOKUP_CLIENT_ID", "str", None,
           "OAuth2 client id for the upstream.", group="lookup"),
    Option("lookup_client_secret", "IMDS_LOOKUP_CLIENT_SECRET", "str", None,
           "OAuth2 client secret for the upstream (prefer the env var: flags show in ps).", secret=True,
           group="lookup"),
    Option("lookup_scope", "IMDS_LOOKUP_SCOPES", "list", (),
           "OAuth2 scope to request (repeatable; env: comma-separated).", group="lookup"),
    Option("lookup_audience", "IMDS_LOOKUP_AUDIENCE", "str", None,
           "OAuth2 audience to request.", group="lookup"),
    Option("lookup_timeout", "IMDS_LOOKUP_TIMEOUT", "float", 2.0,
           "Seconds one upstream call may take.", group="lookup"),
    Option("lookup_negative_ttl", "IMDS_LOOKUP_NEGATIVE_TTL", "float", 30.0,
           "Seconds an upstream 404 is remembered.", group="lookup"),
    Option("lookup_refresh_after", "IMDS_LOOKUP_REFRESH_AFTER", "float", 0.0,
           "Refresh records fetched by lookup in the background after this many seconds (0: off).", group="lookup"),
    Option("lookup_cache_ttl", "IMDS_LOOKUP_CACHE_TTL", "float", 300.0,
           "Seconds a by-IP answer that does not list the asking address is reused.", group="lookup"),
    Option("lookup_concurrency", "IMDS_LOOKUP_CONCURRENCY", "int", 16,
           "Most upstream calls in flight at once.", group="lookup"),
    Option("lookup_breaker_failures", "IMDS_LOOKUP_BREAKER_FAILURES", "int", 5,
           "Consecutive upstream failures that open the circuit breaker.", group="lookup"),
    Option("lookup_breaker_reset", "IMDS_LOOKUP_BREAKER_RESET", "float", 10.0,
           "Seconds the breaker first stays open (doubling on each reopening, jittered, at most 120).", group="lookup"),
    Option("max_body_bytes", "IMDS_MAX_BODY_BYTES", "int", 1024 * 1024,
           "Largest admin request body accepted, in bytes.", group="limits"),
    Option("max_addresses", "IMDS_MAX_ADDRESSES", "int", 4096,
           "Most entries in one write's ipAddresses list.", group="limits"),
    Option("max_document_depth", "IMDS_MAX_DOCUMENT_DEPTH", "int", 64,
           "Deepest nesting of objects and lists accepted in a metadata document.", group="limits"),
    Option("max_document_keys", "IMDS_MAX_DOCUMENT_KEYS", "int", 20000,
           "Most object keys (counted over every level) accepted in a metadata document.", group="limits"),
    Option("metrics_public", "IMDS_METRICS_PUBLIC", "bool", False,  # noqa: FBT003 - a table row, not a call site
           "Serve /metrics without a token (hollow-compatible scraping); off: it needs a metrics or read scope.",
           group="admin"),
    Option("demo", "IMDS_DEMO", "bool", False,  # noqa: FBT003 - a table row, not a call site
           "Load a demo instance bound to 127.0.0.1 and ::1 at startup.", group="store"),
    Option("log_level", "IMDS_LOG_LEVEL", "str", "info",
           "Log level: debug, info, warning or error.", parse=_log_level, group="logging"),
    Option("log_instance_reads", "IMDS_LOG_INSTANCE_READS", "bool", False,  # noqa: FBT003 - a table row, not a call site
           "Log every instance read (off by default).", group="logging"),
    Option("feed_poll_interval", "IMDS_FEED_POLL_INTERVAL", "float", 1.0,
           "Seconds between polls of the change feed written by other replicas.", group="store"),
    Option("render_cache_bytes", "IMDS_RENDER_CACHE_BYTES", "int", 256 << 20,
           "Approximate bytes of parsed documents and rendered replies kept for recently read instances.",
           group="store"),
    Option("shutdown_timeout", "IMDS_SHUTDOWN_TIMEOUT", "float", 10.0,
           "Seconds to let in-flight requests finish on shutdown.", group="http"),
    # Ganeti OS installation (services/ganeti/records.py)
    Option("private_key_file", "IMDS_PRIVATE_KEY_FILE", "path", None,
           "Fernet keys (one per line; the first encrypts, all decrypt) encrypting private OS parameters at rest.",
           group="ganeti"),
    Option("os_definitions_dir", "IMDS_OS_DEFINITIONS_DIR", "path", None,
           "Directory of Ganeti OS definitions (DIR/<os>/create, export, import, rename, verify, parameters.list, "
           "ganeti_api_version).", group="ganeti"),
    Option("os_param_max_bytes", "IMDS_OS_PARAM_MAX_BYTES", "int", 4096,
           "Largest OS parameter value accepted, in bytes (UTF-8).", group="ganeti"),
    Option("os_package_max_bytes", "IMDS_OS_PACKAGE_MAX_BYTES", "int", 64 * 1024 * 1024,
           "Largest personalization package fetched for /ganeti/.../os/package, in bytes (held in memory, "
           "never on disk).", group="ganeti"),
    Option("os_package_timeout", "IMDS_OS_PACKAGE_TIMEOUT", "float", 30.0,
           "Seconds a personalization package fetch may take.", group="ganeti"),
    Option("ganeti_metad_socket", "IMDS_GANETI_METAD_SOCKET", "path", None,
           "Unix socket taking ganeti-metad's place: Ganeti's node daemon pushes instances here (Luxi, mode 0600).",
           group="ganeti"),
    # The instance<->host channel and change watch (README: "The instance↔host channel").
    Option("event_rate", "IMDS_EVENT_RATE", "float", 1.0,
           "Events (and phone-homes) an instance may post per second, on average, per replica.", group="channel"),
    Option("event_burst", "IMDS_EVENT_BURST", "int", 10,
           "Events an instance may post at once before --event-rate applies.", group="channel"),
    Option("event_max_bytes", "IMDS_EVENT_MAX_BYTES", "int", 4096,
           "Largest event body an instance may post, in bytes.", group="channel"),
    Option("event_retain", "IMDS_EVENT_RETAIN", "int", 1000,
           "Events kept per instance; older ones are dropped.", group="channel"),
    Option("message_max_bytes", "IMDS_MESSAGE_MAX_BYTES", "int", 65536,
           "Largest message the host may queue for an instance, in bytes.", group="channel"),
    Option("message_max_queued", "IMDS_MESSAGE_MAX_QUEUED", "int", 100,
           "Messages that may wait for one instance; one more is refused (409).", group="channel"),
    Option("watch_max_timeout", "IMDS_WATCH_MAX_TIMEOUT", "int", 300,
           "Largest timeout_sec a wait_for_change request may ask for (and the default).", group="channel"),
    # Anti-SSRF policy per flavor and database fault bounds (services/identity/instance_auth.py, store/sql/engine.py)
    Option("instance_auth", "IMDS_INSTANCE_AUTH", "list", (),
           "Flavors whose paths need 'Metadata: true', a Metadata-Flavor header or an IMDSv2 token "
           "(json, openstack, nocloud, ganeti or all; repeatable; env: comma-separated; default: none).",
           parse=_flavors, group="callers"),
    Option("db_connect_timeout", "IMDS_DB_CONNECT_TIMEOUT", "float", 5.0,
           "Seconds to wait for a database connection before answering 503.", group="store"),
    Option("db_statement_timeout", "IMDS_DB_STATEMENT_TIMEOUT", "float", 5.0,
           "Seconds one database statement (or SQLite's write lock) may take before answering 503.", group="store"),
    # Server and listener limits (docs/server.md).
    Option("server", "IMDS_SERVER", "str", "granian",
           "HTTP server: granian (fastest, every limit below) or uvicorn (no header read timeout).", group="http"),
    Option("workers", "IMDS_WORKERS", "int", 1,
           "Server processes sharing the listeners (each loads the catalog; not with memory://).", group="http"),
    Option("max_header_bytes", "IMDS_MAX_HEADER_BYTES", "int", 16384,
           "Largest request line plus headers, in bytes (larger: 431 or the connection is closed).", group="http"),
    Option("max_headers", "IMDS_MAX_HEADERS", "int", 100,
           "Most header lines in one request (more: 431).", group="http"),
    Option("header_timeout", "IMDS_HEADER_TIMEOUT", "float", 10.0,
           "Seconds a connection may take to send a request's headers, idle keep-alive included.", group="http"),
    Option("body_timeout", "IMDS_BODY_TIMEOUT", "float", 10.0,
           "Seconds the server waits for each part of a request body.", group="http"),
    Option("keepalive_timeout", "IMDS_KEEPALIVE_TIMEOUT", "float", 5.0,
           "Seconds uvicorn keeps an idle keep-alive connection (granian closes it after --header-timeout).",
           group="http"),
    Option("max_connections", "IMDS_MAX_CONNECTIONS", "int", 512,
           "Most open connections per listener and worker; more wait in the kernel's backlog.", group="http"),
    Option("rate_limit", "IMDS_RATE_LIMIT", "float", 50.0,
           "Instance requests per second per caller address (token bucket; 0: off; over: 429).", group="callers"),
    Option("rate_burst", "IMDS_RATE_BURST", "int", 200,
           "Instance requests a caller address may make at once before --rate-limit applies.", group="callers"),
    Option("max_requests_per_source", "IMDS_MAX_REQUESTS_PER_SOURCE", "int", 32,
           "Instance requests one caller address may have in flight at once (0: off; over: 429).",
           group="callers"),
)


SERVERS = ("granian", "uvicorn")
MIN_HEADER_BYTES = 8192  # granian's (hyper's) smallest read buffer

IMDSV2_MODES = ("optional", "required")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


# --- the groups: one frozen dataclass per concern; fields are exactly its rows' names ---------

@dataclass(frozen=True, repr=False)
class Group:
    """What every group shares: a repr that never shows a secret, even in a traceback."""

    def __repr__(self) -> str:
        """Fields by name; secrets shown as ``<set>``, the password in a database URL masked."""
        shown = ", ".join(f"{f.name}={_masked(f.name, getattr(self, f.name))}" for f in fields(self))
        return f"{type(self).__name__}({shown})"


@dataclass(frozen=True, repr=False)
class HttpSettings(Group):
    """The HTTP server and its listeners (docs/server.md)."""

    listen: tuple[tuple[str, int], ...]
    admin_listen: tuple[tuple[str, int], ...]
    server: str
    workers: int
    max_header_bytes: int
    max_headers: int
    header_timeout: float
    body_timeout: float
    keepalive_timeout: float
    max_connections: int
    shutdown_timeout: float


@dataclass(frozen=True, repr=False)
class CallerSettings(Group):
    """Who is calling on the instance side: trusted proxies, signed ids, anti-SSRF, rate limit."""

    trusted_proxy: tuple[Network, ...]
    proxy_shared_secret_file: Path | None
    proxy_previous_secret_file: Path | None
    instance_auth: frozenset[str]
    rate_limit: float
    rate_burst: int
    max_requests_per_source: int


@dataclass(frozen=True, repr=False)
class StoreSettings(Group):
    """The database: where, how long to wait for it, the change feed; the demo record."""

    data_dir: Path | None
    db: str
    migrate: bool
    db_connect_timeout: float
    db_statement_timeout: float
    feed_poll_interval: float
    render_cache_bytes: int
    demo: bool

    @property
    def key_dir(self) -> Path | None:
        """Where generated keys live: the data directory, except for the in-memory store.

        None (keys generated in memory, lost on restart) also when no data directory is
        set, which only happens when Settings is built by ``Settings.of`` rather than ``load``.
        """
        return None if self.db.startswith("memory://") else self.data_dir


@dataclass(frozen=True, repr=False)
class AdminSettings(Group):
    """Who may use the admin API: static tokens, a tokens file, OIDC; the /metrics exception."""

    admin_token: str | None
    admin_tokens_file: Path | None
    oidc_issuer: str | None
    oidc_jwks_url: str | None
    oidc_audience: str | None
    oidc_roles_claim: str
    oidc_username_claim: str
    metrics_public: bool


@dataclass(frozen=True, repr=False)
class LimitSettings(Group):
    """Bounds on admin writes."""

    max_body_bytes: int
    max_addresses: int
    max_document_depth: int
    max_document_keys: int


@dataclass(frozen=True, repr=False)
class Ec2Settings(Group):
    """EC2 specifics: IMDSv2 tokens and signed identity documents."""

    imdsv2: str
    token_hop_limit: int
    imdsv2_key_file: Path | None
    identity_key: Path | None
    identity_cert: Path | None


@dataclass(frozen=True, repr=False)
class TemplateSettings(Group):
    """Template fields added to every metadata document (each compiled once at load)."""

    api_url: str | None
    phone_home_url: str | None
    user_state_url: str | None

    @property
    def sources(self) -> dict[str, str]:
        """The configured template fields, by the metadata key they fill."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}

    @property
    def compiled(self) -> tuple[Template, ...]:
        """The configured template fields, compiled (``load`` already refused any that do not compile)."""
        return tuple(compile_template(key, source) for key, source in self.sources.items())


@dataclass(frozen=True, repr=False)
class LookupSettings(Group):
    """The upstream source of truth (pull mode): where, credentials, caching, the breaker."""

    lookup_url: str | None
    lookup_token: str | None
    lookup_oidc_issuer: str | None
    lookup_client_id: str | None
    lookup_client_secret: str | None
    lookup_scope: tuple[str, ...]
    lookup_audience: str | None
    lookup_timeout: float
    lookup_negative_ttl: float
    lookup_refresh_after: float
    lookup_cache_ttl: float
    lookup_concurrency: int
    lookup_breaker_failures: int
    lookup_breaker_reset: float


@dataclass(frozen=True, repr=False)
class GanetiSettings(Group):
    """Ganeti OS installation (services/ganeti/records.py)."""

    private_key_file: Path | None
    os_definitions_dir: Path | None
    os_param_max_bytes: int
    os_package_max_bytes: int
    os_package_timeout: float
    ganeti_metad_socket: Path | None


@dataclass(frozen=True, repr=False)
class ChannelSettings(Group):
    """The instance<->host channel and change watch (README: "The instance↔host channel")."""

    event_rate: float
    event_burst: int
    event_max_bytes: int
    event_retain: int
    message_max_bytes: int
    message_max_queued: int
    watch_max_timeout: int


@dataclass(frozen=True, repr=False)
class LogSettings(Group):
    """Logging."""

    log_level: str
    log_instance_reads: bool


@dataclass(frozen=True)
class Settings:
    """Validated configuration of ``imds serve``, by group. Build it with ``load`` (or ``Settings.of``)."""

    http: HttpSettings
    callers: CallerSettings
    store: StoreSettings
    admin: AdminSettings
    limits: LimitSettings
    ec2: Ec2Settings
    templates: TemplateSettings
    lookup: LookupSettings
    ganeti: GanetiSettings
    channel: ChannelSettings
    logging: LogSettings

    @classmethod
    def of(cls, **values: Any) -> Settings:
        """Settings from the defaults, overridden by ``values`` (option names, values already of the field's type).

        Without the environment, the config file or checks: for tests and embedding. The store
        defaults to ``memory://`` and the data directory to none.
        """
        typed = {option.name: _typed(option, option.default) for option in OPTIONS} | {"db": "memory://"}
        unknown = sorted(values.keys() - typed.keys())
        if unknown:
            msg = f"Settings.of: unknown option {', '.join(unknown)}"
            raise TypeError(msg)
        return _assemble(typed | values)


G = TypeVar("G", bound=Group)


SETTINGS_GROUPS: dict[str, type[Group]] = get_type_hints(Settings)


def groups() -> dict[str, type[Group]]:
    """Every group by name: ``Settings``' fields, then ``proxy`` and ``agent``."""
    return {**SETTINGS_GROUPS, "proxy": ProxySettings, "agent": AgentSettings}


def _build(cls: type[G], values: Mapping[str, Any]) -> G:
    """The group ``cls`` from values by option name (``tests/unit/test_config_groups.py`` keeps them equal)."""
    return cls(**{f.name: values[f.name] for f in fields(cls)})


def _assemble(values: Mapping[str, Any]) -> Settings:
    built: dict[str, Any] = {name: _build(cls, values) for name, cls in SETTINGS_GROUPS.items()}
    return Settings(**built)


def _masked(name: str, value: Any) -> str:
    """A field's value as its group's repr shows it."""
    if name == "db" and isinstance(value, str):
        return repr(_redact_url(value))
    secret = any(o.secret for o in (*OPTIONS, *PROXY_OPTIONS, *AGENT_OPTIONS) if o.name == name)
    return "<set>" if secret and value else repr(value)


_CASTS: dict[str, Callable[[Any], Any]] = {"int": int, "float": float, "bool": bool, "list": tuple, "str": str,
                                            "path": Path}


def _typed(option: Option, value: Any) -> Any:
    """A resolved value as its group's field holds it: the row's kind, then the row's ``parse``."""
    if value is not None:
        value = _CASTS[option.kind](value)
    return value if option.parse is None else option.parse(option, value)


def options_table(table: tuple[Option, ...] = OPTIONS) -> str:
    """The README's configuration table, in Markdown (``tests/unit/test_docs.py`` keeps them equal).

    Regenerate with ``python -c "from imds.config import options_table; print(options_table())"``
    (``options_table(PROXY_OPTIONS)`` for ``imds proxy``'s).
    """
    rows = ["| flag | environment | default | meaning |", "|---|---|---|---|"]
    for option in table:
        default = option.default
        if isinstance(default, bool):
            shown = "on" if default else "off"
        elif isinstance(default, tuple):
            shown = ",".join(default) if default else "none"
        else:
            shown = "—" if default is None else str(default)
        flag = option.flag + (" (repeatable)" if option.kind == "list" else "")
        if option.kind == "bool":
            flag = f"{option.flag} / --no-{option.flag[2:]}"
        rows.append(f"| `{flag}` | `{option.env}` | `{shown}` | {option.help} |")
    return "\n".join(rows)


def load(flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Resolve every option from ``flags``, then ``environ``, then the config file, then its default.

    ``flags`` maps option names to values given on the command line (``None`` or an
    empty tuple means "not given"). ``environ`` defaults to ``os.environ``. The config
    file is ``flags["config"]``, else ``IMDS_CONFIG`` (see ``layered``).
    """
    env = os.environ if environ is None else environ
    raw = {name: value for name, (value, _source) in layered(flags or {}, env).items()}
    return _validate(raw, env)


# --- the config file layer (imds config show) --------------------------------------------

CONFIG_OPTION = Option("config", "IMDS_CONFIG", "path", None,
                       'TOML file of settings (keys are option names, e.g. listen = ["127.0.0.1:8000"]); '
                       "flags and environment variables override it.", group="config")
FLAG, ENV, FILE, DEFAULT = "flag", "env", "file", "default"
SHOWN_SECRET = "********"  # noqa: S105 - the mask, not a secret


def layered(
    flags: Mapping[str, Any], env: Mapping[str, str], table: tuple[Option, ...] = OPTIONS,
) -> dict[str, tuple[Any, str]]:
    """Every option's value and where it came from (``flag``, ``env``, ``file`` or ``default``)."""
    path, _source = config_path(flags, env)
    from_file = read_config_file(path, table) if path is not None else {}
    found: dict[str, tuple[Any, str]] = {}
    for option in table:
        given = flags.get(option.name)
        if given is not None and given != ():
            found[option.name] = (_coerce(option, given), FLAG)
        elif option.env in env:
            found[option.name] = (_coerce(option, env[option.env]), ENV)
        elif option.name in from_file:
            found[option.name] = (from_file[option.name], FILE)
        else:
            found[option.name] = (option.default, DEFAULT)
    return found


def config_path(flags: Mapping[str, Any], env: Mapping[str, str]) -> tuple[Path | None, str]:
    """The config file named by ``--config`` or ``IMDS_CONFIG`` (None: no file), and which one named it."""
    given = flags.get(CONFIG_OPTION.name)
    if given:
        return Path(given).expanduser(), FLAG
    if env.get(CONFIG_OPTION.env):
        return Path(env[CONFIG_OPTION.env]).expanduser(), ENV
    return None, DEFAULT


def read_config_file(path: Path, table: tuple[Option, ...] = OPTIONS) -> dict[str, Any]:
    """The options set in the TOML file at ``path``, coerced; ConfigError naming the file and key."""
    where = f"config file {path}"
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        msg = f"{where} (--config / IMDS_CONFIG): cannot read: {exc.strerror or type(exc).__name__}"
        raise ConfigError(msg) from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        msg = f"{where}: not valid TOML: {exc}"
        raise ConfigError(msg) from exc
    options = {option.name: option for option in table}
    values: dict[str, Any] = {}
    for key, name, group, value in _toml_keys(document, {option.group for option in table}):
        option = options.get(name.replace("-", "_"))
        if option is None or group not in {None, option.group}:
            msg = f"{where}: unknown key {key!r} (keys are option names, as `imds config show` lists them)"
            raise ConfigError(msg)
        values[option.name] = _from_toml(option, value, where, key)
    return values


def _toml_keys(document: Mapping[str, Any], group_names: set[str]) -> Iterator[tuple[str, str, str | None, Any]]:
    """(key as shown in errors, option name, its ``[group]`` table or None, value), flat or in a group's table."""
    for key, value in document.items():
        if key in group_names and isinstance(value, dict):
            yield from ((f"{key}.{inner}", inner, key, item) for inner, item in value.items())
        else:
            yield key, key, None, value


_TOML_TYPES: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "bool": (bool,)}


def _from_toml(option: Option, value: Any, where: str, key: str) -> Any:
    if option.kind == "list" and isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(value)
    if isinstance(value, str) and option.kind in {"list", "str", "path"}:
        return _coerce(option, value)
    wanted = _TOML_TYPES.get(option.kind)
    if wanted is not None and isinstance(value, wanted) and (option.kind == "bool") == isinstance(value, bool):
        return value
    kinds = {"list": "an array of strings", "str": "a string", "path": "a string (a path)", "int": "an integer",
             "float": "a number", "bool": "true or false"}
    msg = f"{where}: key {key!r} must be {kinds[option.kind]}"
    raise ConfigError(msg)


def effective(
    flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None,
) -> list[tuple[str, str, str]]:
    """(name, value as shown, source) for the config file and every option, secrets masked.

    Runs ``load`` first, so a configuration ``imds serve`` would refuse is refused here too.
    """
    env = os.environ if environ is None else environ
    flags = flags or {}
    load(flags, env)
    path, path_source = config_path(flags, env)
    values = layered(flags, env)
    rows = [(CONFIG_OPTION.name, str(path) if path is not None else "-", path_source)]
    rows += [(option.name, _shown(option, values[option.name][0]), values[option.name][1]) for option in OPTIONS]
    return rows


def _shown(option: Option, value: Any) -> str:
    if value is None or value == ():
        return "-"
    if option.secret:
        return SHOWN_SECRET
    if option.name == "db":
        return _redact_url(str(value))
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value)
    return str(value).lower() if isinstance(value, bool) else str(value)


def _bool(text: str) -> bool:
    if text.lower() in _TRUE | _FALSE:
        return text.lower() in _TRUE
    raise ValueError(text)


_PARSERS: dict[str, Any] = {
    "list": lambda text: tuple(part.strip() for part in text.split(",") if part.strip()),
    "int": int,
    "float": float,
    "bool": _bool,
    "path": lambda text: Path(text).expanduser() if text else None,
    "str": lambda text: text or None,
}


def _coerce(option: Option, value: Any) -> Any:
    """Turn a flag or environment value into the option's kind."""
    if not isinstance(value, str):
        return tuple(value) if option.kind == "list" else value
    try:
        return _PARSERS[option.kind](value.strip())
    except ValueError as exc:
        msg = f"{option.env} / {option.flag}: {value!r} is not a valid {option.kind}"
        raise ConfigError(msg) from exc




# --- from resolved values to Settings: parse, derive, check, assemble ------------------------

_OPTION = {option.name: option for option in OPTIONS}


def _validate(raw: dict[str, Any], env: Mapping[str, str]) -> Settings:
    values = {option.name: _typed(option, raw[option.name]) for option in OPTIONS}
    values.update(_store_location(values, env))
    for check in _CHECKS:
        check(values)
    return _assemble(values)


def _store_location(values: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """The data directory (default: under XDG_DATA_HOME) and the database URL (default: an SQLite file in it)."""
    data_dir = Path(values["data_dir"] or _default_data_dir(env))
    db_url = values["db"] or f"sqlite:///{data_dir / 'imds.db'}"
    if db_url.startswith("postgres://"):  # Heroku's and libpq's alias; SQLAlchemy knows only postgresql://
        db_url = "postgresql://" + db_url.removeprefix("postgres://")
    if not db_url.startswith(("sqlite", "postgresql", "memory://")):
        msg = (f"--db / IMDS_DB: unsupported database URL scheme in {_redact_url(db_url)!r} "
               "(use sqlite:///PATH, postgresql://USER:PASS@HOST:PORT/DB or memory://)")
        raise ConfigError(msg)
    return {"data_dir": data_dir, "db": db_url}


def _require(
    values: Mapping[str, Any], names: tuple[str, ...], ok: Callable[[Any], bool], wording: str,
    table: Mapping[str, Option] = _OPTION,
) -> None:
    """ConfigError ``--flag / IMDS_VAR <wording>`` for the first of ``names`` whose value is not ``ok``."""
    for name in names:
        if not ok(values[name]):
            msg = f"{table[name].named} {wording}"
            raise ConfigError(msg)


def _positive(value: float) -> bool:
    return value > 0


def _is_file(value: Path | None) -> bool:
    return value is None or Path(value).is_file()


def _require_files(values: Mapping[str, Any], names: tuple[str, ...]) -> None:
    for name in names:
        if not _is_file(values[name]):
            msg = f"{_OPTION[name].named}: {values[name]} is not a file"
            raise ConfigError(msg)


def _check_limits(values: Mapping[str, Any]) -> None:
    _require(values, ("max_body_bytes", "max_addresses", "max_document_depth", "max_document_keys"),
             _positive, "must be positive")


def _check_ec2(values: Mapping[str, Any]) -> None:
    if values["imdsv2"] not in IMDSV2_MODES:
        msg = f"--imdsv2 / IMDS_IMDSV2: {values['imdsv2']!r} is not one of {', '.join(IMDSV2_MODES)}"
        raise ConfigError(msg)
    _require(values, ("token_hop_limit",), lambda hops: 0 <= hops <= 255, "must be 0 (system default) to 255")
    _require_files(values, ("imdsv2_key_file", "identity_key", "identity_cert"))


def _check_lookup(values: Mapping[str, Any]) -> None:
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
    _require(values, ("lookup_timeout", "lookup_negative_ttl", "lookup_cache_ttl", "lookup_breaker_reset"),
             _positive, "must be positive")
    _require(values, ("lookup_concurrency", "lookup_breaker_failures"), lambda n: n >= 1, "must be at least 1")
    _require(values, ("lookup_refresh_after",), lambda s: s >= 0, "must be 0 (off) or positive")


def _check_http(values: Mapping[str, Any]) -> None:
    """Server choice and listener limits: a known server, positive limits, workers that can share a store."""
    if values["server"] not in SERVERS:
        msg = f"--server / IMDS_SERVER: {values['server']!r} is not one of {', '.join(SERVERS)}"
        raise ConfigError(msg)
    if values["workers"] > 1 and values["db"].startswith("memory://"):
        msg = "--workers / IMDS_WORKERS: more than one worker needs a shared database, not memory://"
        raise ConfigError(msg)
    _require(values, ("workers", "max_header_bytes", "max_headers", "header_timeout", "body_timeout",
                      "keepalive_timeout", "max_connections"), _positive, "must be positive")
    _require(values, ("max_header_bytes",), lambda n: n >= MIN_HEADER_BYTES, f"must be at least {MIN_HEADER_BYTES}")
    shared = sorted(set(values["admin_listen"]) & set(values["listen"]))
    if shared:
        host, port = shared[0]
        msg = f"--admin-listen / IMDS_ADMIN_LISTEN: {host}:{port} is also a --listen address (give the admin its own)"
        raise ConfigError(msg)


def _check_callers(values: Mapping[str, Any]) -> None:
    """Rate limit bounds; the previous proxy secret only beside a current one."""
    _require(values, ("rate_limit", "rate_burst", "max_requests_per_source"), lambda n: n >= 0, "must be zero or more")
    if values["rate_limit"] and values["rate_burst"] < 1:
        msg = "--rate-burst / IMDS_RATE_BURST must be at least 1 when --rate-limit is on"
        raise ConfigError(msg)
    if values["proxy_previous_secret_file"] is not None and values["proxy_shared_secret_file"] is None:
        msg = "--proxy-previous-secret-file / IMDS_PROXY_PREVIOUS_SECRET_FILE needs --proxy-shared-secret-file"
        raise ConfigError(msg)


def _check_admin(values: Mapping[str, Any]) -> None:
    _require_files(values, ("admin_tokens_file",))


def _check_ganeti(values: Mapping[str, Any]) -> None:
    _require_files(values, ("private_key_file",))
    _require(values, ("os_param_max_bytes", "os_package_max_bytes", "os_package_timeout"), _positive,
             "must be positive")


def _check_channel(values: Mapping[str, Any]) -> None:
    _require(values, ("event_rate", "event_burst", "event_max_bytes", "event_retain", "message_max_bytes",
                      "message_max_queued", "watch_max_timeout"), _positive, "must be positive")


def _check_store(values: Mapping[str, Any]) -> None:
    _require(values, ("db_connect_timeout", "db_statement_timeout"), _positive, "must be positive")


_CHECKS: tuple[Callable[[Mapping[str, Any]], None], ...] = (
    _check_limits, _check_ec2, _check_lookup, _check_http, _check_callers, _check_admin, _check_ganeti,
    _check_channel, _check_store,
)


def _default_data_dir(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_DATA_HOME") or str(Path(env.get("HOME", ".")) / ".local" / "share")
    return Path(base) / "imds"


def _redact_url(url: str) -> str:
    """Hide the password in a database URL."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"


# -- imds proxy ---------------------------------------------------------------------------
# Its own table (flags generated the same way, env vars IMDS_PROXY_*), its own settings.

PROXY_OPTIONS: tuple[Option, ...] = (
    Option("listen", "IMDS_PROXY_LISTEN", "list", ("169.254.169.254:80",),
           "HOST:PORT to listen on (repeatable; [v6]:PORT, [fe80::a9fe:a9fe%IFACE]:PORT; env: comma-separated).",
           parse=_listen, group="proxy"),
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
           "Log level: debug, info, warning or error.", parse=_log_level, group="proxy"),
)


@dataclass(frozen=True, repr=False)
class ProxySettings(Group):
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


def _resolve(table: tuple[Option, ...], flags: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    raw: dict[str, Any] = {}
    for option in table:
        given = flags.get(option.name)
        if given is not None and given != ():
            raw[option.name] = _coerce(option, given)
        elif option.env in env:
            raw[option.name] = _coerce(option, env[option.env])
        else:
            raw[option.name] = option.default
    return raw


def load_proxy(flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> ProxySettings:
    """``imds proxy``'s settings from ``flags``, then ``environ``, then defaults (as ``load``)."""
    raw = _resolve(PROXY_OPTIONS, flags or {}, os.environ if environ is None else environ)
    values = {option.name: _typed(option, raw[option.name]) for option in PROXY_OPTIONS}
    upstream = values["upstream"]
    if not upstream or not upstream.lower().startswith("http://"):
        msg = "--upstream / IMDS_PROXY_UPSTREAM: an http://HOST:PORT URL of imds serve is required"
        raise ConfigError(msg)
    if values["shared_secret_file"] is None:
        msg = "--shared-secret-file / IMDS_PROXY_SHARED_SECRET_FILE is required"
        raise ConfigError(msg)
    if (values["map"] is None) == (not values["inport"]):
        msg = "exactly one identification mode is required: --map FILE, or --ovsdb unix:PATH --inport"
        raise ConfigError(msg)
    if values["inport"] and not values["ovsdb"]:
        msg = "--inport needs --ovsdb unix:PATH / IMDS_PROXY_OVSDB"
        raise ConfigError(msg)
    table = {option.name: option for option in PROXY_OPTIONS}
    _require(values, ("timeout", "connect_timeout", "max_connections", "max_body_bytes"), _positive,
             "must be positive", table)
    _require(values, ("map_poll_interval", "max_requests_per_source"), lambda s: s >= 0,
             "must be 0 (off) or positive", table)
    return _build(ProxySettings, values)


# ``imds agent`` (one per hypervisor) has its own table, so its flags and IMDS_AGENT_* variables
# stay apart from the server's. Provider ranges are validated by ``imds.agent.allocate.Pool``.
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
           "Log level: debug, info, warning or error.", parse=_log_level, group="agent"),
    Option("max_connections_per_source", "IMDS_AGENT_MAX_CONNECTIONS_PER_SOURCE", "int", 32,
           "Open connections one VM port may hold to the metadata address (haproxy closes the rest at accept).",
           group="agent"),
)
AGENT_MODES = ("haproxy", "inport")


@dataclass(frozen=True, repr=False)
class AgentSettings(Group):
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


def load_agent(flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> AgentSettings:
    """Resolve ``AGENT_OPTIONS`` (flag, else IMDS_AGENT_* variable, else default) and validate them."""
    raw = _resolve(AGENT_OPTIONS, flags or {}, os.environ if environ is None else environ)
    values = {option.name: _typed(option, raw[option.name]) for option in AGENT_OPTIONS}
    table = {option.name: option for option in AGENT_OPTIONS}
    _require(values, ("upstream", "shared_secret_file"), lambda value: value is not None, "is required", table)
    if values["mode"] not in AGENT_MODES:
        raise ConfigError(f"--mode / IMDS_AGENT_MODE: {values['mode']!r} is not one of {', '.join(AGENT_MODES)}")
    _require(values, ("provider_vlan_id",), lambda vlan: 1 <= vlan <= 4094, "must be 1 to 4094", table)
    _require(values, ("check_interval", "max_connections_per_source"), _positive, "must be positive", table)
    for name in ("meta_port", "integration_bridge", "metadata_bridge"):
        if not 0 < len(values[name]) <= 15:
            raise ConfigError(f"--{name.replace('_', '-')}: {values[name]!r} must be 1-15 characters (a Linux name)")
    return _build(AgentSettings, values)
