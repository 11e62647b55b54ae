"""A connection budget per source address, enforced beside whatever HTTP server accepts.

granian accepts in Rust and gives no accept hook; the app only sees complete request heads,
so a connection that is slow to send its head (or idle between keep-alive requests) holds a
server slot unseen (docs/server.md, "Slow connections from one source"). The warden does
not touch the bytes: every ``period`` seconds a thread of the serving process asks the
kernel (netlink ``sock_diag``, what ``ss`` uses; filtered by state and local port in the
kernel) for the connections accepted on our listeners, counts them per remote address,
and when an address holds more than ``budget`` it shuts down (``shutdown(SHUT_RDWR)``) the
excess among the connections this process holds: the server sees end-of-file and drops
them, the client sees its connection closed.

- The kernel's table is the network namespace's, so with ``--workers N`` every worker
  counts the connections of all of them and makes the same choice (the ``budget`` lowest
  socket inodes of a source are kept, roughly its oldest); each shuts the excess it holds.
  The budget is per source for the whole server, not per worker.
- Connections not yet accepted have inode 0 and are not counted (they hold no slot).
- Trusted proxies' networks are exempt: every VM behind one arrives from its address.
- Our fds are found by ``fstat`` (socket inode); each is pinned with ``dup`` and its inode
  checked again before the shutdown, so an fd closed and reused meanwhile is never touched.
- Cheap when no source is over budget: one netlink dump of our listeners' connections; and
  none at all beside a server that counts its connections per source (the front, ``tally``:
  ``imds.cli.tally``), until a count says a source may be over budget. The dump is what
  costs under a boot storm: the kernel walks every socket of the namespace, TIME_WAIT ones
  included, to find the few it returns.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence

from imds import log
from imds.cli.tally import Tally
from imds.models import Network

_log = log.get("serve")
LOG_INTERVAL = 10.0
NICE = 10  # the warden thread's nice value, above the server's
CHUNK, MAX_PAUSE = 64, 0.01  # shutdowns at once, and the most time between two chunks
NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY = 4, 20
NLM_F_REQUEST, NLM_F_DUMP, NLMSG_ERROR, NLMSG_DONE = 0x1, 0x300, 2, 3
INET_DIAG_REQ_BYTECODE, INET_DIAG_BC_S_EQ = 1, 11
# TCP states of a connection whose slot the server holds and whose peer has not been told
# to go: ESTABLISHED (1) and CLOSE_WAIT (8: the peer closed, the server has not yet).
HOLDING = (1 << 1) | (1 << 8)
_HEADER = struct.Struct("=IHHII")  # nlmsghdr
_MSG = struct.Struct("=BBBB2s2s16s16sI8sIIIII")  # inet_diag_msg: family, state, ..., sockid, ..., inode
Row = tuple[int, bytes, bytes, int]  # (family, local address, remote address, inode)


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


def dump_request(family: int, port: int, seq: int = 1) -> bytes:
    """A sock_diag dump request: TCP sockets of ``family`` in a HOLDING state with local port ``port``."""
    # One condition: "source port == port"; yes: jump to the end (accept), no: past it (reject).
    bytecode = struct.pack("=BBH", INET_DIAG_BC_S_EQ, 8, 12) + struct.pack("=BBH", 0, 0, port)
    attribute = struct.pack("=HH", 4 + len(bytecode), INET_DIAG_REQ_BYTECODE) + bytecode
    body = struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 0, HOLDING) + bytes(48) + attribute
    return _HEADER.pack(_HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body


def parse_dump(buffer: bytes) -> tuple[list[Row], bool]:
    """The rows in one netlink read, and True once the dump's end was in it."""
    rows: list[Row] = []
    offset = 0
    while offset + _HEADER.size <= len(buffer):
        length, kind, _flags, _seq, _pid = _HEADER.unpack_from(buffer, offset)
        if kind == NLMSG_DONE:
            return rows, True
        if kind == NLMSG_ERROR:
            errno = -struct.unpack_from("=i", buffer, offset + _HEADER.size)[0]
            raise OSError(errno, f"sock_diag: {os.strerror(errno)}")
        family, _state, _t, _r, _sport, _dport, src, dst, _if, _c, _e, _rq, _wq, _uid, inode = _MSG.unpack_from(
            buffer, offset + _HEADER.size)
        size = 4 if family == socket.AF_INET else 16
        rows.append((family, src[:size], dst[:size], inode))
        offset += max(_HEADER.size, (length + 3) & ~3)
    return rows, False


def dump(port: int, family: int) -> list[Row]:
    """Every TCP connection of ``family`` with local port ``port`` in a HOLDING state (any process's)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as diag:
        diag.sendall(dump_request(family, port))
        found: list[Row] = []
        while True:
            rows, done = parse_dump(diag.recv(1 << 17))
            found += rows
            if done:
                return found


def fd_table_size() -> int:
    """How many fds this process's table can hold now (an upper bound on its fd numbers)."""
    with open("/proc/self/status", "rb") as status:  # noqa: PTH123 - a /proc read in the warden's thread
        for line in status:
            if line.startswith(b"FDSize:"):
                return int(line.split()[1])
    return 0


def our_sockets(wanted: Collection[int]) -> dict[int, int]:
    """Map inode → fd for this process's sockets whose inode is in ``wanted``."""
    found: dict[int, int] = {}
    for fd in range(fd_table_size()):
        try:
            info = os.fstat(fd)
        except OSError:
            continue
        if info.st_ino in wanted and stat.S_ISSOCK(info.st_mode):
            found[info.st_ino] = fd
    return found


def shut(fd: int, inode: int, family: int = socket.AF_INET) -> bool:
    """Shut the connection on ``fd`` down if it still is socket ``inode``; True if it was."""
    try:
        pinned = os.dup(fd)  # the dup keeps the socket alive even if the server closes fd now
    except OSError:
        return False
    try:
        info = os.fstat(pinned)
        if info.st_ino != inode or not stat.S_ISSOCK(info.st_mode):
            return False
        # Family and type given: no getsockopt calls to find them (this runs thousands of times a second).
        sock = socket.socket(family, socket.SOCK_STREAM, 0, pinned)
        pinned = -1  # the socket object closes it
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        return True
    finally:
        if pinned >= 0:
            os.close(pinned)


def listeners(sockets: Sequence[socket.socket]) -> dict[tuple[int, int], set[bytes] | None]:
    """(family, port) → the local addresses bound (None: a wildcard bind, any address)."""
    found: dict[tuple[int, int], set[bytes] | None] = {}
    for sock in sockets:
        host, port = sock.getsockname()[:2]
        address = ipaddress.ip_address(host.split("%", 1)[0])
        key = (int(sock.family), int(port))
        if address.is_unspecified:
            found[key] = None
        elif (bound := found.setdefault(key, set())) is not None:
            bound.add(address.packed)
    return found


def ours_only(rows: Iterable[Row], bound: set[bytes] | None) -> Iterator[Row]:
    """The rows accepted on a listener (inode != 0) bound to ``bound`` (None: any local address)."""
    for row in rows:
        if row[3] and (bound is None or row[1] in bound):
            yield row


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
        tally: Tally | None = None,
    ) -> None:
        self.listeners = listeners(sockets)
        self.budget = budget
        self.trusted = tuple(trusted)
        self.period = period
        self.on_shut = on_shut
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._names: dict[bytes, str] = {}
        self._exempt: dict[str, bool] = {}
        self._logged: dict[str, float] = {}
        self._pending: dict[str, int] = {}
        # The server's own per-source counts, when it keeps them: a dump only after they raised the alarm.
        self.tally = tally
        self._dumped = 0  # monotonic ns at the start of the last dump
        if tally is not None:
            tally.budget = budget
            tally.exempt = self.exempt

    def exempt(self, source: str) -> bool:
        """True for an address inside a trusted proxy network (cached per address)."""
        known = self._exempt.get(source)
        if known is None:
            address = ipaddress.ip_address(source)
            known = self._exempt[source] = any(address in net for net in self.trusted)
            if len(self._exempt) > 65536:
                self._exempt.clear()
        return known

    def _name(self, packed: bytes) -> str:
        name = self._names.get(packed)
        if name is None:
            if len(self._names) > 65536:
                self._names.clear()
            address = ipaddress.ip_address(packed)
            if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
                address = address.ipv4_mapped
            name = self._names[packed] = str(address)
        return name

    def connections(self) -> list[tuple[str, int]]:
        """(source, inode) of every connection accepted on our listeners, by any worker."""
        return [(self._name(remote), inode)
                for (family, port), bound in self.listeners.items()
                for _f, _local, remote, inode in ours_only(dump(port, family), bound)]

    def due(self) -> bool:
        """Whether a pass is due: always without a tally; with one, if its alarm rose since the last dump."""
        return self.tally is None or self.tally.alarmed_since(self._dumped)

    def scan(self) -> int:
        """One pass: shut the excess this process holds; how many were shut.

        With a tally, an excess found (anyone's) raises its alarm again: every worker's
        warden passes again next period, until a pass finds none.
        """
        started = time.monotonic_ns()
        conns = self.connections()
        self._dumped = started  # a failed dump leaves the alarm pending
        over = excess(conns, self.budget, self.exempt)
        if not over:
            return 0
        if self.tally is not None:
            self.tally.alarm()
        shut_now: dict[str, int] = {}
        targets = to_shut(over, our_sockets(over))
        # In chunks spread over the period: a thousand shutdowns at once (and the thousand
        # reconnections they invite) would arrive as one burst in front of everyone's reads.
        pause = min(MAX_PAUSE, self.period * CHUNK / len(targets)) if targets else 0.0
        for index, (fd, inode, source) in enumerate(targets):
            if index and not index % CHUNK:
                self._stop.wait(pause)
            if shut(fd, inode, socket.AF_INET6 if ":" in source else socket.AF_INET):
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
        if len(self._logged) > 4096:  # forget the sources quiet for an interval (and what they had pending)
            self._logged = {s: t for s, t in self._logged.items() if now - t < LOG_INTERVAL}
            self._pending = {s: n for s, n in self._pending.items() if s in self._logged}

    def _run(self) -> None:
        # Linux threads have their own nice value: under CPU contention the event loop and the
        # server's threads come first, and a pass of shutdowns waits (the budget has headroom).
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        failed = False
        while not self._stop.wait(self.period):
            if not self.due():
                continue
            try:
                self.scan()
            except Exception as exc:  # noqa: BLE001 - the warden never takes the server down: it says so, once
                if not failed:  # e.g. a sandbox without AF_NETLINK: no budget, loudly
                    _log.error("connections.budget_unavailable", error=str(exc) or type(exc).__name__)
                failed = True
            else:
                failed = False

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
