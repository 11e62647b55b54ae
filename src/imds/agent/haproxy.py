"""The host's one haproxy: config rendering (pure), validation, atomic swap and master-worker reload.

One frontend listens on tap-meta's addresses (in the metadata namespace when there is one,
through haproxy's ``namespace`` bind option). Each VM port is one ``acl`` on its Meta IPv4
and IPv6 source address and one backend that sets the signed identity headers, replacing
whatever the VM sent, drops every forwarding header the VM sent (``X-Forwarded-For`` and
the rest of ``imds.services.identity.tokens.FORWARDING_HEADERS``), and forwards to
``--upstream``. Anything else gets a 404 from haproxy itself. An IMDSv2 token PUT (any
path serve takes for the token path) carrying a forwarding header is refused by haproxy
with serve's own answer (403, ``403 - Forbidden``), in the VM's backend before those
headers are dropped.
Each port may hold at most ``--max-connections-per-source`` open connections (one counter
per port, over its Meta IPv4 and IPv6 alike, in a stick table; sources that are no port's
share one counter); a connection over it is closed as soon as it is accepted. The
signature is computed by haproxy per request (its ``hmac`` converter, 2.6+): each backend
stamps ``X-Instance-ID-Timestamp`` with ``date`` and signs ``imds.signing.stamped_message``
of it, the id and the tenant, so a captured header is good only within serve's
``--proxy-signature-window``. The key reaches haproxy in its environment
(``SIGNING_KEY_ENV``, base64, set by ``Haproxy`` for its child alone), never in the
config or on disk; the config refuses to load without it. The file is kept mode 0600.

Run by the agent (``Process``), haproxy's workers drop to an unprivileged user and group and
chroot to an empty directory (the master stays root to bind and reload), and log one JSON
line per request to the agent (``log fd@N``, a socket the agent reads and re-emits through
its own log): the VM's port, instance id and tenant (set per backend), its Meta source
address, method, path (``path``: never the query string, which may carry a token; never a
body), status, bytes and timings, haproxy's termination state and, when the TLS handshake
with serve failed, OpenSSL's reason. An ``https://`` upstream is verified against
``--upstream-ca-file`` (else the system's CAs) and its name, and gets the client
certificate when one is given (``UpstreamTls``).

haproxy waits ``SERVER_TIMEOUT`` for serve's answer (then 504), except for a change watch
(any ``wait_for_change`` in the query): that one may be held ``--watch-max-timeout`` plus
the same margin (``http-request set-timeout server``), so a legitimate long poll is never
cut short while every other request keeps the short bound. ``timeout client`` does not
run while haproxy waits on the server, so it needs no such exception.

Usage::

    text = render(Frontend(...), [Backend(...)], upstream, Process("imds-haproxy", "/var/lib/imds/agent/empty", 7))
    proxy = Haproxy(  # imds.agent.haproxyctl
        Path("/usr/sbin/haproxy"), state_dir, key, log_fd=7)
    proxy.apply(text)        # validates with `haproxy -c`, swaps the file, starts or reloads
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from imds.errors import ConfigError
from imds.services.identity.tokens import FORWARDING_HEADERS, FORWARDING_PREFIX, TOKEN_PATH_PATTERN

_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")  # fullmatch: a newline would start a config line
READY_TIMEOUT = 15.0
# imds serve's answer to a token PUT through a proxy (Refused, as imds.web.errors maps it).
TOKEN_REFUSED = (403, "text/plain; charset=utf-8", "403 - Forbidden")
STOP_TIMEOUT = 10.0
# The shared secret, base64 (as haproxy's hmac converter wants it), in haproxy's environment only.
SIGNING_KEY_ENV = "IMDS_HAPROXY_SIGNING_KEY"
SERVER_TIMEOUT = 30  # seconds serve may take to answer an ordinary request; a watch gets its wait on top


def safe_token(value: str) -> bool:
    """Whether ``value`` may appear in the config unquoted (ids and tenants from OVSDB are checked)."""
    return _TOKEN.fullmatch(value) is not None


@dataclass(frozen=True)
class UpstreamTls:
    """How haproxy checks an https:// ``imds serve`` and proves itself to it.

    ``ca_file``: the CA bundle (None: the system's); ``certificate``: a PEM holding the client
    certificate and its key, or one haproxy finds the key beside as ``<file>.key``; ``insecure``:
    no verification at all.
    """

    ca_file: str | None = None
    certificate: str | None = None
    insecure: bool = False


@dataclass(frozen=True)
class Upstream:
    """Where haproxy forwards: ``imds serve``."""

    host: str
    port: int
    tls: bool = False
    verify: UpstreamTls = UpstreamTls()

    @classmethod
    def parse(cls, url: str) -> Upstream:
        """``http(s)://HOST[:PORT]`` (no path); ConfigError naming ``--upstream`` otherwise."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"--upstream: {url!r} is not an http:// or https:// URL")
        if parts.path not in ("", "/") or parts.query:
            raise ConfigError(f"--upstream: {url!r} must have no path (imds serve answers at its root)")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise ConfigError(f"--upstream: {url!r} has an invalid port") from exc
        if not safe_token(parts.hostname) and not _is_ip(parts.hostname):
            raise ConfigError(f"--upstream: {parts.hostname!r} is not a host name or address")
        return cls(parts.hostname, port, parts.scheme == "https")

    @property
    def address(self) -> str:
        """``HOST:PORT`` as haproxy's ``server`` line wants it (IPv6 in brackets)."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Process:
    """How the agent runs haproxy: the workers' user (and its group), their chroot, the log socket's fd."""

    user: str
    chroot: str
    log_fd: int


@dataclass(frozen=True)
class Frontend:
    """Where haproxy listens: tap-meta's addresses (and its namespace, if any)."""

    addresses: tuple[str, ...]
    port: int = 80
    namespace: str | None = None
    max_connections_per_source: int = 32
    watch_max_timeout: int = 300  # imds serve's --watch-max-timeout
    server_timeout: int = SERVER_TIMEOUT
    host: str | None = None  # this host's name when signing with its own key (X-Instance-Host)


@dataclass(frozen=True)
class Backend:
    """One VM port: the source addresses it arrives from and the identity haproxy asserts for it."""

    name: str  # the OVS port, for the reader of the file
    sources: tuple[str, ...]
    instance_id: str
    tenant: str | None = None


def _bind(frontend: Frontend, address: str) -> str:
    shown = f"[{address}]" if ":" in address else address
    namespace = f" namespace {frontend.namespace}" if frontend.namespace else ""
    return f"    bind {shown}:{frontend.port}{namespace}"


def _server(upstream: Upstream) -> str:
    """The ``server`` line: plain, or TLS verified against the CA and serve's name (the SNI haproxy sends)."""
    line = f"    server imds {upstream.address}"
    if not upstream.tls:
        return line
    tls = upstream.verify
    if tls.insecure:
        line += " ssl verify none"
    else:
        line += f" ssl verify required ca-file {tls.ca_file or '@system-ca'}"
        # haproxy matches a name against the certificate's DNS names only: an address is not checked.
        line += "" if _is_ip(upstream.host) else f" verifyhost {upstream.host}"
    line += "" if _is_ip(upstream.host) else f" sni str({upstream.host})"
    return line + (f" crt {tls.certificate}" if tls.certificate else "")


def _identity_vars(backend: Backend) -> list[str]:
    """What the request log names: the instance, its tenant and its OVS port (``txn.imds_*``)."""
    found = [f"    http-request set-var(txn.imds_id) str({backend.instance_id})"]
    if backend.tenant:
        found.append(f"    http-request set-var(txn.imds_tenant) str({backend.tenant})")
    if safe_token(backend.name):
        found.append(f"    http-request set-var(txn.imds_port) str({backend.name})")
    return found


def _backend(index: int, backend: Backend, upstream: Upstream, frontend: Frontend) -> list[str]:
    tenant = (
        f"    http-request set-header X-Tenant-ID {backend.tenant}"
        if backend.tenant
        else "    http-request del-header X-Tenant-ID"
    )
    host = (f"    http-request set-header X-Instance-Host {frontend.host}" if frontend.host
            else "    http-request del-header X-Instance-Host")
    return [
        f"backend vm{index}",
        f"    # port {backend.name}",
        *_identity_vars(backend),
        _token_put_through_a_proxy(),
        f"    http-request set-header X-Instance-ID {backend.instance_id}",
        *_signature(backend, frontend.host),
        tenant,
        host,
        *(f"    http-request del-header {name}" for name in FORWARDING_HEADERS),
        f"    http-request del-header {FORWARDING_PREFIX} -m beg",
        _watch_timeout(frontend),
        _server(upstream),
        "",
    ]


def _signing_key() -> list[str]:
    """Load the signing key from haproxy's environment into ``proc.imds_key``; refuse to start without it."""
    return [
        f"    .if !defined({SIGNING_KEY_ENV})",
        f'        .alert "{SIGNING_KEY_ENV} is not set: imds agent starts haproxy with the signing key"',
        "    .endif",
        f"    set-var proc.imds_key env({SIGNING_KEY_ENV})",
    ]


def _signature(backend: Backend, host: str | None) -> list[str]:
    r"""Stamp the request with haproxy's clock and sign ``"<date>\n<id>\n<tenant>[\n<host>]"`` (``imds.signing``).

    The date is taken once per request (``txn.imds_ts``), so the header and the signature agree.
    With a host key (``host``), the host ends the message, as ``X-Instance-Host`` says it.
    """
    rest = f"\\n{backend.instance_id}\\n{backend.tenant or ''}" + (f"\\n{host}" if host else "")
    return [
        "    http-request set-var(txn.imds_ts) date",
        "    http-request set-header X-Instance-ID-Timestamp %[var(txn.imds_ts)]",
        (f'    http-request set-header X-Instance-ID-Signature %[var(txn.imds_ts),concat("{rest}"),'
         "hmac(sha256,proc.imds_key),hex,lower]"),
    ]


def _watch_timeout(frontend: Frontend) -> str:
    """A change watch may be held ``watch_max_timeout`` on top of the ordinary server timeout.

    Any ``wait_for_change`` parameter counts (haproxy's ``url_param`` reads the first one,
    serve the last): a ``false`` one is answered at once by serve anyway.
    """
    seconds = frontend.watch_max_timeout + frontend.server_timeout
    return f"    http-request set-timeout server {seconds}s if {{ url_param(wait_for_change) -m found }}"


def _per_source_cap(ports: int, limit: int) -> list[str]:
    """Count open connections per VM port (the key is the port's acl, not an address) and close those over ``limit``.

    The key is the port, so a VM counts the same over IPv4 and IPv6, and VMs that use the
    same address on different networks never share a counter (their Meta IPs differ
    anyway). A reload starts a new, empty table; connections held by the old worker are
    not counted by the new one until they close.
    """
    return [
        f"    stick-table type string len 16 size {ports + 1} expire 60s store conn_cur",
        *(f"    tcp-request connection track-sc0 str(vm{index}) if vm{index}" for index in range(ports)),
        "    tcp-request connection track-sc0 str(unknown)",  # the first track-sc0 that applies wins
        f"    tcp-request connection reject if {{ sc0_conn_cur gt {limit} }}",
    ]


def _token_put_through_a_proxy() -> str:
    """Refuse a token PUT that carries a forwarding header, as serve would (the backend then drops those headers).

    The path is matched decoded (``path,url_dec``), as serve sees it; header names
    (``req.hdr_names``) match whatever their case and value, an empty one included. In the
    VM's backend, so the refusal is logged with the VM's id like any other request.
    """
    names = "|".join([*FORWARDING_HEADERS, FORWARDING_PREFIX + "[^,]*"])
    status, content_type, body = TOKEN_REFUSED
    refuse = f'http-request return status {status} content-type "{content_type}" string "{body}"'
    token_path = f"{{ path,url_dec -m reg '^{TOKEN_PATH_PATTERN}\\z' }}"
    forwarding = f"{{ req.hdr_names -m reg -i (^|,)({names})(,|$) }}"
    return f"    {refuse} if METH_PUT {token_path} {forwarding}"


# One JSON object per request (haproxy's log-format): the agent parses and re-emits it.
# Every string value is a token the agent checked, an address, or passed through json().
_LOG_FIELDS = (
    ('"port"', '"%[var(txn.imds_port)]"'), ('"instance_id"', '"%[var(txn.imds_id)]"'),
    ('"tenant"', '"%[var(txn.imds_tenant)]"'), ('"source"', '"%ci"'), ('"method"', '"%HM"'),
    ('"path"', '"%[var(txn.imds_path),json(utf8s)]"'), ('"status"', "%ST"), ('"bytes"', "%B"),
    ('"request_ms"', "%TR"), ('"connect_ms"', "%Tc"), ('"response_ms"', "%Tr"), ('"total_ms"', "%Ta"),
    ('"termination"', '"%tsc"'), ('"tls_error"', '"%[ssl_bc_err_str,json(utf8s)]"'),
)
LOG_FORMAT = "{" + ",".join(f"{name}:{value}" for name, value in _LOG_FIELDS) + "}"
LOG_LENGTH = 4096  # bytes of one log line (a longer path is cut, and the line re-emitted as text)


def _global(process: Process | None) -> list[str]:
    """``global``: the connection cap, the signing key, and (run by the agent) user, chroot and log."""
    lines = ["global", "    maxconn 4096", *_signing_key()]
    if process is not None:
        lines += [
            f"    user {process.user}",
            f"    group {process.user}",
            f"    chroot {process.chroot}",
            f"    log fd@{process.log_fd} len {LOG_LENGTH} format raw local0 info",
        ]
    return lines


def _logging(process: Process | None) -> list[str]:
    """The frontend's request log (only when there is a log target) and the path it names."""
    if process is None:
        return []
    return [
        "    log global",
        "    option dontlognull",
        f"    log-format '{LOG_FORMAT}'",
        "    http-request set-var(txn.imds_path) path",
    ]


def render(
    frontend: Frontend, backends: Sequence[Backend], upstream: Upstream, process: Process | None = None
) -> str:
    """The whole haproxy config; the same inputs always give the same text (backends sorted by name).

    ``process``: how the agent runs it (unprivileged, chrooted, logging to the agent); None for a
    config run by hand or in a test, as root, without a request log.
    """
    ordered = sorted(backends, key=lambda b: b.name)
    lines = [
        "# Written by imds agent: regenerated whenever the VM ports change. Do not edit.",
        *_global(process),
        "",
        "defaults",
        "    mode http",
        "    timeout connect 5s",
        "    timeout client 30s",
        f"    timeout server {frontend.server_timeout}s",
        "    timeout http-request 10s",
        "    option idle-close-on-response",
        "",
        "frontend metadata",
        *(_bind(frontend, address) for address in frontend.addresses),
        *_logging(process),
    ]
    lines += [f"    acl vm{index} src {' '.join(backend.sources)}" for index, backend in enumerate(ordered)]
    lines += _per_source_cap(len(ordered), frontend.max_connections_per_source)
    lines += [f"    use_backend vm{index} if vm{index}" for index in range(len(ordered))]
    lines += [
        "    default_backend unknown",
        "",
        "backend unknown",
        (
            "    http-request return status 404 content-type text/plain"
            ' string "no instance is associated with this port\\n"'
        ),
        "",
    ]
    for index, backend in enumerate(ordered):
        lines += _backend(index, backend, upstream, frontend)
    return "\n".join(lines)
