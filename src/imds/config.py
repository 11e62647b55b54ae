"""Settings: the only module that reads the environment.

Every option has one entry in ``OPTIONS``: its flag (``--listen``), its environment
variable (``IMDS_LISTEN``), its default and its help. The CLI builds its flags from that
table, and ``load`` resolves each value once: flag, else environment, else the TOML config
file (``--config`` / ``IMDS_CONFIG``; keys are option names), else default. The result is a
frozen ``Settings``; nothing else reads ``os.environ`` or the config file.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from imds.errors import ConfigError
from imds.models import Network

Kind = Literal["str", "int", "float", "bool", "list", "path"]


@dataclass(frozen=True)
class Option:
    """One setting: flag name, environment variable, kind, default and help text."""

    name: str
    env: str
    kind: Kind
    default: Any
    help: str
    secret: bool = False

    @property
    def flag(self) -> str:
        """The command-line flag, e.g. ``--trusted-proxy``."""
        return "--" + self.name.replace("_", "-")


OPTIONS: tuple[Option, ...] = (
    Option("listen", "IMDS_LISTEN", "list", ("127.0.0.1:8000", "[::1]:8000"),
           "HOST:PORT to listen on (repeatable; [v6]:PORT for IPv6; env: comma-separated; "
           "the default's [::1] is skipped on a host without IPv6 loopback)."),
    Option("data_dir", "IMDS_DATA_DIR", "path", None,
           "Directory for the embedded database and generated keys "
           "(default: $XDG_DATA_HOME/imds or ~/.local/share/imds)."),
    Option("db", "IMDS_DB", "str", None,
           "Database URL: sqlite:///PATH, postgresql://USER:PASS@HOST:PORT/DB or memory:// "
           "(default: an SQLite file in the data directory)."),
    Option("migrate", "IMDS_MIGRATE", "bool", True,  # noqa: FBT003 - a table row, not a call site
           "Apply database migrations at startup."),
    Option("trusted_proxy", "IMDS_TRUSTED_PROXIES", "list", (),
           "CIDR of a proxy whose X-Forwarded-For is believed (repeatable; default: none)."),
    Option("proxy_shared_secret_file", "IMDS_PROXY_SHARED_SECRET_FILE", "path", None,
           "File holding the secret a trusted proxy signs X-Instance-ID with (unset: signed ids are refused)."),
    Option("proxy_previous_secret_file", "IMDS_PROXY_PREVIOUS_SECRET_FILE", "path", None,
           "The previous proxy secret, still accepted during a rotation (remove it when every proxy has the new one)."),
    Option("api_url", "IMDS_API_URL", "str", None,
           "Template for the api_url field, e.g. https://{{.facility}}.example/{{.id}}."),
    Option("phone_home_url", "IMDS_PHONE_HOME_URL", "str", None,
           "Template for the phone_home_url field."),
    Option("user_state_url", "IMDS_USER_STATE_URL", "str", None,
           "Template for the user_state_url field."),
    Option("admin_token", "IMDS_ADMIN_TOKEN", "str", None,
           "Static bearer token with every admin scope (prefer the env var: flags show in ps).", secret=True),
    Option("admin_tokens_file", "IMDS_ADMIN_TOKENS_FILE", "path", None,
           "JSON file of admin tokens with their scopes (see docs/admin-auth.md)."),
    Option("oidc_issuer", "IMDS_OIDC_ISSUER", "str", None,
           "OIDC issuer whose JWTs the admin API accepts."),
    Option("oidc_jwks_url", "IMDS_OIDC_JWKS_URL", "str", None,
           "JWKS URL (default: discovered from the issuer's openid-configuration)."),
    Option("oidc_audience", "IMDS_OIDC_AUDIENCE", "str", None,
           "Audience the JWTs must carry."),
    Option("oidc_roles_claim", "IMDS_OIDC_ROLES_CLAIM", "str", "scope",
           "JWT claim holding the scopes (a list, or a space-separated string)."),
    Option("oidc_username_claim", "IMDS_OIDC_USERNAME_CLAIM", "str", "sub",
           "JWT claim logged as the subject of each admin write."),
    Option("imdsv2", "IMDS_IMDSV2", "str", "optional",
           "EC2 IMDSv2 tokens: optional (tokenless GETs allowed) or required."),
    Option("token_hop_limit", "IMDS_TOKEN_HOP_LIMIT", "int", 0,
           "IP TTL / hop limit of every response on the listeners (AWS's PUT hop limit; 0: system default)."),
    Option("imdsv2_key_file", "IMDS_IMDSV2_KEY_FILE", "path", None,
           "HMAC key for IMDSv2 tokens (default: imdsv2.key in the data directory; replicas must share it)."),
    Option("identity_key", "IMDS_IDENTITY_KEY", "path", None,
           "RSA private key (PEM) signing EC2 identity documents (default: generated into the data directory)."),
    Option("identity_cert", "IMDS_IDENTITY_CERT", "path", None,
           "Certificate (PEM) for --identity-key (default: self-signed)."),
    Option("lookup_url", "IMDS_LOOKUP_URL", "str", None,
           "Upstream source of truth (hollow's lookup contract); unknown callers are fetched from it."),
    Option("lookup_token", "IMDS_LOOKUP_TOKEN", "str", None,
           "Static bearer token for the upstream (prefer the env var: flags show in ps).", secret=True),
    Option("lookup_oidc_issuer", "IMDS_LOOKUP_OIDC_ISSUER", "str", None,
           "OIDC issuer whose token endpoint grants upstream access tokens (client credentials)."),
    Option("lookup_client_id", "IMDS_LOOKUP_CLIENT_ID", "str", None,
           "OAuth2 client id for the upstream."),
    Option("lookup_client_secret", "IMDS_LOOKUP_CLIENT_SECRET", "str", None,
           "OAuth2 client secret for the upstream (prefer the env var: flags show in ps).", secret=True),
    Option("lookup_scope", "IMDS_LOOKUP_SCOPES", "list", (),
           "OAuth2 scope to request (repeatable; env: comma-separated)."),
    Option("lookup_audience", "IMDS_LOOKUP_AUDIENCE", "str", None,
           "OAuth2 audience to request."),
    Option("lookup_timeout", "IMDS_LOOKUP_TIMEOUT", "float", 2.0,
           "Seconds one upstream call may take."),
    Option("lookup_negative_ttl", "IMDS_LOOKUP_NEGATIVE_TTL", "float", 30.0,
           "Seconds an upstream 404 is remembered."),
    Option("lookup_refresh_after", "IMDS_LOOKUP_REFRESH_AFTER", "float", 0.0,
           "Refresh records fetched by lookup in the background after this many seconds (0: off)."),
    Option("lookup_cache_ttl", "IMDS_LOOKUP_CACHE_TTL", "float", 300.0,
           "Seconds a by-IP answer that does not list the asking address is reused."),
    Option("lookup_concurrency", "IMDS_LOOKUP_CONCURRENCY", "int", 16,
           "Most upstream calls in flight at once."),
    Option("lookup_breaker_failures", "IMDS_LOOKUP_BREAKER_FAILURES", "int", 5,
           "Consecutive upstream failures that open the circuit breaker."),
    Option("lookup_breaker_reset", "IMDS_LOOKUP_BREAKER_RESET", "float", 10.0,
           "Seconds the breaker first stays open (doubling on each reopening, jittered, at most 120)."),
    Option("max_body_bytes", "IMDS_MAX_BODY_BYTES", "int", 1024 * 1024,
           "Largest admin request body accepted, in bytes."),
    Option("max_addresses", "IMDS_MAX_ADDRESSES", "int", 4096,
           "Most entries in one write's ipAddresses list."),
    Option("max_document_depth", "IMDS_MAX_DOCUMENT_DEPTH", "int", 64,
           "Deepest nesting of objects and lists accepted in a metadata document."),
    Option("max_document_keys", "IMDS_MAX_DOCUMENT_KEYS", "int", 20000,
           "Most object keys (counted over every level) accepted in a metadata document."),
    Option("metrics_public", "IMDS_METRICS_PUBLIC", "bool", False,  # noqa: FBT003 - a table row, not a call site
           "Serve /metrics without a token (hollow-compatible scraping); off: it needs a metrics or read scope."),
    Option("demo", "IMDS_DEMO", "bool", False,  # noqa: FBT003 - a table row, not a call site
           "Load a demo instance bound to 127.0.0.1 and ::1 at startup."),
    Option("log_level", "IMDS_LOG_LEVEL", "str", "info",
           "Log level: debug, info, warning or error."),
    Option("log_instance_reads", "IMDS_LOG_INSTANCE_READS", "bool", False,  # noqa: FBT003 - a table row, not a call site
           "Log every instance read (off by default)."),
    Option("feed_poll_interval", "IMDS_FEED_POLL_INTERVAL", "float", 1.0,
           "Seconds between polls of the change feed written by other replicas."),
    Option("shutdown_timeout", "IMDS_SHUTDOWN_TIMEOUT", "float", 10.0,
           "Seconds to let in-flight requests finish on shutdown."),
    # Ganeti OS installation (services/os_records.py)
    Option("private_key_file", "IMDS_PRIVATE_KEY_FILE", "path", None,
           "Fernet keys (one per line; the first encrypts, all decrypt) encrypting private OS parameters at rest."),
    Option("os_definitions_dir", "IMDS_OS_DEFINITIONS_DIR", "path", None,
           "Directory of Ganeti OS definitions (DIR/<os>/create, export, import, rename, verify, parameters.list, "
           "ganeti_api_version)."),
    Option("os_param_max_bytes", "IMDS_OS_PARAM_MAX_BYTES", "int", 4096,
           "Largest OS parameter value accepted, in bytes (UTF-8)."),
    Option("os_package_max_bytes", "IMDS_OS_PACKAGE_MAX_BYTES", "int", 64 * 1024 * 1024,
           "Largest personalization package fetched for /ganeti/.../os/package, in bytes (held in memory, "
           "never on disk)."),
    Option("os_package_timeout", "IMDS_OS_PACKAGE_TIMEOUT", "float", 30.0,
           "Seconds a personalization package fetch may take."),
    # The instance<->host channel and change watch (README: "The instance↔host channel").
    Option("event_rate", "IMDS_EVENT_RATE", "float", 1.0,
           "Events (and phone-homes) an instance may post per second, on average, per replica."),
    Option("event_burst", "IMDS_EVENT_BURST", "int", 10,
           "Events an instance may post at once before --event-rate applies."),
    Option("event_max_bytes", "IMDS_EVENT_MAX_BYTES", "int", 4096,
           "Largest event body an instance may post, in bytes."),
    Option("event_retain", "IMDS_EVENT_RETAIN", "int", 1000,
           "Events kept per instance; older ones are dropped."),
    Option("message_max_bytes", "IMDS_MESSAGE_MAX_BYTES", "int", 65536,
           "Largest message the host may queue for an instance, in bytes."),
    Option("message_max_queued", "IMDS_MESSAGE_MAX_QUEUED", "int", 100,
           "Messages that may wait for one instance; one more is refused (409)."),
    Option("watch_max_timeout", "IMDS_WATCH_MAX_TIMEOUT", "int", 300,
           "Largest timeout_sec a wait_for_change request may ask for (and the default)."),
    # Anti-SSRF policy per flavor and database fault bounds (services/instance_auth.py, store/sql/engine.py)
    Option("instance_auth", "IMDS_INSTANCE_AUTH", "list", (),
           "Flavors whose paths need 'Metadata: true', a Metadata-Flavor header or an IMDSv2 token "
           "(json, openstack, nocloud, ganeti or all; repeatable; env: comma-separated; default: none)."),
    Option("db_connect_timeout", "IMDS_DB_CONNECT_TIMEOUT", "float", 5.0,
           "Seconds to wait for a database connection before answering 503."),
    Option("db_statement_timeout", "IMDS_DB_STATEMENT_TIMEOUT", "float", 5.0,
           "Seconds one database statement (or SQLite's write lock) may take before answering 503."),
    # Server and listener limits (docs/server.md).
    Option("server", "IMDS_SERVER", "str", "granian",
           "HTTP server: granian (fastest, every limit below) or uvicorn (no header read timeout)."),
    Option("workers", "IMDS_WORKERS", "int", 1,
           "Server processes sharing the listeners (each loads the catalog; not with memory://)."),
    Option("max_header_bytes", "IMDS_MAX_HEADER_BYTES", "int", 16384,
           "Largest request line plus headers, in bytes (larger: 431 or the connection is closed)."),
    Option("max_headers", "IMDS_MAX_HEADERS", "int", 100,
           "Most header lines in one request (more: 431)."),
    Option("header_timeout", "IMDS_HEADER_TIMEOUT", "float", 10.0,
           "Seconds a connection may take to send a request's headers, idle keep-alive included."),
    Option("body_timeout", "IMDS_BODY_TIMEOUT", "float", 10.0,
           "Seconds the server waits for each part of a request body."),
    Option("keepalive_timeout", "IMDS_KEEPALIVE_TIMEOUT", "float", 5.0,
           "Seconds uvicorn keeps an idle keep-alive connection (granian closes it after --header-timeout)."),
    Option("max_connections", "IMDS_MAX_CONNECTIONS", "int", 512,
           "Most open connections per listener and worker; more wait in the kernel's backlog."),
    Option("rate_limit", "IMDS_RATE_LIMIT", "float", 50.0,
           "Instance requests per second per caller address (token bucket; 0: off; over: 429)."),
    Option("rate_burst", "IMDS_RATE_BURST", "int", 200,
           "Instance requests a caller address may make at once before --rate-limit applies."),
)

SERVERS = ("granian", "uvicorn")
MIN_HEADER_BYTES = 8192  # granian's (hyper's) smallest read buffer

LOG_LEVELS = ("debug", "info", "warning", "error")
IMDSV2_MODES = ("optional", "required")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class Settings:
    """Validated configuration of ``imds serve``. Build it with ``load``."""

    listen: tuple[tuple[str, int], ...] = (("127.0.0.1", 8000), ("::1", 8000))
    data_dir: Path | None = None
    db_url: str = "memory://"
    migrate: bool = True
    trusted_proxies: tuple[Network, ...] = ()
    proxy_shared_secret_file: Path | None = None
    proxy_previous_secret_file: Path | None = None
    api_url: str | None = None
    phone_home_url: str | None = None
    user_state_url: str | None = None
    admin_token: str | None = None
    admin_tokens_file: Path | None = None
    oidc_issuer: str | None = None
    oidc_jwks_url: str | None = None
    oidc_audience: str | None = None
    oidc_roles_claim: str = "scope"
    oidc_username_claim: str = "sub"
    imdsv2: str = "optional"
    token_hop_limit: int = 0
    imdsv2_key_file: Path | None = None
    identity_key: Path | None = None
    identity_cert: Path | None = None
    lookup_url: str | None = None
    lookup_token: str | None = None
    lookup_oidc_issuer: str | None = None
    lookup_client_id: str | None = None
    lookup_client_secret: str | None = None
    lookup_scopes: tuple[str, ...] = ()
    lookup_audience: str | None = None
    lookup_timeout: float = 2.0
    lookup_negative_ttl: float = 30.0
    lookup_refresh_after: float = 0.0
    lookup_cache_ttl: float = 300.0
    lookup_concurrency: int = 16
    lookup_breaker_failures: int = 5
    lookup_breaker_reset: float = 10.0
    max_body_bytes: int = 1024 * 1024
    max_addresses: int = 4096
    max_document_depth: int = 64
    max_document_keys: int = 20000
    metrics_public: bool = False
    demo: bool = False
    log_level: str = "info"
    log_instance_reads: bool = False
    feed_poll_interval: float = 1.0
    shutdown_timeout: float = 10.0
    private_key_file: Path | None = None
    os_definitions_dir: Path | None = None
    os_param_max_bytes: int = 4096
    os_package_max_bytes: int = 64 * 1024 * 1024
    os_package_timeout: float = 30.0
    event_rate: float = 1.0
    event_burst: int = 10
    event_max_bytes: int = 4096
    event_retain: int = 1000
    message_max_bytes: int = 65536
    message_max_queued: int = 100
    watch_max_timeout: int = 300
    instance_auth: frozenset[str] = frozenset()
    db_connect_timeout: float = 5.0
    db_statement_timeout: float = 5.0
    server: str = "granian"
    workers: int = 1
    max_header_bytes: int = 16384
    max_headers: int = 100
    header_timeout: float = 10.0
    body_timeout: float = 10.0
    keepalive_timeout: float = 5.0
    max_connections: int = 512
    rate_limit: float = 50.0
    rate_burst: int = 200

    @property
    def key_dir(self) -> Path | None:
        """Where generated keys live: the data directory, except for the in-memory store.

        None (keys generated in memory, lost on restart) also when no data directory is
        set, which only happens when Settings is built directly rather than by ``load``.
        """
        return None if self.db_url.startswith("memory://") else self.data_dir

    @property
    def templates(self) -> dict[str, str]:
        """The configured template fields, by the metadata key they fill."""
        fields = {
            "api_url": self.api_url,
            "phone_home_url": self.phone_home_url,
            "user_state_url": self.user_state_url,
        }
        return {key: value for key, value in fields.items() if value}

    def __repr__(self) -> str:
        """Never show secrets, even in a traceback."""
        token = "<set>" if self.admin_token else None
        return f"Settings(listen={self.listen!r}, db_url={_redact_url(self.db_url)!r}, admin_token={token})"


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
                       "flags and environment variables override it.")
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
    for key, value in document.items():
        option = options.get(key.replace("-", "_"))
        if option is None:
            msg = f"{where}: unknown key {key!r} (keys are option names, as `imds config show` lists them)"
            raise ConfigError(msg)
        values[option.name] = _from_toml(option, value, where, key)
    return values


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


def _db_url(db_url: str) -> str:
    """The database URL, with ``postgres://`` read as ``postgresql://``; ConfigError for other schemes."""
    if db_url.startswith("postgres://"):  # Heroku's and libpq's alias; SQLAlchemy knows only postgresql://
        db_url = "postgresql://" + db_url.removeprefix("postgres://")
    if not db_url.startswith(("sqlite", "postgresql", "memory://")):
        msg = (f"--db / IMDS_DB: unsupported database URL scheme in {_redact_url(db_url)!r} "
               "(use sqlite:///PATH, postgresql://USER:PASS@HOST:PORT/DB or memory://)")
        raise ConfigError(msg)
    return db_url


def _validate(raw: dict[str, Any], env: Mapping[str, str]) -> Settings:
    data_dir = raw["data_dir"] or _default_data_dir(env)
    db_url = _db_url(raw["db"] or f"sqlite:///{data_dir / 'imds.db'}")
    level = str(raw["log_level"]).lower()
    if level not in LOG_LEVELS:
        msg = f"--log-level / IMDS_LOG_LEVEL: {level!r} is not one of {', '.join(LOG_LEVELS)}"
        raise ConfigError(msg)
    for name in ("max_body_bytes", "max_addresses", "max_document_depth", "max_document_keys"):
        if raw[name] <= 0:
            msg = f"--{name.replace('_', '-')} / IMDS_{name.upper()} must be positive"
            raise ConfigError(msg)
    if raw["imdsv2"] not in IMDSV2_MODES:
        msg = f"--imdsv2 / IMDS_IMDSV2: {raw['imdsv2']!r} is not one of {', '.join(IMDSV2_MODES)}"
        raise ConfigError(msg)
    if not 0 <= raw["token_hop_limit"] <= 255:
        msg = "--token-hop-limit / IMDS_TOKEN_HOP_LIMIT must be 0 (system default) to 255"
        raise ConfigError(msg)
    for name in ("imdsv2_key_file", "identity_key", "identity_cert"):
        if raw[name] is not None and not Path(raw[name]).is_file():
            flag = "--" + name.replace("_", "-")
            msg = f"{flag} / IMDS_{name.upper()}: {raw[name]} is not a file"
            raise ConfigError(msg)
    _validate_lookup(raw)
    _validate_server(raw, db_url)
    if raw["proxy_previous_secret_file"] is not None and raw["proxy_shared_secret_file"] is None:
        msg = "--proxy-previous-secret-file / IMDS_PROXY_PREVIOUS_SECRET_FILE needs --proxy-shared-secret-file"
        raise ConfigError(msg)
    tokens_file = raw["admin_tokens_file"]
    if tokens_file is not None and not Path(tokens_file).is_file():
        msg = f"--admin-tokens-file / IMDS_ADMIN_TOKENS_FILE: {tokens_file} is not a file"
        raise ConfigError(msg)
    return Settings(
        listen=tuple(parse_listen(item) for item in raw["listen"]),
        data_dir=Path(data_dir),
        db_url=db_url,
        migrate=bool(raw["migrate"]),
        trusted_proxies=tuple(_parse_cidr(item) for item in raw["trusted_proxy"]),
        proxy_shared_secret_file=raw["proxy_shared_secret_file"],
        proxy_previous_secret_file=raw["proxy_previous_secret_file"],
        api_url=raw["api_url"],
        phone_home_url=raw["phone_home_url"],
        user_state_url=raw["user_state_url"],
        admin_token=raw["admin_token"],
        admin_tokens_file=tokens_file,
        oidc_issuer=raw["oidc_issuer"],
        oidc_jwks_url=raw["oidc_jwks_url"],
        oidc_audience=raw["oidc_audience"],
        oidc_roles_claim=raw["oidc_roles_claim"],
        oidc_username_claim=raw["oidc_username_claim"],
        imdsv2=raw["imdsv2"],
        token_hop_limit=raw["token_hop_limit"],
        imdsv2_key_file=raw["imdsv2_key_file"],
        identity_key=raw["identity_key"],
        identity_cert=raw["identity_cert"],
        lookup_url=raw["lookup_url"],
        lookup_token=raw["lookup_token"],
        lookup_oidc_issuer=raw["lookup_oidc_issuer"],
        lookup_client_id=raw["lookup_client_id"],
        lookup_client_secret=raw["lookup_client_secret"],
        lookup_scopes=tuple(raw["lookup_scope"]),
        lookup_audience=raw["lookup_audience"],
        lookup_timeout=float(raw["lookup_timeout"]),
        lookup_negative_ttl=float(raw["lookup_negative_ttl"]),
        lookup_refresh_after=float(raw["lookup_refresh_after"]),
        lookup_cache_ttl=float(raw["lookup_cache_ttl"]),
        lookup_concurrency=int(raw["lookup_concurrency"]),
        lookup_breaker_failures=int(raw["lookup_breaker_failures"]),
        lookup_breaker_reset=float(raw["lookup_breaker_reset"]),
        max_body_bytes=raw["max_body_bytes"],
        max_addresses=raw["max_addresses"],
        max_document_depth=raw["max_document_depth"],
        max_document_keys=raw["max_document_keys"],
        metrics_public=bool(raw["metrics_public"]),
        demo=bool(raw["demo"]),
        log_level=level,
        log_instance_reads=bool(raw["log_instance_reads"]),
        feed_poll_interval=float(raw["feed_poll_interval"]),
        shutdown_timeout=float(raw["shutdown_timeout"]),
        server=raw["server"],
        workers=int(raw["workers"]),
        max_header_bytes=int(raw["max_header_bytes"]),
        max_headers=int(raw["max_headers"]),
        header_timeout=float(raw["header_timeout"]),
        body_timeout=float(raw["body_timeout"]),
        keepalive_timeout=float(raw["keepalive_timeout"]),
        max_connections=int(raw["max_connections"]),
        rate_limit=float(raw["rate_limit"]),
        rate_burst=int(raw["rate_burst"]),
        **_ganeti_settings(raw),
        **_channel_settings(raw),
        **_fault_settings(raw),
    )


INSTANCE_AUTH_FLAVORS = ("json", "openstack", "nocloud", "ganeti")


def _fault_settings(raw: dict[str, Any]) -> dict[str, Any]:
    """The anti-SSRF flavors and the database timeouts, checked."""
    chosen = {str(value).strip().lower() for value in raw["instance_auth"] if str(value).strip()}
    unknown = sorted(chosen - {*INSTANCE_AUTH_FLAVORS, "all"})
    if unknown:
        msg = (f"--instance-auth / IMDS_INSTANCE_AUTH: {', '.join(unknown)} is not one of "
               f"{', '.join(INSTANCE_AUTH_FLAVORS)} or all")
        raise ConfigError(msg)
    for name in ("db_connect_timeout", "db_statement_timeout"):
        if raw[name] <= 0:
            msg = f"--{name.replace('_', '-')} / IMDS_{name.upper()} must be positive"
            raise ConfigError(msg)
    return {
        "instance_auth": frozenset(INSTANCE_AUTH_FLAVORS) if "all" in chosen else frozenset(chosen),
        "db_connect_timeout": float(raw["db_connect_timeout"]),
        "db_statement_timeout": float(raw["db_statement_timeout"]),
    }


def _ganeti_settings(raw: dict[str, Any]) -> dict[str, Any]:
    """The Ganeti OS-installation options, checked."""
    key_file = raw["private_key_file"]
    if key_file is not None and not Path(key_file).is_file():
        msg = f"--private-key-file / IMDS_PRIVATE_KEY_FILE: {key_file} is not a file"
        raise ConfigError(msg)
    for name in ("os_param_max_bytes", "os_package_max_bytes", "os_package_timeout"):
        if raw[name] <= 0:
            msg = f"--{name.replace('_', '-')} / IMDS_{name.upper()} must be positive"
            raise ConfigError(msg)
    return {
        "private_key_file": key_file,
        "os_definitions_dir": raw["os_definitions_dir"],
        "os_param_max_bytes": int(raw["os_param_max_bytes"]),
        "os_package_max_bytes": int(raw["os_package_max_bytes"]),
        "os_package_timeout": float(raw["os_package_timeout"]),
    }


def _channel_settings(raw: dict[str, Any]) -> dict[str, Any]:
    """The channel's limits, each positive."""
    names = ("event_rate", "event_burst", "event_max_bytes", "event_retain", "message_max_bytes",
             "message_max_queued", "watch_max_timeout")
    for name in names:
        if raw[name] <= 0:
            flag = "--" + name.replace("_", "-")
            msg = f"{flag} / IMDS_{name.upper()} must be positive"
            raise ConfigError(msg)
    return {name: raw[name] for name in names}
def _validate_server(raw: dict[str, Any], db_url: str) -> None:
    """Server choice and listener limits: a known server, positive limits, workers that can share a store."""
    if raw["server"] not in SERVERS:
        msg = f"--server / IMDS_SERVER: {raw['server']!r} is not one of {', '.join(SERVERS)}"
        raise ConfigError(msg)
    if raw["workers"] > 1 and db_url.startswith("memory://"):
        msg = "--workers / IMDS_WORKERS: more than one worker needs a shared database, not memory://"
        raise ConfigError(msg)
    positive = ("workers", "max_header_bytes", "max_headers", "header_timeout", "body_timeout",
                "keepalive_timeout", "max_connections")
    for name in (*positive, "rate_limit", "rate_burst"):
        if raw[name] < 0 or (raw[name] == 0 and name in positive):
            flag = "--" + name.replace("_", "-")
            msg = f"{flag} / IMDS_{name.upper()} must be {'positive' if name in positive else 'zero or more'}"
            raise ConfigError(msg)
    if raw["max_header_bytes"] < MIN_HEADER_BYTES:
        msg = f"--max-header-bytes / IMDS_MAX_HEADER_BYTES must be at least {MIN_HEADER_BYTES}"
        raise ConfigError(msg)
    if raw["rate_limit"] and raw["rate_burst"] < 1:
        msg = "--rate-burst / IMDS_RATE_BURST must be at least 1 when --rate-limit is on"
        raise ConfigError(msg)


def _validate_lookup(raw: dict[str, Any]) -> None:
    """Upstream settings: an http(s) URL, one credential kind, complete client credentials."""
    url = raw["lookup_url"]
    if url is not None and not url.lower().startswith(("http://", "https://")):
        msg = f"--lookup-url / IMDS_LOOKUP_URL: {url!r} is not an http:// or https:// URL"
        raise ConfigError(msg)
    oauth = [raw[k] for k in ("lookup_oidc_issuer", "lookup_client_id", "lookup_client_secret")]
    if any(oauth) and not all(oauth):
        msg = ("--lookup-oidc-issuer, --lookup-client-id and --lookup-client-secret "
               "(IMDS_LOOKUP_OIDC_ISSUER, IMDS_LOOKUP_CLIENT_ID, IMDS_LOOKUP_CLIENT_SECRET) go together")
        raise ConfigError(msg)
    if any(oauth) and raw["lookup_token"]:
        msg = "--lookup-token / IMDS_LOOKUP_TOKEN and OAuth2 client credentials exclude each other"
        raise ConfigError(msg)
    for name in ("lookup_timeout", "lookup_negative_ttl", "lookup_cache_ttl", "lookup_breaker_reset"):
        if raw[name] <= 0:
            flag = "--" + name.replace("_", "-")
            msg = f"{flag} / IMDS_{name.upper()} must be positive"
            raise ConfigError(msg)
    for name in ("lookup_concurrency", "lookup_breaker_failures"):
        if raw[name] < 1:
            flag = "--" + name.replace("_", "-")
            msg = f"{flag} / IMDS_{name.upper()} must be at least 1"
            raise ConfigError(msg)
    if raw["lookup_refresh_after"] < 0:
        msg = "--lookup-refresh-after / IMDS_LOOKUP_REFRESH_AFTER must be 0 (off) or positive"
        raise ConfigError(msg)


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


def _parse_cidr(value: str) -> Network:
    try:
        return ipaddress.ip_network(value, strict=False)
    except ValueError as exc:
        msg = f"--trusted-proxy / IMDS_TRUSTED_PROXIES: {value!r} is not a CIDR"
        raise ConfigError(msg) from exc


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
           "HOST:PORT to listen on (repeatable; [v6]:PORT, [fe80::a9fe:a9fe%IFACE]:PORT; env: comma-separated)."),
    Option("upstream", "IMDS_PROXY_UPSTREAM", "str", None,
           "Base URL of imds serve, e.g. http://10.0.0.2:8000 (required)."),
    Option("shared_secret_file", "IMDS_PROXY_SHARED_SECRET_FILE", "path", None,
           "File holding the secret that signs X-Instance-ID (the one imds serve checks; required)."),
    Option("map", "IMDS_PROXY_MAP", "path", None,
           "Identify VMs by source IP from this file (JSON or lines; see README), reloaded on SIGHUP or change."),
    Option("map_poll_interval", "IMDS_PROXY_MAP_POLL_INTERVAL", "float", 2.0,
           "Seconds between checks of the --map file for changes (0: SIGHUP only)."),
    Option("inport", "IMDS_PROXY_INPORT", "bool", False,  # noqa: FBT003 - a table row, not a call site
           "Identify VMs by OVS port: source 128.0.0.0|ofport (imds agent --mode inport), looked up in --ovsdb."),
    Option("ovsdb", "IMDS_PROXY_OVSDB", "str", None,
           "OVSDB server for --inport (unix:PATH), e.g. unix:/var/run/openvswitch/db.sock."),
    Option("integration_bridge", "IMDS_PROXY_INTEGRATION_BRIDGE", "str", "br-int",
           "For --inport: the bridge whose OpenFlow port numbers the source addresses carry."),
    Option("timeout", "IMDS_PROXY_TIMEOUT", "float", 5.0,
           "Seconds an upstream read or write may take, per request (then 503)."),
    Option("connect_timeout", "IMDS_PROXY_CONNECT_TIMEOUT", "float", 2.0,
           "Seconds to connect to the upstream (then 503)."),
    Option("max_connections", "IMDS_PROXY_MAX_CONNECTIONS", "int", 64,
           "Keep-alive connections to the upstream, at most."),
    Option("max_body_bytes", "IMDS_PROXY_MAX_BODY_BYTES", "int", 64 * 1024,
           "Largest request body a VM may send (then 413)."),
    Option("log_level", "IMDS_PROXY_LOG_LEVEL", "str", "info",
           "Log level: debug, info, warning or error."),
)


@dataclass(frozen=True)
class ProxySettings:
    """Validated configuration of ``imds proxy``. Build it with ``load_proxy``."""

    upstream: str
    shared_secret_file: Path
    listen: tuple[tuple[str, int], ...] = (("169.254.169.254", 80),)
    map_file: Path | None = None
    map_poll_interval: float = 2.0
    inport: bool = False
    ovsdb: str | None = None
    integration_bridge: str = "br-int"
    timeout: float = 5.0
    connect_timeout: float = 2.0
    max_connections: int = 64
    max_body_bytes: int = 64 * 1024
    log_level: str = "info"


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
    upstream = raw["upstream"]
    if not upstream or not upstream.lower().startswith("http://"):
        msg = "--upstream / IMDS_PROXY_UPSTREAM: an http://HOST:PORT URL of imds serve is required"
        raise ConfigError(msg)
    if raw["shared_secret_file"] is None:
        msg = "--shared-secret-file / IMDS_PROXY_SHARED_SECRET_FILE is required"
        raise ConfigError(msg)
    if (raw["map"] is None) == (not raw["inport"]):
        msg = "exactly one identification mode is required: --map FILE, or --ovsdb unix:PATH --inport"
        raise ConfigError(msg)
    if raw["inport"] and not raw["ovsdb"]:
        msg = "--inport needs --ovsdb unix:PATH / IMDS_PROXY_OVSDB"
        raise ConfigError(msg)
    level = str(raw["log_level"]).lower()
    if level not in LOG_LEVELS:
        msg = f"--log-level / IMDS_PROXY_LOG_LEVEL: {level!r} is not one of {', '.join(LOG_LEVELS)}"
        raise ConfigError(msg)
    for name in ("timeout", "connect_timeout", "max_connections", "max_body_bytes"):
        if raw[name] <= 0:
            msg = f"--{name.replace('_', '-')} / IMDS_PROXY_{name.upper()} must be positive"
            raise ConfigError(msg)
    if raw["map_poll_interval"] < 0:
        msg = "--map-poll-interval / IMDS_PROXY_MAP_POLL_INTERVAL must be 0 (off) or positive"
        raise ConfigError(msg)
    return ProxySettings(
        upstream=upstream,
        shared_secret_file=raw["shared_secret_file"],
        listen=tuple(parse_listen(item) for item in raw["listen"]),
        map_file=raw["map"],
        map_poll_interval=float(raw["map_poll_interval"]),
        inport=bool(raw["inport"]),
        ovsdb=raw["ovsdb"],
        integration_bridge=raw["integration_bridge"],
        timeout=float(raw["timeout"]),
        connect_timeout=float(raw["connect_timeout"]),
        max_connections=int(raw["max_connections"]),
        max_body_bytes=int(raw["max_body_bytes"]),
        log_level=level,
    )


# ``imds agent`` (one per hypervisor) has its own table, so its flags and IMDS_AGENT_* variables
# stay apart from the server's. Provider ranges are validated by ``imds.agent.allocate.Pool``.
AGENT_OPTIONS: tuple[Option, ...] = (
    Option("ovsdb", "IMDS_AGENT_OVSDB", "str", "unix:/var/run/openvswitch/db.sock",
           "OVSDB server to read VM ports from and write Meta addresses to (unix:PATH or tcp:HOST:PORT)."),
    Option("integration_bridge", "IMDS_AGENT_INTEGRATION_BRIDGE", "str", "br-int",
           "The bridge VM ports are plugged into (the operator's; it must exist)."),
    Option("metadata_bridge", "IMDS_AGENT_METADATA_BRIDGE", "str", "br-meta",
           "The bridge the agent creates for tap-meta."),
    Option("upstream", "IMDS_AGENT_UPSTREAM", "str", None,
           "imds serve URL that haproxy forwards to, e.g. http://10.0.0.2:8000 (required)."),
    Option("shared_secret_file", "IMDS_AGENT_SHARED_SECRET_FILE", "path", None,
           "File holding the proxy shared secret that signs X-Instance-ID (required)."),
    Option("provider_cidr", "IMDS_AGENT_PROVIDER_CIDR", "str", "240.0.0.0/16",
           "IPv4 range of Meta IPs; the first host is tap-meta (haproxy)."),
    Option("provider_cidr6", "IMDS_AGENT_PROVIDER_CIDR6", "str", "fd00:a9fe::/64",
           "IPv6 range of Meta IPv6 addresses (ULA); the first host is tap-meta."),
    Option("provider_base_mac", "IMDS_AGENT_PROVIDER_BASE_MAC", "str", "fa:16:ee:00:00:00",
           "Meta MACs are this plus the Meta IP's offset in the range (tap-meta: ...:01)."),
    Option("provider_vlan_id", "IMDS_AGENT_PROVIDER_VLAN_ID", "int", 998,
           "VLAN tagging metadata traffic on the patch link between the two bridges."),
    Option("state_dir", "IMDS_AGENT_STATE_DIR", "path", "/var/lib/imds/agent",
           "Directory for the haproxy config and master socket."),
    Option("haproxy_bin", "IMDS_AGENT_HAPROXY_BIN", "str", "haproxy",
           "haproxy executable."),
    Option("meta_netns", "IMDS_AGENT_META_NETNS", "str", None,
           "Network namespace for tap-meta (created if missing; default: the host's own)."),
    Option("meta_port", "IMDS_AGENT_META_PORT", "str", "tap-meta",
           "Name of the internal port haproxy listens behind."),
    Option("mode", "IMDS_AGENT_MODE", "str", "haproxy",
           "haproxy (one haproxy, a Meta IP per VM) or inport (source 128.0.0.0|ofport, for imds proxy --inport)."),
    Option("check_interval", "IMDS_AGENT_CHECK_INTERVAL", "float", 2.0,
           "Seconds between checks that the flows are still installed (ovs-vswitchd restarts lose them)."),
    Option("log_level", "IMDS_AGENT_LOG_LEVEL", "str", "info",
           "Log level: debug, info, warning or error."),
)
AGENT_MODES = ("haproxy", "inport")


@dataclass(frozen=True)
class AgentSettings:
    """Validated configuration of ``imds agent``. Build it with ``load_agent``."""

    upstream: str
    shared_secret_file: Path
    ovsdb: str = "unix:/var/run/openvswitch/db.sock"
    integration_bridge: str = "br-int"
    metadata_bridge: str = "br-meta"
    provider_cidr: str = "240.0.0.0/16"
    provider_cidr6: str = "fd00:a9fe::/64"
    provider_base_mac: str = "fa:16:ee:00:00:00"
    provider_vlan_id: int = 998
    state_dir: Path = Path("/var/lib/imds/agent")
    haproxy_bin: str = "haproxy"
    meta_netns: str | None = None
    meta_port: str = "tap-meta"
    mode: str = "haproxy"
    check_interval: float = 2.0
    log_level: str = "info"


def load_agent(flags: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> AgentSettings:
    """Resolve ``AGENT_OPTIONS`` (flag, else IMDS_AGENT_* variable, else default) and validate them."""
    raw = _resolve(AGENT_OPTIONS, flags or {}, os.environ if environ is None else environ)
    for name in ("upstream", "shared_secret_file"):
        if raw[name] is None:
            option = next(o for o in AGENT_OPTIONS if o.name == name)
            raise ConfigError(f"{option.flag} / {option.env} is required")
    if raw["mode"] not in AGENT_MODES:
        raise ConfigError(f"--mode / IMDS_AGENT_MODE: {raw['mode']!r} is not one of {', '.join(AGENT_MODES)}")
    if not 1 <= raw["provider_vlan_id"] <= 4094:
        raise ConfigError("--provider-vlan-id / IMDS_AGENT_PROVIDER_VLAN_ID must be 1 to 4094")
    if raw["check_interval"] <= 0:
        raise ConfigError("--check-interval / IMDS_AGENT_CHECK_INTERVAL must be positive")
    level = str(raw["log_level"]).lower()
    if level not in LOG_LEVELS:
        raise ConfigError(f"--log-level / IMDS_AGENT_LOG_LEVEL: {level!r} is not one of {', '.join(LOG_LEVELS)}")
    for name in ("meta_port", "integration_bridge", "metadata_bridge"):
        if not 0 < len(raw[name]) <= 15:
            raise ConfigError(f"--{name.replace('_', '-')}: {raw[name]!r} must be 1-15 characters (a Linux name)")
    return AgentSettings(**{**raw, "log_level": level, "state_dir": Path(raw["state_dir"])})
