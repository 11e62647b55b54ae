"""The host's one haproxy: config rendering (pure), validation, atomic swap and master-worker reload.

One frontend listens on tap-meta's addresses (in the metadata namespace when there is one,
through haproxy's ``namespace`` bind option). Each VM port is one ``acl`` on its Meta IPv4
and IPv6 source address and one backend that sets the signed identity headers, replacing
whatever the VM sent, drops every forwarding header the VM sent (``X-Forwarded-For`` and
the rest of ``imds.services.identity.tokens.FORWARDING_HEADERS``), and forwards to
``--upstream``. Anything else gets a 404 from haproxy itself. An IMDSv2 token PUT (any
path serve takes for the token path) carrying a forwarding header is refused by haproxy
with serve's own answer (403, ``403 - Forbidden``), before those headers are dropped.
Each port may hold at most ``--max-connections-per-source`` open connections (one counter
per port, over its Meta IPv4 and IPv6 alike, in a stick table; sources that are no port's
share one counter); a connection over it is closed as soon as it is accepted. The
signature is precomputed here (``imds.signing.sign``), so the shared secret is never
written to disk; the file holds per-instance signatures and is kept mode 0600.

haproxy waits ``SERVER_TIMEOUT`` for serve's answer (then 504), except for a change watch
(any ``wait_for_change`` in the query): that one may be held ``--watch-max-timeout`` plus
the same margin (``http-request set-timeout server``), so a legitimate long poll is never
cut short while every other request keeps the short bound. ``timeout client`` does not
run while haproxy waits on the server, so it needs no such exception.

Usage::

    text = render(Frontend(...), [Backend(...)], upstream)
    proxy = Haproxy(Path("/usr/sbin/haproxy"), state_dir)
    proxy.apply(text)        # validates with `haproxy -c`, swaps the file, starts or reloads
"""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from imds.errors import ConfigError, HaproxyFailed
from imds.services.identity.tokens import FORWARDING_HEADERS, FORWARDING_PREFIX, TOKEN_PATH_PATTERN

_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")
READY_TIMEOUT = 15.0
# imds serve's answer to a token PUT through a proxy (Refused, as imds.web.errors maps it).
TOKEN_REFUSED = (403, "text/plain; charset=utf-8", "403 - Forbidden")
STOP_TIMEOUT = 10.0
SERVER_TIMEOUT = 30  # seconds serve may take to answer an ordinary request; a watch gets its wait on top


def safe_token(value: str) -> bool:
    """Whether ``value`` may appear in the config unquoted (ids and tenants from OVSDB are checked)."""
    return bool(_TOKEN.match(value))


@dataclass(frozen=True)
class Upstream:
    """Where haproxy forwards: ``imds serve``."""

    host: str
    port: int
    tls: bool = False

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
        return cls(parts.hostname, port, parts.scheme == "https")

    @property
    def address(self) -> str:
        """``HOST:PORT`` as haproxy's ``server`` line wants it (IPv6 in brackets)."""
        try:
            is_v6 = ipaddress.ip_address(self.host).version == 6
        except ValueError:
            is_v6 = False
        return f"[{self.host}]:{self.port}" if is_v6 else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Frontend:
    """Where haproxy listens: tap-meta's addresses (and its namespace, if any)."""

    addresses: tuple[str, ...]
    port: int = 80
    namespace: str | None = None
    max_connections_per_source: int = 32
    watch_max_timeout: int = 300  # imds serve's --watch-max-timeout
    server_timeout: int = SERVER_TIMEOUT


@dataclass(frozen=True)
class Backend:
    """One VM port: the source addresses it arrives from and the identity haproxy asserts for it."""

    name: str  # the OVS port, for the reader of the file
    sources: tuple[str, ...]
    instance_id: str
    signature: str
    tenant: str | None = None


def _bind(frontend: Frontend, address: str) -> str:
    shown = f"[{address}]" if ":" in address else address
    namespace = f" namespace {frontend.namespace}" if frontend.namespace else ""
    return f"    bind {shown}:{frontend.port}{namespace}"


def _backend(index: int, backend: Backend, upstream: Upstream, frontend: Frontend) -> list[str]:
    tls = " ssl verify required ca-file @system-ca sni str(" + upstream.host + ")" if upstream.tls else ""
    tenant = (
        f"    http-request set-header X-Tenant-ID {backend.tenant}"
        if backend.tenant
        else "    http-request del-header X-Tenant-ID"
    )
    return [
        f"backend vm{index}",
        f"    # port {backend.name}",
        f"    http-request set-header X-Instance-ID {backend.instance_id}",
        f"    http-request set-header X-Instance-ID-Signature {backend.signature}",
        tenant,
        *(f"    http-request del-header {name}" for name in FORWARDING_HEADERS),
        f"    http-request del-header {FORWARDING_PREFIX} -m beg",
        _watch_timeout(frontend),
        f"    server imds {upstream.address}{tls}",
        "",
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


def _token_put_through_a_proxy() -> list[str]:
    """Refuse a token PUT that carries a forwarding header, as serve would (the backends drop those headers).

    The path is matched decoded (``path,url_dec``), as serve sees it; header names
    (``req.hdr_names``) match whatever their case and value, an empty one included.
    """
    names = "|".join([*FORWARDING_HEADERS, FORWARDING_PREFIX + "[^,]*"])
    status, content_type, body = TOKEN_REFUSED
    refuse = f'http-request return status {status} content-type "{content_type}" string "{body}"'
    return [
        f"    acl token_path path,url_dec -m reg '^{TOKEN_PATH_PATTERN}\\z'",
        f"    acl forwarding req.hdr_names -m reg -i (^|,)({names})(,|$)",
        f"    {refuse} if METH_PUT token_path forwarding",
    ]


def render(frontend: Frontend, backends: Sequence[Backend], upstream: Upstream) -> str:
    """The whole haproxy config; the same inputs always give the same text (backends sorted by name)."""
    ordered = sorted(backends, key=lambda b: b.name)
    lines = [
        "# Written by imds agent: regenerated whenever the VM ports change. Do not edit.",
        "global",
        "    maxconn 4096",
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
    ]
    lines += [f"    acl vm{index} src {' '.join(backend.sources)}" for index, backend in enumerate(ordered)]
    lines += _per_source_cap(len(ordered), frontend.max_connections_per_source)
    lines += _token_put_through_a_proxy()
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


class Haproxy:
    """One haproxy master (``-W -S master.sock``) run as a child of the agent, config under ``state_dir``."""

    def __init__(self, binary: str, state_dir: Path) -> None:
        self.binary = binary
        self.state_dir = state_dir.resolve()
        self.config = self.state_dir / "haproxy.cfg"
        self.socket = self.state_dir / "haproxy-master.sock"
        self.log = self.state_dir / "haproxy.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.current: str | None = None

    def check(self, text: str) -> None:
        """``haproxy -c`` on ``text``; HaproxyFailed with haproxy's own words when it refuses."""
        candidate = self.state_dir / "haproxy.cfg.new"
        _write_private(candidate, text)
        try:
            result = subprocess.run(  # noqa: S603 - the configured haproxy binary on our own file
                [self.binary, "-c", "-q", "-f", str(candidate)], capture_output=True, text=True, timeout=30, check=False
            )
        except OSError as exc:
            raise HaproxyFailed(f"cannot run {self.binary}: {exc.strerror}") from exc
        if result.returncode != 0:
            candidate.unlink(missing_ok=True)
            raise HaproxyFailed(f"haproxy refused the rendered config: {(result.stderr or result.stdout).strip()}")

    def apply(self, text: str) -> bool:
        """Validate, swap in atomically and start or reload; False when ``text`` is what runs already."""
        if text == self.current and self.running:
            return False
        self.check(text)
        (self.state_dir / "haproxy.cfg.new").replace(self.config)
        if self.running:
            self.reload()
        else:
            self.start()
        self.current = text
        return True

    @property
    def running(self) -> bool:
        """Whether the master process is alive."""
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start the master and wait until it reports a worker; HaproxyFailed with its log otherwise."""
        self._stop_leftover()
        self.socket.unlink(missing_ok=True)
        with self.log.open("ab") as sink:
            self.process = subprocess.Popen(  # noqa: S603 - the configured haproxy binary
                [self.binary, "-W", "-S", f"{self.socket},mode,600", "-f", str(self.config)],
                stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
            )
        self._wait_worker(exclude=set())

    def _stop_leftover(self) -> None:
        """Stop a master a killed agent left behind (it still answers on our socket), by its PID."""
        if not self.socket.exists():
            return
        try:
            text = self.command("show proc")
        except OSError:
            return  # a stale socket file: nobody is listening
        for line in text.splitlines():
            fields = line.split()
            if len(fields) >= 2 and fields[1] == "master" and fields[0].isdigit():
                pid = int(fields[0])
                os.kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + STOP_TIMEOUT
                while _alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.05)

    def workers(self) -> set[int]:
        """PIDs of the current (not old) workers, from the master CLI's ``show proc``."""
        text = self.command("show proc")
        current: set[int] = set()
        section = "master"
        for line in text.splitlines():
            if line.startswith("#"):  # "# workers", "# old workers", "# programs"
                section = line.lstrip("#").strip()
                continue
            fields = line.split()
            if section == "workers" and len(fields) >= 2 and fields[1] == "worker" and fields[0].isdigit():
                current.add(int(fields[0]))
        return current

    def command(self, line: str) -> str:
        """One command on the master CLI socket; its answer."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5.0)
            sock.connect(str(self.socket))
            sock.sendall(line.encode() + b"\n")
            sock.shutdown(socket.SHUT_WR)  # the master CLI answers and closes once the input ends
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def reload(self) -> None:
        """Master-worker reload: a new worker takes the listeners, the old one finishes its requests."""
        before = self.workers()
        try:
            self.command("reload")
        except OSError as exc:
            raise HaproxyFailed(f"haproxy master socket {self.socket}: {exc.strerror}") from exc
        self._wait_worker(exclude=before)

    def _wait_worker(self, exclude: set[int]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if not self.running:
                raise HaproxyFailed(f"haproxy exited: {self._tail()}")
            try:
                if self.workers() - exclude:
                    return
            except OSError:
                pass  # the master socket is not there yet, or is being re-created by the reload
            time.sleep(0.05)
        raise HaproxyFailed(f"haproxy started no new worker within {READY_TIMEOUT}s: {self._tail()}")

    def tail(self) -> str:
        """The end of haproxy's own log."""
        return self._tail()

    def _tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:].strip() if self.log.exists() else ""

    def stop(self) -> None:
        """Stop the master (and its workers) by PID."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STOP_TIMEOUT)
        self.process = None
        self.current = None


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs; an exited process waiting to be reaped by init counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 from the start (it holds signatures)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
