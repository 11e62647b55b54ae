"""A connection budget per source address, enforced beside whatever HTTP server accepts.

granian accepts in Rust and gives no accept hook; the app only sees complete request heads,
so a connection that is slow to send its head (or idle between keep-alive requests) holds a
server slot unseen (docs/server.md, "Slow connections from one source"). The warden does
not touch the bytes: every ``period`` seconds a thread of the serving process reads the
kernel's TCP table (``/proc/net/tcp``, ``/proc/net/tcp6``), counts the connections accepted
on our listeners per remote address, and when an address holds more than ``budget`` it
shuts down (``shutdown(SHUT_RDWR)``) the excess among the connections this process holds:
the server sees end-of-file and drops them, the client sees its connection closed.

- The table is the network namespace's, so with ``--workers N`` every worker counts the
  connections of all of them and makes the same choice (the ``budget`` lowest socket
  inodes of a source are kept, roughly its oldest); each shuts the excess it holds. The
  budget is per source for the whole server, not per worker.
- Connections not yet accepted have inode 0 and are not counted (they hold no slot).
- Trusted proxies' networks are exempt: every VM behind one arrives from its address.
- An fd is pinned with ``dup`` and its inode checked with ``fstat`` before the shutdown, so
  an fd closed and reused between the scan and the shutdown is never touched.
- Cheap when no source is over budget: one read of the tables, no fd walk.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from imds import log
from imds.models import Network

_log = log.get("serve")
TABLES = (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6))
# TCP states of a connection whose slot the server holds and whose peer has not been told
# to go: ESTABLISHED and CLOSE_WAIT (the peer closed, the server has not yet).
HOLDING = frozenset((b"01", b"08"))
LOG_INTERVAL = 10.0


def excess(conns: Iterable[tuple[str, int]], budget: int, exempt: Callable[[str], bool]) -> dict[int, str]:
    """The connections over budget: inode → source, from (source, inode) pairs; ``budget`` 0: none.

    Per source, the ``budget`` lowest inodes are kept (every worker reading the same table
    keeps the same ones); exempt sources are never over budget.
    """
    if budget <= 0:
        return {}
    by_source: dict[str, list[int]] = {}
    for source, inode in conns:
        by_source.setdefault(source, []).append(inode)
    over: dict[int, str] = {}
    for source, inodes in by_source.items():
        if len(inodes) > budget and not exempt(source):
            for inode in sorted(inodes)[budget:]:
                over[inode] = source
    return over


def to_shut(over: Mapping[int, str], ours: Mapping[int, int]) -> list[tuple[int, int, str]]:
    """(fd, inode, source) of the over-budget connections this process holds (``ours``: inode → fd)."""
    return [(ours[inode], inode, source) for inode, source in over.items() if inode in ours]


def _hex_address(text: bytes) -> str:
    """A /proc/net/tcp address (32-bit words in host order, hex) as its printable form."""
    raw = bytes.fromhex(text.decode())
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(raw)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address)


def _local_hex(family: int, host: str, port: int) -> bytes:
    """How /proc/net/tcp spells a local ``host:port`` (host ``""`` for a wildcard bind: port only)."""
    port_hex = b":%04X" % port
    if not host:
        return port_hex
    raw = socket.inet_pton(family, host.split("%", 1)[0])
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return raw.hex().upper().encode() + port_hex


@dataclass
class Listeners:
    """Which table rows are connections accepted on our listening sockets, per address family."""

    exact: dict[int, set[bytes]] = field(default_factory=dict)  # family → {b"0100007F:1F40"}
    ports: dict[int, set[bytes]] = field(default_factory=dict)  # family → {b":1F40"} (wildcard binds)

    @classmethod
    def of(cls, sockets: Sequence[socket.socket]) -> Listeners:
        """From the bound sockets."""
        found = cls()
        for sock in sockets:
            host, port = sock.getsockname()[:2]
            wildcard = ipaddress.ip_address(host.split("%", 1)[0]).is_unspecified
            key = _local_hex(sock.family, "" if wildcard else host, port)
            (found.ports if wildcard else found.exact).setdefault(sock.family, set()).add(key)
        return found

    def rows(self, family: int, table: bytes) -> Iterable[tuple[bytes, int]]:
        """(remote address hex, inode) of our accepted connections in one /proc/net/tcp* text."""
        exact, ports = self.exact.get(family, set()), self.ports.get(family, set())
        for line in table.split(b"\n")[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] not in HOLDING or fields[9] == b"0":
                continue
            local = fields[1]
            if local in exact or local[-5:] in ports:
                yield fields[2].rsplit(b":", 1)[0], int(fields[9])


def our_sockets(wanted: Iterable[int]) -> dict[int, int]:
    """Inode → fd of this process's sockets whose inode is in ``wanted``."""
    names = {f"socket:[{inode}]": inode for inode in wanted}
    found: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc/self/fd"):  # noqa: PTH208 - plain strings: thousands of fds per pass
            with contextlib.suppress(OSError):
                inode = names.get(os.readlink(f"/proc/self/fd/{entry}"))  # noqa: PTH115 - as above
                if inode is not None:
                    found[inode] = int(entry)
    return found


def shut(fd: int, inode: int) -> bool:
    """Shut the connection on ``fd`` down if it still is socket ``inode``; True if it was."""
    try:
        pinned = os.dup(fd)  # the dup keeps the socket alive even if the server closes fd now
    except OSError:
        return False
    try:
        if os.fstat(pinned).st_ino != inode:
            return False
        with socket.socket(fileno=pinned) as sock:
            pinned = -1  # the socket object closes it
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            return True
    finally:
        if pinned >= 0:
            os.close(pinned)


class Warden:
    """Enforces ``budget`` connections per source on ``sockets``' accepted connections."""

    def __init__(  # noqa: PLR0913 - the budget's inputs, each injected for tests
        self,
        sockets: Sequence[socket.socket],
        budget: int,
        trusted: Sequence[Network] = (),
        *,
        period: float = 0.1,
        on_shut: Callable[[int], None] = lambda _n: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.listeners = Listeners.of(sockets)
        self.families = {sock.family for sock in sockets}
        self.budget = budget
        self.trusted = tuple(trusted)
        self.period = period
        self.on_shut = on_shut
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._names: dict[tuple[int, bytes], str] = {}
        self._exempt: dict[str, bool] = {}
        self._logged: dict[str, float] = {}
        self._pending: dict[str, int] = {}

    def exempt(self, source: str) -> bool:
        """True for an address inside a trusted proxy network (cached per address)."""
        known = self._exempt.get(source)
        if known is None:
            address = ipaddress.ip_address(source)
            known = self._exempt[source] = any(address in net for net in self.trusted)
            if len(self._exempt) > 65536:
                self._exempt.clear()
        return known

    def _name(self, family: int, hex_address: bytes) -> str:
        name = self._names.get((family, hex_address))
        if name is None:
            if len(self._names) > 65536:
                self._names.clear()
            name = self._names[family, hex_address] = _hex_address(hex_address)
        return name

    def connections(self) -> list[tuple[str, int]]:
        """(source, inode) of every connection accepted on our listeners, by any worker."""
        conns: list[tuple[str, int]] = []
        for path, family in TABLES:
            if family not in self.families:
                continue
            with open(path, "rb") as table:  # noqa: PTH123 - a /proc read in the warden's thread
                text = table.read()
            conns.extend((self._name(family, remote), inode) for remote, inode in self.listeners.rows(family, text))
        return conns

    def scan(self) -> int:
        """One pass: shut the excess this process holds; how many were shut."""
        over = excess(self.connections(), self.budget, self.exempt)
        if not over:
            return 0
        shut_now: dict[str, int] = {}
        for fd, inode, source in to_shut(over, our_sockets(over)):
            if shut(fd, inode):
                shut_now[source] = shut_now.get(source, 0) + 1
        total = sum(shut_now.values())
        if total:
            self.on_shut(total)
            self._note(shut_now)
        return total

    def _note(self, shut_now: Mapping[str, int]) -> None:
        """One log line per source per ``LOG_INTERVAL``, with the count since the last one."""
        now = self._clock()
        for source, count in shut_now.items():
            self._pending[source] = self._pending.get(source, 0) + count
            last = self._logged.get(source)
            if last is None or now - last >= LOG_INTERVAL:
                _log.warning("connections.over_budget", source=source, shut=self._pending.pop(source),
                             budget=self.budget, since_seconds=None if last is None else round(now - last, 1))
                self._logged[source] = now
        if len(self._logged) > 4096:
            self._logged = {s: t for s, t in self._logged.items() if now - t < LOG_INTERVAL}

    def _run(self) -> None:
        failed = False
        while not self._stop.wait(self.period):
            try:
                self.scan()
            except (OSError, ValueError) as exc:  # a missing /proc: say so once, keep serving
                if not failed:
                    _log.warning("connections.budget_unavailable", error=str(exc))
                failed = True

    def start(self) -> None:
        """Scan every ``period`` seconds in a daemon thread (nothing if the budget is 0)."""
        if self.budget > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="imds-warden", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the thread (bounded)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
