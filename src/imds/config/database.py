"""The one parse of ``--db``: a database URL into the connection parameters every command uses.

PostgreSQL URLs are read the way libpq reads them, in every form operators write:

- a host list in the URL: ``postgresql://u@h1:5432,h2:5433/db`` (``[v6]:port`` too);
- ``?host=h1,h2&port=5432,5433`` (one port for every host, or one per host), query values
  overriding the URL's own parts, as in libpq;
- repeated ``host=`` (``?host=h1:5432&host=h2:5432``): every one is kept, in order (libpq and
  asyncpg keep only the last, which silently drops servers);
- Unix-socket hosts: a directory (``?host=/var/run/postgresql`` or ``%2Fvar%2Frun%2Fpostgresql``
  in the host part); no host at all means Debian's socket directory, as ``psql`` does there;
- ``target_session_attrs``: imds writes, so it connects only to a read-write server whatever
  the URL says; ``read-write`` and ``primary`` say so, other values are refused;
- ``connect_timeout``: seconds per server, as in libpq (it replaces ``--db-connect-timeout``);
- TLS: ``sslmode``, ``sslrootcert``, ``sslcert``, ``sslkey`` (libpq's meanings).

Anything else is refused with one line naming what is wrong (``DatabaseUrlError``), never a
traceback. SQLite (``sqlite:///PATH``) and ``memory://`` URLs are only recognised here.
``parse_source`` reads a database imds only reads from (``imds import --from-hollow``) the same
way, but keeps any ``target_session_attrs`` and passes other parameters on to the server.
A leaf: imports only ``errors``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal, NoReturn
from urllib.parse import parse_qsl, quote, unquote

from imds.errors import ConfigError

Kind = Literal["postgresql", "sqlite", "memory"]
DEFAULT_PORT = 5432
DEFAULT_SOCKET_DIR = "/var/run/postgresql"  # Debian's libpq default when a URL names no host
SESSION_ATTRS = ("any", "read-write", "read-only", "primary", "standby", "prefer-standby")
WRITABLE_ATTRS = ("read-write", "primary")
SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
TLS_PARAMS = ("sslmode", "sslrootcert", "sslcert", "sslkey")
PARAMS = ("host", "port", "user", "password", "dbname", "target_session_attrs", "connect_timeout", *TLS_PARAMS)
_KEEPALIVES = ("imds sets keepalives and TCP_USER_TIMEOUT on every connection itself, from --db-connect-timeout "
               "and --db-statement-timeout")
_SET_ELSEWHERE = {
    "application_name": "imds names its sessions imds-PID",
    **dict.fromkeys(("keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count", "tcp_user_timeout"),
                    _KEEPALIVES),
}
_SCHEMES = {"postgresql": "postgresql", "postgres": "postgresql", "postgresql+asyncpg": "postgresql"}


class DatabaseUrlError(ConfigError):
    """A database URL imds cannot read; the message says what is wrong (never the password)."""


@dataclass(frozen=True, order=True)
class Server:
    """One PostgreSQL server: a host name or address and port, or a Unix-socket directory and port."""

    host: str
    port: int = DEFAULT_PORT

    @property
    def unix(self) -> bool:
        """Whether ``host`` is a Unix-socket directory."""
        return self.host.startswith("/")

    def __str__(self) -> str:
        if self.unix:
            return f"{self.host.rstrip('/')}/.s.PGSQL.{self.port}"
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Database:
    """A parsed ``--db``: which kind, and for PostgreSQL the servers, credentials and TLS options."""

    kind: Kind
    url: str
    servers: tuple[Server, ...] = ()
    user: str | None = None
    password: str | None = None
    name: str | None = None
    tls: tuple[tuple[str, str], ...] = ()
    connect_timeout: float | None = None  # the URL's connect_timeout (seconds per server), when it has one
    session_attrs: str | None = None  # the URL's target_session_attrs (kept only by ``parse_source``)
    extra: tuple[tuple[str, str], ...] = ()  # other parameters, for the server (only by ``parse_source``)

    @property
    def where(self) -> str:
        """How messages name it: ``postgresql server h1:5432`` or ``postgresql servers h1:5432, h2:5433``."""
        if self.kind != "postgresql":
            return self.kind
        plural = "s" if len(self.servers) > 1 else ""
        return f"postgresql server{plural} {', '.join(map(str, self.servers))}"

    @property
    def shown(self) -> str:
        """The URL with its password hidden."""
        return redact(self.url)

    def params_dsn(self) -> str | None:
        """The TLS options and other parameters as a host-less DSN asyncpg reads them from (None: none given)."""
        params = (*self.tls, *self.extra)
        if not params:
            return None
        return "postgresql://?" + "&".join(f"{key}={quote(value, safe='/')}" for key, value in params)


def redact(url: str) -> str:
    """The URL with the password (in the user part or a ``password=`` parameter) replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    head, qmark, query = rest.partition("?")
    if "@" in head.split("/", 1)[0]:
        netloc, slash, path = head.partition("/")
        creds, _, hosts = netloc.rpartition("@")
        head = f"{creds.split(':', 1)[0]}:***@{hosts}{slash}{path}" if ":" in creds else head
    if qmark:
        query = "&".join("password=***" if part.lower().startswith("password=") else part
                         for part in query.split("&"))
    return f"{scheme}://{head}{qmark}{query}"


@functools.lru_cache(maxsize=64)
def parse_database(url: str) -> Database:
    """Read ``url``; raise DatabaseUrlError naming the problem (the URL shown without its password)."""
    scheme, sep, rest = url.partition("://")
    if url == "memory://" or (sep and scheme == "memory"):
        return Database("memory", url)
    if url.split(":", 1)[0].split("+", 1)[0] == "sqlite":  # its path is SQLAlchemy's to read (and checks.py's)
        return Database("sqlite", url)
    if not sep or scheme.lower() not in _SCHEMES:
        _fail(url, "unsupported database URL scheme (use sqlite:///PATH, postgresql://USER:PASS@HOST:PORT/DB "
                   "or memory://)")
    return _postgresql(url, rest, reading=False)


@functools.lru_cache(maxsize=8)
def parse_source(url: str) -> Database:
    """Read the PostgreSQL URL of a database imds only reads from, as ``parse_database`` does.

    Any valid ``target_session_attrs`` is kept (``session_attrs``), and parameters imds does
    not read itself are kept for the server (``extra``), as libpq and asyncpg pass them on.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        _fail(url, "give a PostgreSQL/CockroachDB URL (postgresql://USER@HOST:PORT/DB)")
    return _postgresql(url, rest, reading=True)


def _fail(url: str, why: str) -> NoReturn:
    raise DatabaseUrlError(f"{why} in {redact(url)!r}")


def _postgresql(url: str, rest: str, *, reading: bool) -> Database:
    head, _, query = rest.partition("?")
    netloc, slash, path = head.partition("/")
    if slash and "/" in path:
        _fail(url, f"the database name {unquote(path)!r} has a '/' (percent-encode it, or a socket path in ?host=)")
    creds, at, hostlist = netloc.rpartition("@")
    if not at:
        creds, hostlist = "", netloc
    user, colon, password = creds.partition(":")
    values: dict[str, str | None] = {
        "user": unquote(user) or None, "password": unquote(password) if colon else None,
        "dbname": unquote(path) or None,
    }
    servers = _hosts(url, [hostlist] if hostlist else [])
    given = _query(url, query, reading=reading)
    for key in ("user", "password", "dbname"):
        if key in given:
            values[key] = given[key][-1] or None
    if "host" in given:  # as in libpq, the query's hosts replace the URL's
        servers = _hosts(url, given["host"])
    servers = _ports(url, servers, given.get("port", []))
    if not servers:
        servers = [(DEFAULT_SOCKET_DIR, DEFAULT_PORT)]
    attrs = _session_attrs(url, given.get("target_session_attrs", []), reading=reading)
    extra = tuple((key, found[-1]) for key, found in given.items() if key not in PARAMS)
    return Database("postgresql", url, tuple(Server(host, port or DEFAULT_PORT) for host, port in servers),
                    values["user"], values["password"], values["dbname"], _tls(url, given),
                    _timeout(url, given.get("connect_timeout", [])), attrs if reading else None, extra)


def _query(url: str, query: str, *, reading: bool) -> dict[str, list[str]]:
    given: dict[str, list[str]] = {}
    for part in filter(None, query.split("&")):
        if "=" not in part:
            _fail(url, f"parameter {unquote(part)!r} has no value (write name=value)")
        [(key, value)] = parse_qsl(part, keep_blank_values=True)
        if key not in PARAMS and not reading:
            elsewhere = _SET_ELSEWHERE.get(key)
            why = f"{key} is set by {elsewhere}" if elsewhere else f"unknown parameter {key!r}"
            _fail(url, f"{why} (imds reads {', '.join(PARAMS)})")
        given.setdefault(key, []).append(value)
    return given


def _hosts(url: str, specs: list[str]) -> list[tuple[str, int | None]]:
    """Every ``host[:port]`` of comma-separated lists (brackets around IPv6 addresses), in order."""
    return [_host(url, item.strip()) for spec in specs for item in spec.split(",")]


def _host(url: str, item: str) -> tuple[str, int | None]:
    """One ``host[:port]``, ``[v6][:port]`` or socket directory (percent-encoded or not; a ``:PORT`` after it)."""
    if not item:
        _fail(url, "an empty host in the host list")
    if unquote(item).startswith("/"):
        path, colon, port = item.rpartition(":")
        if colon and port.isdigit():
            return unquote(path), _port(url, port)
        return unquote(item), None
    item = unquote(item)
    if item.startswith(":") and item.count(":") == 1:  # a port and no host: the socket directory, as in libpq
        return DEFAULT_SOCKET_DIR, _port(url, item[1:])
    if item.startswith("["):
        address, bracket, tail = item[1:].partition("]")
        if not bracket or (tail and not tail.startswith(":")):
            _fail(url, f"host {item!r}: write an IPv6 address as [ADDRESS] or [ADDRESS]:PORT")
        return address, _port(url, tail[1:]) if tail else None
    if item.count(":") > 1:
        _fail(url, f"host {item!r}: write an IPv6 address in brackets, [ADDRESS]:PORT")
    host, colon, port = item.partition(":")
    return host, _port(url, port) if colon else None


def _port(url: str, text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        _fail(url, f"port {text!r} is not a number from 1 to 65535")
    return int(text)


def _ports(url: str, servers: list[tuple[str, int | None]], given: list[str]) -> list[tuple[str, int | None]]:
    """Apply ``port=`` (one value for every host, or one per host) to hosts without a port of their own."""
    ports = [_port(url, item.strip()) for spec in given for item in spec.split(",")]
    if not ports:
        return servers
    servers = servers or [(DEFAULT_SOCKET_DIR, None)]
    if len(ports) == 1:
        ports *= len(servers)
    if len(ports) != len(servers):
        _fail(url, f"{len(servers)} hosts but {len(ports)} ports (give one port, or one per host)")
    return [(host, own or port) for (host, own), port in zip(servers, ports, strict=True)]


def _session_attrs(url: str, given: list[str], *, reading: bool) -> str | None:
    for value in given:
        if value not in SESSION_ATTRS:
            _fail(url, f"target_session_attrs={value!r} is not one of {', '.join(SESSION_ATTRS)}")
        if value not in WRITABLE_ATTRS and not reading:
            _fail(url, f"target_session_attrs={value}: imds writes to its database, so it connects only to a "
                       "read-write server; use read-write (what imds does when it is left out) or primary")
    return given[-1] if given else None


def _timeout(url: str, given: list[str]) -> float | None:
    """``connect_timeout``: seconds per server, more than 0 (imds never waits without a bound)."""
    if not given:
        return None
    try:
        seconds = float(given[-1])
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        _fail(url, f"connect_timeout={given[-1]!r} is not a number of seconds above 0 (imds never waits "
                   "without a bound)")
    return seconds


def _tls(url: str, given: dict[str, list[str]]) -> tuple[tuple[str, str], ...]:
    mode = given.get("sslmode", [None])[-1]
    if mode is not None and mode not in SSL_MODES:
        _fail(url, f"sslmode={mode!r} is not one of {', '.join(SSL_MODES)}")
    for key in TLS_PARAMS[1:]:
        if key in given and not given[key][-1]:
            _fail(url, f"{key} is empty (give the path of a PEM file)")
    return tuple((key, given[key][-1]) for key in TLS_PARAMS if key in given)
